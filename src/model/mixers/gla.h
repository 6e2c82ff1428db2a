// GLA token mixer (Yang et al. 2023, arXiv:2312.06635 v3; docs/gla.md §1), with
// d_k = expand_k * d, d_v = expand_v * d, H = model.n_heads, Dk = d_k / H, Dv = d_v / H:
//   [q|k]  = x Wqk^T                    Wqk: [2 d_k, d]  (rows: q heads, then k heads)
//   [v|r]  = x Wvr^T                    Wvr: [2 d_v, d]  (rows: v heads, then the output gate)
//   z      = (x Wa1^T) Wa2^T            Wa1: [R, d], Wa2: [d_k, R]   (low-rank gate, R = gate_rank)
//   g      = max(logsigmoid(z + ba) / gate_temperature, gate_clamp)   f32, ba: [d_k]
//   o      = GLA(q, k, v, g) per head, scale on q.k (kernels/gla)
//   out   += (LN_head(o) * swish(r + br)) Wo^T   Wo: [d, d_v], br: [d_v]; LN without affine
// Init (v3 code): Wvr, Wo ~ N(0, init_std); Wqk, Wa1, Wa2 ~ N(0, std) with the variance of
// xavier_uniform(gain 2^-2.5), std = 2^-2.5 sqrt(2 / (fan_in + fan_out)); biases 0.
// Saved for backward: [q|k|v|r|x Wa1^T] [B*T, 2d_k + 2d_v + R] (act), z [B*T, d_k] (f32 on the
// GPU), o and the gated output [B*T, d_v] (act), the per-head LN statistics (f32), and on the GPU
// the GLA core's chunk buffers (cumsums, decayed q and k, the state before every chunk, the
// intra-chunk P: gla.h's saved intermediates, about 8.7 KB per token at 340M), which spares the
// backward half of its GLA launches and g's recomputation (which the CPU does).
// Documents (mixer.h): g = gla_doc_start_gate at every document start, so the state entering it
// decays below what the dtype resolves (within a chunk as across chunks) with no change to the
// kernels, and dg = 0 there (g is a constant); GLA has no positions. start_document zeroes a
// row's decoding state.
// Decoding: a state of H x Dk x Dv (f32 on the GPU) per sequence; step() runs the recurrent form,
// prefill() the chunked forward, which hands over its final state.
#pragma once

#include <vector>

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

// The log gate at a document start, for gates of dtype `dt`: the smallest magnitude whose decay
// (2e-9 in f32, 4e-18 in f64) is lost in the dtype's rounding of a state entry. Larger ones would
// only cost precision: the chunk kernels take differences of cumulative sums that include it.
inline double gla_doc_start_gate(DType dt) { return dt == DType::F64 ? -40.0 : -20.0; }

struct GlaMixerOptions {
  double expand_k = 0.5;
  double expand_v = 1.0;
  int64_t gate_rank = 16;
  double gate_temperature = 16.0;
  double gate_clamp = -3.0;  // lower bound of the log gate; 0 (or null) disables it
  int64_t chunk = 64;        // chunk length of the chunkwise form (the GPU needs 64)
  double scale = 0.0;        // q.k scale; 0 (or null) means (d / H)^-1/2, the v3 code's constant
  double norm_eps = 1e-5;    // per-head LayerNorm
  bool operator==(const GlaMixerOptions&) const = default;
  static GlaMixerOptions parse(const json& o, const std::string& path, const std::string& file);
};

class GlaMixer final : public Mixer {
 public:
  // `path`: the options block's JSON path, for messages about shapes the options imply.
  GlaMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const GlaMixerOptions& opt, const std::string& path);
  std::string kind() const override { return "gla"; }
  bool opens_comm_window() const override { return true; }  // after the core's reverse state scan
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
  // forward, also writing the final recurrent state into s_final when it is defined.
  void forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add = Tensor());
  // Projections of x [N, d] into proj [N, P].
  void project(const Tensor& x, const Tensor& proj);
  // The forget gate g [N, d_k] from proj's low-rank columns u = x Wa1^T: g = loggate(u Wa2^T, ba),
  // and its backward (dz [N, d_k] written, ba's gradient accumulated). The GPU kernels never
  // store u Wa2^T; shapes they do not take go through a GEMM into scratch and loggate.
  void gate_fwd(const Tensor& proj, const Tensor& g);
  void gate_bwd(const Tensor& proj, const Tensor& dg, const Tensor& dz);
  // The input projection x -> [q|k|v|r|x Wa1^T] as GEMMs over column ranges of proj: one when
  // Wqk, Wvr and Wa1 lie back to back in the parameter store (registered in that order, they do
  // unless alignment padding separates them), else one per matrix. The gradients (with_grads;
  // ZeRO-2 stages them only for the backward) keep the weights' relative layout.
  struct InputGemm {
    Tensor w, grad;  // [n, d]
    int64_t c0;      // proj columns [c0, c0 + n)
    float grad_beta = 1.f;
  };
  std::vector<InputGemm> input_gemms(bool with_grads);  // with_grads: their grad_write (param_store.h)
  Tensor cols(const Tensor& proj, int64_t c0, int64_t n) const { return proj.narrow(1, c0, n); }
  // The GLA core's saved intermediates for a B x T batch; undefined on the CPU or where the
  // reserved space does not hold them (the backward then recomputes them).
  Tensor core_saved(int64_t B, int64_t T) const;
  size_t core_saved_bytes(int64_t B, int64_t T) const;

  ModelEnv& env_;
  GlaMixerOptions opt_;
  int64_t d_, H_, dk_, dv_, R_, P_;
  double scale_;
  int wqk_, wvr_, wa1_, wa2_, ba_, br_, wo_;
  SavedBuf proj_buf_, o_buf_, zo_buf_, mean_buf_, rstd_buf_, core_buf_;
  Buffer ones_buf_;
  int64_t capacity_ = 0;
};

}  // namespace linac
