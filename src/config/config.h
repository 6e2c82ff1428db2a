// The run configuration: model, data and train sections of a JSON file (docs/config.md
// documents every key with its default). Parsing validates everything before any work starts:
// wrong types, out-of-range values and unknown keys (with a did-you-mean) are UserErrors
// naming the file and the JSON path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/mqar_config.h"

namespace linac {

using json = nlohmann::json;

struct ModelConfig {
  std::string arch = "transformer";
  int64_t n_layers = 12;
  int64_t d_model = 768;
  int64_t n_heads = 12;
  int64_t vocab_size = 32000;
  int64_t ffn_hidden = 0;  // 0: 256 * ceil(8d/3 / 256), the LLaMA/GLA rounding
  bool tie_embeddings = false;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  // The shared parts of a block, "" / 0 = the architecture's (model/registry.h resolves them):
  std::string norm;           // rmsnorm | srmsnorm (no gain: TransNormerLLM)
  std::string channel_mixer;  // swiglu | sglu (a GLU without activation: TransNormerLLM) | none (Transformer-VQ)
  double embed_scale = 0;     // embeddings are multiplied by this (TNL: sqrt(d_model))
  double embed_init_std = 0;  // std of the embedding's normal init; 0: init_std
  // The LM head: logits = logit_scale * (FinalNorm(x) W^T + b); no final norm when !final_norm,
  // b only with head_bias (Transformer-VQ's head variants).
  bool final_norm = true;
  bool head_bias = false;
  double logit_scale = 1;
  json mixer = json::object();   // options of the architecture's primary mixer kind
  // Per-layer stacks (model/layer_plan.h): one name per layer, or a pattern repeated over the
  // layers (at most one of the two is non-empty), and named options blocks.
  std::vector<std::string> layers, layer_pattern;
  json mixers = json::object();
  // The file the config came from, for the messages of the checks only a model can make (a
  // mixer's shapes); not part of the config.
  std::string source = "config";

  int64_t ffn_dim() const;
  int64_t head_dim() const { return d_model / n_heads; }
};

struct DataConfig {
  std::string type = "hdf5";  // "hdf5" (a token file written by `linac prepare`) | "mqar" (synthetic)
  std::string path;           // hdf5: token dataset written by `linac prepare`
  int64_t seq_len = 2048;     // mqar: the padded training length (>= every train slice's)
  // "stream": a window is a slice of the token stream, context crosses EOS; "document": each
  // token sees only its own document (data/documents.h)
  std::string packing = "stream";
  MqarConfig mqar;
};

struct TrainConfig {
  int64_t steps = 1000;
  int64_t global_batch_tokens = 524288;
  int64_t micro_batch = 16;  // sequences per micro-batch per rank
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 100;
  std::string schedule = "cosine";  // cosine | linear | constant
  double weight_decay = 0.01;
  bool decay_norms_and_embeddings = false;
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  uint64_t seed = 1234;
  std::string precision = "bf16";  // GPU compute: bf16 (mixed) | fp32. CPU: fp32 | fp64
  std::string device = "auto";     // auto | cpu | cuda
  int64_t eval_every = 500;
  int64_t eval_tokens = 1048576;
  int64_t log_every = 10;
  int64_t checkpoint_every = 1000;
  int64_t keep_last = 3;
  // Checkpoints are written from a host copy on a thread of their own while training goes on
  // (train/checkpoint_writer.h); false: the step loop waits for each write.
  bool checkpoint_async = true;
  std::string out_dir = "runs/run";
  // A checkpoint whose weights a fresh run starts from (fine-tuning): not its optimizer moments,
  // step or data position. "" = a random init. A resumed run ignores it.
  std::string init_from;
  int64_t max_bad_steps = 5;
  // One GPU: each micro-batch's forward and backward replayed from a CUDA graph (train/train_step.h).
  bool cuda_graph = true;
  // A table of cuBLASLt algorithms (`linac bench --tune-gemms`; train/gemm_algo_table.h) the GEMMs
  // run with on the GPU instead of the heuristic's first choice. "" = the heuristic's.
  std::string gemm_algos;
  bool overlap_comm = true;  // data parallel: all-reduce gradient buckets during the backward
  double bucket_mb = 25;     // gradient bucket size for the all-reduce
  // Data parallel: the dtype gradients cross between ranks in, f32 (the master dtype) | bf16 (half
  // the bytes; rounded before and after the sum, accumulated in f32: comm/grad_reducer.h).
  std::string reduce_dtype = "f32";
  // The LM head's logits under bf16 precision on the GPU: f32 (the loss and its gradient from
  // the GEMM's f32 output) | bf16 (rounded once, the softmax still in f32, the gradient written
  // over them: 6 bytes of memory traffic per logit instead of 10) | auto (bf16 under bf16
  // precision, else f32). `linac eval` and decoding keep f32.
  std::string logits_dtype = "auto";
  // The residual stream and its gradient under bf16 precision (GPU): f32 | bf16 | auto (bf16
  // under bf16 precision, else f32). `linac eval` and decoding keep f32.
  std::string residual_dtype = "auto";
  // Saved activations the backward recomputes instead of keeping: none | mixer | block.
  std::string recompute = "none";
  // 1: ZeRO-1, fp32 master weights and AdamW moments sharded over the data-parallel ranks;
  // 2: ZeRO-2, the fp32 gradients too (comm/grad_reducer.h).
  int64_t zero = 0;
  int64_t threads = 0;  // OpenMP threads of the CPU path; 0 = OMP_NUM_THREADS or all cores
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  std::string source;  // file the config came from (for messages)
  // The `--set a.b=value` assignments applied over the file, in order (for messages: blame()).
  std::vector<std::string> overrides;

  json to_json() const;
  static Config from_json(const json& j, const std::string& source);
  // from_json of `doc` with `overrides` applied; its errors worded by blame().
  static Config from_json_with_sets(json doc, const std::string& source, const std::vector<std::string>& overrides);
  // `message` as the user should read it: where it blames `source` for a value a --set gave (the
  // key it is about, or another key it names as "section.key"), it names that --set instead.
  std::string blame(const std::string& message) const;
  // Where the values of the keys `text` names came from, for a message about them: "in cfg.json",
  // "given by --set model.n_layers", "in cfg.json with --set model.d_model".
  std::string given(const std::string& text) const;

 private:
  struct Sources {
    bool file = false;                                  // some came from the file
    std::vector<std::string> sets;                      // the keys of the --set assignments that gave the others
    std::string text(const std::string& source) const;  // "cfg.json with --set a, --set b"
  };
  Sources sources(const std::vector<std::string>& keys, const std::string& at) const;
};

// fn(), its UserErrors worded by cfg.blame(): the checks made after loading (a mixer's shape, the
// run's directory) blame a --set's value on the --set too.
template <class F>
decltype(auto) blaming_sets(const Config& cfg, F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const UserError& e) {
    const std::string worded = cfg.blame(e.what());
    if (worded == e.what()) throw;
    throw UserError(worded);
  }
}

// Reads a config file and applies `--set a.b=value` overrides (value parsed as JSON when it
// parses, else taken as a string) before validation.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies one "a.b.c=value" override to a JSON document; UserError on a malformed override.
void apply_override(json& doc, const std::string& assignment);

}  // namespace linac
