// Transformer-VQ's gated attention unit with VQ-attention (Lingle 2023;
// docs/transformer_vq.md §1, §3, §4.5), H heads (the paper's single-head
// SHGA: H = 1) of key width Dk and value width Dvh = dv / H, codebooks of S codes, blocks of Lb:
//
//   [Qr|Kr|V'|G'] = x Wqkvg^T        Wqkvg: [2 H Dk + 2 dv, d], rows q, k (head-major), v, g
//   q, k = tau^(-1/2) RMSNorm0(Qr), tau^(-1/2) RMSNorm0(Kr)     per head, no gain, tau = sqrt(Dk)
//   v, g = SiLU(V'), SiLU(G')
//   khat = the nearest codeword of k (straight-through: dk = dkhat)
//   o    = VQAttention(q, khat, v; u, vr, rho) per head (kernels/vq_attn: the present and previous
//          block uncompressed with Transformer-XL position terms, older blocks through the
//          compressive cache of per-code value means)
//   out += (o * g) Wo^T               Wo: [d, dv]
// rho_d = e_d Wr_h^T (d = 0..Lb) with the fixed sinusoids e_d[i] = sin(d w_i), e_d[d/2+i] =
// cos(d w_i), w_i = 1e5^(-2i/d); Wr: [H Dk, d]; u, vr [H, Dk] (zero init). The paper's tau^(-1/2)
// factors of u, vr and rho are absorbed into these parameters.
// Codebook (not a gradient): buffers c_sum [H, S, Dk] (init N(0, 1/(S H))) and c_count [H, S]
// (init 1); codebook = c_sum / max(c_count, 0.01). Every backward adds the per-code sums and
// counts of its unquantized keys; update_buffers sums them over ranks and applies the EMA
// c <- gamma c + (1 - gamma) stats once per optimizer step.
// Commitment loss: beta sum_t ||k_t - C_{z_t}||^2 (aux_loss_sum), gradient 2 beta (k - khat).
// Init (PaLM-style, docs/transformer_vq.md §1.5): Wqkvg, Wr ~ N(0, 1/d), Wo ~ N(0, 1/dv).
// Out of scope by design: the paper's regularisers (sinusoid dropout, residual dropout,
// LayerDrop), because linac has no dropout in any architecture (runs stay deterministic and
// resume bit for bit); and truncated-backprop windows with a state carried between windows (the
// cache starts empty in every sequence; docs/transformer_vq.md).
// Saved for backward: [Qr|Kr|V'] raw projections (act), [G'|o] (act), q and k normalised and
// scaled, khat (act), v and the gated o * g (act: the backward reads them instead of recomputing
// SiLU and the gate), z (int32), the norms' rstd and lse (f32 on the GPU); rho per layer.
// Decoding: per sequence a ring of Lb quantized keys and values plus S per-code counts and value
// means per head: constant memory whatever the length. Each row's position within its document
// (the ring's slot) is read on the device (env.decode_pos), so the step is graph-safe (mixer.h).
// Documents (docs/transformer_vq.md §3.4): the attention runs each document as a sequence of its
// own (blocks counted from its first token, the cache empty there); the codebook statistics count
// every key as before. start_document empties a row's cache and ring (and the model sets the
// row's position back to 0); prefill runs the prompt through the block forward
// and hands each row's last document to the state in one call (vq_attn_state_prefill).
#pragma once

#include "config/config.h"
#include "core/buffer.h"
#include "model/mixer.h"
#include "vq_attn/vq_attn.h"

namespace linac {

struct VqGauMixerOptions {
  int64_t heads = 1;        // H (the paper: 1)
  int64_t dk = 128;         // key width per head
  int64_t dv = 0;           // value width over all heads; 0: 2 d_model (the paper)
  int64_t codebook = 512;   // S
  int64_t block = 512;      // Lb
  double beta = 1e-4;       // commitment loss weight
  double gamma = 0.99;      // codebook EMA rate
  bool operator==(const VqGauMixerOptions&) const = default;
  static VqGauMixerOptions parse(const json& o, const std::string& path, const std::string& file);
};

class VqGauMixer final : public Mixer {
 public:
  VqGauMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const VqGauMixerOptions& opt, const std::string& path);
  std::string kind() const override { return "vq_gau"; }
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  int64_t state_elems(int64_t T) const override;
  double flops_per_token(int64_t T) const override;
  double aux_loss_sum() const override;
  void update_buffers(const std::function<void(const Tensor&)>& sum_ranks) override;
  std::unique_ptr<MixerState> init_state(int64_t B) override;
  void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) override;
  bool graph_safe_step() const override { return true; }  // positions from env.decode_pos
  bool supports_documents() const override { return true; }
  // With documents the op reads their bounds on the host (kernels/vq_attn/vq_attn.h).
  bool graph_safe_training(bool documents) const override { return !documents; }
  void start_document(MixerState& state, int64_t row) override;
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;

 private:
  // codebook = c_sum / max(c_count, 0.01), into scratch; rho [H, Lb+1, Dk] from Wr, into rho_.
  Tensor codebook();
  Tensor rho();
  // env_.ctx with the VQ-attention kernels' scratch as its workspace (GPU).
  Ctx attn_ctx(int64_t B, int64_t T) const;
  // The op's options for a [B, T] pass on attn_ctx's workspace: on the GPU with the forward's cache
  // and weights saved for the backward (with documents where reserve() sized them for documents:
  // ModelOptions::documents), and the documents' placement shared by every layer of the pass
  // (ModelEnv::docs_derived).
  VqAttnOpts attn_opts(int64_t B, int64_t T, const Ctx& attn) const;
  // Normalised, scaled q and k [N, H Dk] of the raw projections proj [N, >= 2 H Dk].
  void queries_keys(const Tensor& proj, const Tensor& q, const Tensor& k, const Tensor& rstd);

  ModelEnv& env_;
  VqGauMixerOptions opt_;
  int64_t d_, H_, Dk_, Dv_, Dvh_, S_, Lb_, Pqkv_;
  double qk_scale_;  // Dk^-1/4, folded into the q and k norms (srmsnorm_scaled_*)
  int wqkvg_, wr_, u_, vr_, wo_, c_sum_, c_count_;
  OwnedTensor sinusoids_;             // [Lb+1, d] f32 (master dtype on the CPU)
  OwnedTensor acc_sums_, acc_counts_;  // this step's codebook statistics, [H, S, Dk] and [H, S]
  SavedBuf proj_buf_, go_buf_, q_buf_, k_buf_, khat_buf_, v_buf_, gated_buf_, z_buf_, rstd_buf_, lse_buf_, err_buf_;
  SavedBuf cache_buf_;    // GPU: VqAttnOpts::saved_cache
  SavedBuf weights_buf_;  // GPU: VqAttnOpts::saved_weights
  int64_t capacity_ = 0;
  // The last forward's sum of ||k - khat||^2 on the device, read only when aux_loss_sum asks: a
  // read-back per layer would stall the stream in every forward.
  OwnedTensor err_sum_;
  // rho of the last forward (or decode step): the backward reads it rather than repeat the GEMM.
  OwnedTensor rho_;
};

}  // namespace linac
