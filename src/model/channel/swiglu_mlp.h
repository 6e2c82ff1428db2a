// GLU channel mixers: SwiGLU (Shazeer 2020), as in LLaMA / Transformer++ / GLA / Based, and
// SGLU, TransNormerLLM's GLU without an activation (act = identity):
//   [g|u] = x W13^T          W13: [2F, d] (rows: gate, then up)
//   a     = act(g) * u       [B, T, F],  act = silu (SwiGLU) or identity (SGLU)
//   out  += a W2^T           W2: [d, F]
// Init: W13 ~ N(0, init_std); W2 ~ N(0, init_std / sqrt(2 n_layers)) for SwiGLU (GPT-2's scaled
// residual init), N(0, init_std) for SGLU (TNL's released code draws every linear alike).
// Saved for backward: h = [g|u] and a.
#pragma once

#include "config/config.h"
#include "model/mixer.h"
#include "swiglu/swiglu.h"

namespace linac {

class SwiGluMlp final : public Mixer {
 public:
  SwiGluMlp(ModelEnv& env, const ModelConfig& cfg, int layer, GluAct act = GluAct::Silu);
  std::string kind() const override { return act_ == GluAct::Silu ? "swiglu" : "sglu"; }
  bool supports_documents() const override { return true; }  // position-wise
  void start_document(MixerState&, int64_t) override {}
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) override;
  // Up to kSkinnyGluMaxRows rows on the GPU (decoding): a is formed inside the output GEMM
  // (matmul_skinny_glu) and never stored.
  void forward_no_grad(const Tensor& x, const Tensor& out) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  double flops_per_token(int64_t T) const override;

 private:
  ModelEnv& env_;
  GluAct act_;
  int64_t d_, F_;
  int w13_, w2_;
  SavedBuf h_buf_, a_buf_;
  int64_t capacity_ = 0;
};

}  // namespace linac
