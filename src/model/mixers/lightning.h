// TransNormerLLM's token mixer (Qin et al. 2024, "TransNormerLLM", with Lightning Attention;
// docs/transnormer.md §1.2-§1.4, §4.4), H = heads, E = d_model = H dh:
//   [Qr|Kr|V|U] = x Wqkvu^T          Wqkvu: [4E, d], rows: q, k, v, u (one fused projection, no bias)
//   Q, K        = SiLU(Qr), SiLU(Kr)
//   Q, K        = LRPE(Q), LRPE(K)    dh -> 2 dh, in the layers `lrpe` selects (by default the
//                                     model's first lightning layer, whatever its index):
//                                     [X cos(theta t), X sin(theta t)], theta [H, dh] learned
//   O           = LightningAttention(Q, K, V; lambda_{l,h}) per head: o_t = sum_{s<=t} lambda^(t-s) (q_t.k_s) v_s
//   out        += (SRMSNorm(O) * U) Wo^T                  Wo: [d, E]; SRMSNorm over all E channels
// Decay (not learned): s_{l,h} = slope_h (1 - l/(L-1) + 1e-5), slope_h = 2^(-8(h+1)/H) (ALiBi slopes
// for H not a power of two), lambda = exp(-s): the released code's schedule (`decay: "code"`); the
// paper's eq. 10, s = 8(h+1)/H (1 - l/L), with `decay: "paper"` (docs/transnormer.md §1.4).
// Init (released code): Wqkvu, Wo ~ N(0, init_std); theta[h, j] = 10000^(-2 (h dh + j) / E).
// Saved for backward: [Qr|Kr|V|U] [B*T, 4E] (act, one product with Wqkvu), [Q|K] after SiLU
// [B*T, 2E], O [B*T, E], the gated norm's output [B*T, E] (act) and its rstd [B*T] (f32 on the GPU):
// 8E values per token, which spares the backward a SiLU and a gated-norm pass; LRPE is recomputed.
// Documents (mixer.h; docs/transnormer.md §4.5): the lightning kernels restart the state at every
// document start (also inside a block), LRPE positions restart at 0 there; SRMSNorm, the gate and
// the channel mixer are per token. start_document zeroes a row's state.
// Decoding: per sequence H x Dk x dh f32 state (Dk = 2 dh with LRPE), whatever the length; LRPE
// reads each row's position within its current document from env.decode_pos on the device, so
// every step is graph-safe (mixer.h).
#pragma once

#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/doc_bounds.h"
#include "model/mixer.h"

namespace linac {

struct LightningMixerOptions {
  int64_t heads = 0;           // 0: model.n_heads
  std::string lrpe = "first";  // first | all | none: which layers use LRPE-d
  std::string decay = "code";  // code | paper: the decay schedule (see above)
  double norm_eps = 1e-6;      // SRMSNorm over the heads' output
  int64_t block = 64;          // block length of the CPU's block form
  bool operator==(const LightningMixerOptions&) const = default;
  static LightningMixerOptions parse(const json& o, const std::string& path, const std::string& file);
};

// s_{l,h} for every head of layer l of an n_layers model (the rates, lambda = exp(-s)).
std::vector<double> lightning_decay_rates(const std::string& schedule, int64_t heads, int64_t layer, int64_t n_layers);

class LightningMixer final : public Mixer {
 public:
  // first_of_kind: no earlier layer of the stack is a lightning layer (where `lrpe: "first"`
  // applies, also in a hybrid stack whose layer 0 is another mixer).
  LightningMixer(ModelEnv& env, const ModelConfig& cfg, int layer, bool first_of_kind, const LightningMixerOptions& opt,
                 const std::string& path);
  std::string kind() const override { return "lightning"; }
  bool opens_comm_window() const override { return true; }  // before the core's backward kernels
  bool supports_documents() const override { return true; }
  bool graph_safe_step() const override { return true; }  // LRPE's positions from env.decode_pos
  void start_document(MixerState& state, int64_t row) override;
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  int64_t state_elems(int64_t T) const override;
  double flops_per_token(int64_t T) const override;
  std::unique_ptr<MixerState> init_state(int64_t B) override;
  void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) override;
  // The block forward hands over its final state (of each row's last document); LRPE positions
  // of the prompt start at 0 (at each document).
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;

 private:
  // forward, also writing the final recurrent state into s_final when it is defined.
  void forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add = Tensor());
  // Q, K after SiLU into qa [N, 2E] (and LRPE into qk [N, 2 Dk H]) from the [N, >= 2E]
  // projection. LRPE's positions: from 0, or from each of env_.docs's documents; with `positions`
  // ([B] int32 on the device, decoding) row b from positions[b].
  void queries_keys(const Tensor& proj, int64_t B, int64_t T, const Tensor& qa, const Tensor& qk,
                    const Tensor& positions = Tensor());
  // Its LRPE half: qk from qa (nothing without LRPE).
  void rotate(int64_t B, int64_t T, const Tensor& qa, const Tensor& qk, const Tensor& positions = Tensor());
  // The lightning forward's block states, kept for the backward on the GPU (lightning.h's
  // `saved`; the CPU recomputes them): its bytes, and the buffer as lightning_fwd/bwd take it
  // (undefined on the CPU or beyond the reserved batch).
  size_t core_saved_bytes(int64_t B, int64_t T) const;
  Tensor core_saved(int64_t B, int64_t T) const;

  ModelEnv& env_;
  LightningMixerOptions opt_;
  int64_t d_, H_, dh_, E_, Dk_;
  bool lrpe_;
  int wqkvu_, wo_, theta_ = -1;
  OwnedTensor decay_;                     // [H] rates s_h (stat dtype, on the model's device)
  SavedBuf proj_buf_, o_buf_, rstd_buf_;  // proj: [Qr | Kr | V | U], one product with Wqkvu
  SavedBuf qa_buf_, g_buf_;               // [SiLU(Qr) | SiLU(Kr)] and the gated norm's output
  SavedBuf states_buf_;                   // core_saved
  int64_t capacity_ = 0;
};

}  // namespace linac
