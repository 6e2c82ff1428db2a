// Latte token mixers (Dolga et al. 2024, "Latte: Latent Attention for Linear Time Transformers";
// docs/latte.md §1), H heads of Dh = d/H channels, L latents in all
// (Lh = L/H per head), one class for both kinds:
//
//   [V|Ql|Kl] = x Wx^T               Wx: [d (+2d), d]; Ql, Kl only with a local window
//   z         = x, or conv_K(x)       depthwise causal convolution of width K (`conv`), no bias
//   [A|Bk]    = z Wab^T              Wab: [H La + L, d]; La = Lh (+1: the local state's logit)
//   Y         = Latte(A, Bk, V [, O_loc])  per head (kernels/latte):
//                 pi_t = softmax(a_t) over La states, mu_{t,l} = sum_{s<=t} softmax_{s<=t}(b_{.,l}) v_s,
//                 y_t = [pi_{t,0} o_loc_t +] sum_l pi_{t,l} mu_{t,l}
//   O_loc     = softmax attention of RoPE(Ql), RoPE(Kl) over V in a window of `window` keys
//               (self included), the Macchiato local state 0; same values as the latent path
//   out      += Y Wo^T               Wo: [d, d]
// VAPOR (docs/latte.md §1.3, `vapor`): values rotated by -s theta before the Latte core and
// outputs by +t theta after it, so y_t = sum_s p(s|t) R^(t-s) v_s; theta are fixed RoPE
// frequencies (base `rope_base`; the paper learns its rotation, linac keeps it fixed by design),
// which makes the rotation our RoPE kernels' backward and forward.
//
// Kinds: `latte` (Latte++: VAPOR, no conv, no window) and `latte_macchiato` (the paper's
// Latte-Conv-SWA++: conv 3, no VAPOR, window 129 = the paper's w = 128 previous tokens + self).
// VAPOR and a window exclude each other (the local path needs the unrotated values).
// Init: matrices N(0, init_std); the conv filter N(0, 1/sqrt(3K)) (as base_conv's).
// Saved for backward: [V|Ql|Kl] (Ql, Kl after RoPE; V after VAPOR's rotation), [A|Bk], Y (act),
// the logcumsumexp of Bk [B,T,H,Lh] (f32 on the GPU), and with a window O_loc (act) and its
// softmax statistics; the conv output is recomputed in the backward.
// Documents (mixer.h; docs/latte.md "Documents"): the Latte core's lse and mu restart at each
// document start (kernels/latte), VAPOR's and the local attention's RoPE positions count from it,
// the local attention sees only its own document's keys and the conv no tap of another document.
// Decoding: per sequence H Lh (Dh + 1) f32 numbers, the last K-1 conv inputs, and a ring buffer
// of `window` keys and values: constant memory whatever the length. Each row decodes at its own
// position (the tokens of its current document), read on the device (env.decode_pos) by the
// position-dependent parts (RoPE, the ring buffer: attention_decode_step), so the step is
// graph-safe (mixer.h). start_document empties a row's state; prefill runs the chunked forward
// once and hands over each row's last document's state (the core's mu_final and last lse row, the
// conv history, the ring buffer).
#pragma once

#include "config/config.h"
#include "core/buffer.h"
#include "latte/latte.h"
#include "model/mixer.h"
#include "short_conv/short_conv.h"

namespace linac {

struct LatteMixerOptions {
  int64_t heads = 0;         // 0: model.n_heads
  int64_t latents = 128;     // L, over all heads
  int64_t conv = 0;          // K: width of the logits' causal convolution (0: none)
  bool vapor = true;         // value rotations for position (plain Latte)
  int64_t window = 0;        // > 0: the Macchiato local attention over this many keys
  double rope_base = 10000;  // VAPOR's and the local attention's RoPE base
  int64_t chunk = 64;        // chunk length of the CPU's chunked form
  bool operator==(const LatteMixerOptions&) const = default;
  // `macchiato`: the latte_macchiato kind's defaults (conv 3, no VAPOR, window 129).
  static LatteMixerOptions parse(const json& o, const std::string& path, const std::string& file, bool macchiato);
};

class LatteMixer final : public Mixer {
 public:
  LatteMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const LatteMixerOptions& opt, bool macchiato,
             const std::string& path);
  std::string kind() const override { return macchiato_ ? "latte_macchiato" : "latte"; }
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
  bool graph_safe_step() const override { return true; }  // positions from env.decode_pos
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;

 private:
  // forward(), and with mu_final ([B, H, Lh, Dh], stat dtype) defined the latent state after each
  // row's last token (prefill).
  void forward_to_state(const Tensor& x, const Tensor& out, const Tensor& mu_final, const Tensor& add = Tensor());
  // The conv's and the core's options: the pass's document bounds (env_.docs).
  ShortConvOpts conv_opts() const;
  static ShortConvOpts step_conv_opts();
  // The core's options for a [B, T] pass; on the GPU with the saved chunk states when they fit.
  LatteOpts core_opts(int64_t B, int64_t T) const;
  // The conv's gate input: ones [d] seen as [B, T, d] (or [B, d] when T == 0) with zero strides.
  Tensor unit_gate(int64_t B, int64_t T) const;

  ModelEnv& env_;
  LatteMixerOptions opt_;
  bool macchiato_;
  int64_t d_, H_, Dh_, Lh_, La_, Px_, Pa_;
  int wx_, wab_, wo_, conv_ = -1;
  SavedBuf xv_buf_, ab_buf_, y_buf_, lse_buf_, oloc_buf_, lse_loc_buf_, z_buf_;
  SavedBuf states_buf_;  // GPU: the core's chunk states and decays, from the forward to the backward
  OwnedTensor ones_;  // [d] ones in the activation dtype (the conv gate)
  int64_t B_ = 0, T_ = 0;
};

}  // namespace linac
