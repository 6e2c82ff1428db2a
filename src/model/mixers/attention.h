// Transformer++ token mixer (LLaMA-style multi-head attention, no biases):
//   [q|k|v] = x Wqkv^T        Wqkv: [3d, d], rows = q heads, then k heads, then v heads
//   q, k    = RoPE(q), RoPE(k) (rotate-half pairing, base `rope_base`; none with `rope` false,
//             as the MQAR models of the Based paper, which have no positional encoding at all)
//   o       = softmax(q k^T / sqrt(Dh) + causal [+ window] mask) v      per head
//   out    += o Wo^T           Wo: [d, d]
// Saved for backward: qkv after RoPE [B,T,3,H,Dh], o [B,T,H,Dh], lse [B,H,T].
// Documents (mixer.h): keys of other documents masked (block-diagonal causal attention, with the
// kernels skipping tiles wholly outside a query tile's documents), RoPE positions from each
// document's start.
// Decoding: a KV cache of post-RoPE keys and values per sequence, RoPE at the position within the
// row's current document. Full attention keeps every token of it (the cache doubles when full); a
// sliding window keeps a ring buffer of `window` slots, document position p in slot p % window.
// start_document rewinds a row to slot 0. prefill runs forward and writes each row's last
// document's keys and values (the last `window` of them for a window) into the cache. Rows at one
// position decode in one batched call, otherwise row by row.
#pragma once

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

struct AttentionMixerOptions {
  double rope_base = 10000.0;
  bool rope = true;
  int64_t window = 0;  // 0: full causal attention; > 0: sliding window of this many keys (self included)
  // `path` is the options block's JSON path; `sliding` (the sliding_window kind) makes the window
  // default to 64 and requires it to be positive.
  static AttentionMixerOptions parse(const json& o, const std::string& path, const std::string& file, bool sliding);
};

struct AttentionCache;

class AttentionMixer final : public Mixer {
 public:
  AttentionMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const AttentionMixerOptions& opt);
  std::string kind() const override { return opt_.window > 0 ? "sliding_window" : "attention"; }
  bool opens_comm_window() const override { return true; }  // before the core's backward kernels
  bool supports_documents() const override { return true; }
  void start_document(MixerState& state, int64_t row) override;
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  int64_t state_elems(int64_t T) const override;
  double flops_per_token(int64_t T) const override;
  std::unique_ptr<MixerState> init_state(int64_t B) override;
  void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) override;
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;

 private:
  void step_rows(AttentionCache& st, const Tensor& qkv, const Tensor& o, int64_t b0, int64_t n, int64_t p);
  ModelEnv& env_;
  AttentionMixerOptions opt_;
  int64_t d_, H_, Dh_;
  int wqkv_, wo_;
  SavedBuf qkv_buf_, o_buf_, lse_buf_;
  int64_t B_ = 0, T_ = 0;
};

}  // namespace linac
