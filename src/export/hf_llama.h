// The Hugging Face `LlamaForCausalLM` view of a Transformer++ model (transformers loads it with
// no code of ours). Tensor names and the splits of our fused projections:
//   embed.weight               -> model.embed_tokens.weight
//   layers.L.norm1.weight      -> model.layers.L.input_layernorm.weight
//   layers.L.attn.wqkv [d + 2K, d] -> rows [0, d) self_attn.q_proj, [d, d + K) k_proj,
//                              [d + K, d + 2K) v_proj; K = kv_heads * head_dim (K = d without GQA)
//   layers.L.attn.wo           -> model.layers.L.self_attn.o_proj.weight
//   layers.L.norm2.weight      -> model.layers.L.post_attention_layernorm.weight
//   layers.L.mlp.w13 [2F, d]   -> rows [0, F) mlp.gate_proj, [F, 2F) mlp.up_proj
//   layers.L.mlp.w2            -> model.layers.L.mlp.down_proj.weight
//   norm_f.weight              -> model.norm.weight
//   head.weight                -> lm_head.weight (absent when tied: tie_word_embeddings)
// Our RoPE already pairs element i with i + D/2 (rotate-half, kernels/rope) with
// inv_freq_i = base^(-2i/D), as Llama does, so q/k rows need no permutation; RMSNorm is Llama's
// (x * rsqrt(mean x^2 + eps) * w). num_key_value_heads is model.mixer.kv_heads, rope_theta its
// rope_base and rope_scaling {"rope_type": "llama3", ...} its rope_scaling. The same views serve
// the import (export/hf_llama_import.h), which fills them instead of reading them.
#pragma once

#include <vector>

#include "config/config.h"
#include "export/safetensors.h"
#include "model/model.h"

namespace linac {

// UserError naming what differs unless cfg is a Transformer++ with full causal attention in
// every layer (all with the same kv_heads and RoPE), RMSNorm, SwiGLU and no embedding scale.
void check_hf_llama_exportable(const ModelConfig& cfg, const std::string& file);
// config.json's object; bos/eos ids < 0 are left out.
json hf_llama_config(const Config& cfg, int32_t bos_id, int32_t eos_id);
// Views into the model's (CPU) master parameters, named as above (contiguous row ranges).
std::vector<SafetensorsTensor> hf_llama_tensors(const Model& model);

}  // namespace linac
