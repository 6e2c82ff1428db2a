// SwiGLU channel mixer (Shazeer 2020), as in LLaMA / Transformer++ / GLA:
//   [g|u] = x W13^T          W13: [2F, d] (rows: gate, then up)
//   a     = silu(g) * u      [B, T, F]
//   out  += a W2^T           W2: [d, F]
// Saved for backward: h = [g|u] and a.
#pragma once

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

class SwiGluMlp final : public Mixer {
 public:
  SwiGluMlp(ModelEnv& env, const ModelConfig& cfg, int layer);
  std::string kind() const override { return "swiglu"; }
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  double flops_per_token(int64_t T) const override;

 private:
  ModelEnv& env_;
  int64_t d_, F_;
  int w13_, w2_;
  Buffer h_buf_, a_buf_;
  int64_t capacity_ = 0;
};

}  // namespace linac
