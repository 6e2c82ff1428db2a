// Based's global linear attention layer (Arora et al. 2024, arXiv:2402.18668;
// docs/based.md §2), with H heads (`heads`, default model.n_heads), feature dim F
// (`feature_dim`, d' = 16) and value dim Dv (`head_dim`, default d / H):
//   [q|k|v] = x Wqkv^T            Wqkv: [H (2F + Dv), d]  rows: q heads, k heads, v heads; no bias
//   o       = TaylorAttn(q, k, v) per head (kernels/taylor_attn): causal linear attention with
//             phi(q).phi(k) = 1 + u + u^2/2, u = q.k / sqrt(F), normalised by sum_s phi(q_t).phi(k_s)
//   out    += o Wo^T              Wo: [d, H Dv]
// No positional encoding, gate or norm inside the layer (docs/based.md §2.1).
// Init (docs/based.md §1.3): Wqkv ~ N(0, init_std), Wo ~ N(0, init_std / sqrt(2 n_layers)).
// Saved for backward: the projection [B*T, H (2F + Dv)] (act), o [B*T, H Dv] (act), the
// denominators [B, H, T] (f32 on the GPU).
// Documents (mixer.h): the kernels restart the state (and the normaliser's sums) at every document
// start (taylor_attn.h); no positions. start_document zeroes a row's decoding state.
// Decoding: a state of H x rows(F) x (Dv + 1) per sequence (f32 on the GPU; 273 x 65 per head at
// F = 16, Dv = 64), whatever the length. prefill() runs the chunked forward, which hands over its
// final state (each row's last document's).
#pragma once

#include "config/config.h"
#include "model/mixer.h"
#include "taylor_attn/taylor_attn.h"

namespace linac {

struct TaylorMixerOptions {
  int64_t heads = 0;         // 0: model.n_heads
  int64_t feature_dim = 16;  // F (d'): q/k projection width per head
  int64_t head_dim = 0;      // Dv; 0: d_model / heads
  int64_t chunk = 64;        // chunk length of the chunked form (CPU; the GPU kernels pick their own)
  double eps = 1e-12;        // added to the denominator
  bool operator==(const TaylorMixerOptions&) const = default;
  static TaylorMixerOptions parse(const json& o, const std::string& path, const std::string& file);
};

class TaylorMixer final : public Mixer {
 public:
  TaylorMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const TaylorMixerOptions& opt, const std::string& path);
  std::string kind() const override { return "taylor"; }
  bool opens_comm_window() const override { return true; }  // before the core's backward kernels
  bool supports_documents() const override { return true; }
  bool graph_safe_step() const override { return true; }  // no host-side position
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

 private:
  // forward, also writing the final state to s_final when it is defined (prefill).
  void forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add = Tensor());
  TaylorAttnOpts attn_opts(int64_t B, int64_t T) const;
  ModelEnv& env_;
  TaylorMixerOptions opt_;
  int64_t d_, H_, F_, Dv_, P_;
  int wqkv_, wo_;
  SavedBuf proj_buf_, o_buf_, den_buf_, carries_buf_;
  int64_t B_ = 0, T_ = 0;
};

}  // namespace linac
