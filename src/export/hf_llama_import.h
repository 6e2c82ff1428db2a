// Reading a Hugging Face LlamaForCausalLM folder (config.json, model.safetensors or a sharded
// model.safetensors.index.json, F32/F16/BF16 weights, an optional SentencePiece tokenizer.model)
// as a linac Transformer++ model: the inverse of export/hf_llama.h, through the same tensor
// views. config.json maps to (docs/import.md has the full table):
//   hidden_size -> model.d_model, num_hidden_layers -> n_layers, num_attention_heads -> n_heads,
//   num_key_value_heads -> mixer.kv_heads (left out when equal), intermediate_size -> ffn_hidden,
//   vocab_size, tie_word_embeddings (default false), rms_norm_eps -> norm_eps,
//   initializer_range -> init_std, rope_theta -> mixer.rope_base (default 10000),
//   rope_scaling {rope_type llama3, ...} -> mixer.rope_scaling (transformers 5's
//   rope_parameters, which holds rope_theta too, alike),
//   max_position_embeddings -> data.seq_len, capped at kHfImportMaxSeqLen.
// Everything linac cannot compute exactly as transformers does is refused with a UserError naming
// the file and the field or tensor: another model_type or architecture, biases, an activation
// other than silu, a head_dim other than hidden_size / num_attention_heads, RoPE scaling other
// than llama3, missing, extra or misshapen tensors, a weight holding inf or NaN, lm_head differing
// from the embedding when tied.
#pragma once

#include <memory>
#include <string>

#include "config/config.h"
#include "export/safetensors.h"
#include "model/model.h"

namespace linac {

// data.seq_len of an import: a training length, not a limit of the model (attention has no
// positional table); Llama's max_position_embeddings (8192 to 131072) would make the default
// micro-batch far larger than a training run wants.
constexpr int64_t kHfImportMaxSeqLen = 4096;

// The linac config of a config.json object (`file` names it in messages).
Config hf_llama_import_config(const json& hf, const std::string& file);

// Sets every parameter of `model` (a CPU fp32 model of hf_llama_import_config's config) from the
// folder's tensors, bit for bit in f32.
void hf_llama_import_tensors(const SafetensorsSet& tensors, Model& model, const std::string& dir);

struct HfLlamaImport {
  Config cfg;
  std::unique_ptr<Model> model;    // on the CPU, fp32
  std::string tokenizer;           // DIR/tokenizer.model's bytes (verified to load), or empty
  bool hf_tokenizer_only = false;  // DIR has tokenizer.json but no tokenizer.model
};

// config.json, the tensors and the tokenizer of `dir`.
HfLlamaImport import_hf_llama(const std::string& dir);

}  // namespace linac
