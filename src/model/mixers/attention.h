// Transformer++ token mixer (LLaMA-style attention, no biases), with H query heads and Hk
// key/value heads (`kv_heads`, default H; Hk < H is grouped-query attention, Hk = 1 multi-query):
//   [q|k|v] = x Wqkv^T        Wqkv: [(H + 2 Hk) Dh, d], rows = H q heads, Hk k heads, Hk v heads
//   q, k    = RoPE(q), RoPE(k) (rotate-half pairing, base `rope_base`, Llama 3 `rope_scaling`;
//             none with `rope` false, as the MQAR models of the Based paper, which have no
//             positional encoding at all)
//   o       = softmax(q k^T / sqrt(Dh) + causal [+ window] mask) v      per query head, with the
//             keys and values of its group's head (kernels/attention/attention.h)
//   out    += o Wo^T           Wo: [d, H Dh]
// Saved for backward: qkv after RoPE [B,T,H+2Hk,Dh], o [B,T,H,Dh], lse [B,H,T].
// Documents (mixer.h): keys of other documents masked (block-diagonal causal attention, with the
// kernels skipping tiles wholly outside a query tile's documents), RoPE positions from each
// document's start.
// Decoding: a KV cache of post-RoPE keys and values per sequence (Hk heads), RoPE at the position within the
// row's current document. Full attention keeps every token of it (the cache doubles when full); a
// sliding window keeps a ring buffer of `window` slots, document position p in slot p % window.
// start_document rewinds a row to slot 0. prefill runs forward and writes each row's last
// document's keys and values (the last `window` of them for a window) into the cache. A step
// decodes every row at its own position in one attention_decode_step, which reads the positions
// on the device (graph-safe, mixer.h); reserve_state sizes a full cache up front.
#pragma once

#include "config/config.h"
#include "model/mixer.h"
#include "rope/rope.h"

namespace linac {

struct AttentionMixerOptions {
  // The ranges rope_scaling's numbers take (an import checks a Hugging Face config against them).
  static constexpr double kScalingFactorMin = 1, kFreqFactorMin = 1e-6, kScalingMax = 1e6;
  RopeFreqs rope_freqs{10000.0};  // rope_base and rope_scaling
  bool rope = true;
  int64_t window = 0;  // 0: full causal attention; > 0: sliding window of this many keys (self included)
  int64_t kv_heads = 0;  // key/value heads; 0: n_heads
  int64_t key_value_heads(int64_t n_heads) const { return kv_heads > 0 ? kv_heads : n_heads; }
  bool operator==(const AttentionMixerOptions&) const = default;
  // `path` is the options block's JSON path; `sliding` (the sliding_window kind) makes the window
  // default to 64 and requires it to be positive; kv_heads must divide n_heads.
  static AttentionMixerOptions parse(const json& o, const std::string& path, const std::string& file, bool sliding,
                                     int64_t n_heads);
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
  void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  int64_t state_elems(int64_t T) const override;
  double flops_per_token(int64_t T) const override;
  std::unique_ptr<MixerState> init_state(int64_t B) override;
  void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) override;
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;
  bool graph_safe_step() const override { return true; }
  bool step_grows(const MixerState& state) const override;
  void reserve_state(MixerState& state, int64_t tokens) override;
  void advance(MixerState& state) override;

 private:
  ModelEnv& env_;
  AttentionMixerOptions opt_;
  int64_t d_, H_, Hk_, Dh_;
  int64_t q_cols_, kv_cols_;  // H Dh and Hk Dh: the column blocks of the qkv projection
  int wqkv_, wo_;
  SavedBuf qkv_buf_, o_buf_, lse_buf_;
  int64_t B_ = 0, T_ = 0;
};

}  // namespace linac
