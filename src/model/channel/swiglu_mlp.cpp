#include "model/channel/swiglu_mlp.h"

#include <cmath>

#include "matmul/matmul.h"
#include "swiglu/swiglu_linear.h"

namespace linac {

SwiGluMlp::SwiGluMlp(ModelEnv& env, const ModelConfig& cfg, int layer, GluAct act)
    : env_(env), act_(act), d_(cfg.d_model), F_(cfg.ffn_dim()) {
  const std::string p = "layers." + std::to_string(layer) + ".mlp.";
  const double out_std =
      act == GluAct::Silu ? cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)) : cfg.init_std;
  w13_ = env.params->add({p + "w13", {2 * F_, d_}, Init::Normal, cfg.init_std, true});
  w2_ = env.params->add({p + "w2", {d_, F_}, Init::Normal, out_std, true});
}

void SwiGluMlp::reserve(int64_t B, int64_t T) {
  capacity_ = B * T;
  h_buf_ = env_.saved->take(static_cast<size_t>(capacity_ * 2 * F_) * dtype_size(env_.act));
  a_buf_ = env_.saved->take(static_cast<size_t>(capacity_ * F_) * dtype_size(env_.act));
}

size_t SwiGluMlp::activation_bytes(int64_t B, int64_t T) const {
  return static_cast<size_t>(B * T * 3 * F_) * dtype_size(env_.act);
}

double SwiGluMlp::flops_per_token(int64_t) const { return 6.0 * 3.0 * static_cast<double>(d_ * F_); }

void SwiGluMlp::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  const int64_t N = x.size(0) * x.size(1);
  LINAC_CHECK(N <= capacity_, "SwiGluMlp: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  Tensor h = h_buf_.tensor(env_.act, {N, 2 * F_});
  Tensor a = a_buf_.tensor(env_.act, {N, F_});
  swiglu_linear_fwd(ctx, x.view({N, d_}), env_.params->weight(w13_), h, a, act_);
  matmul_add(ctx, a, false, env_.params->weight(w2_), true, addend_rows(add, N, d_), out.view({N, d_}));
}

void SwiGluMlp::forward_no_grad(const Tensor& x, const Tensor& out) {
#if LINAC_WITH_CUDA
  const int64_t N = x.size(0) * x.size(1);
  LINAC_CHECK(N <= capacity_, "SwiGluMlp: batch larger than reserved");
  Tensor h = h_buf_.tensor(env_.act, {N, 2 * F_});
  const Tensor w2 = env_.params->weight(w2_), out2 = out.view({N, d_});
  if (env_.ctx.is_gpu() && N <= kSkinnyGluMaxRows && matmul_skinny_glu_applies(h, w2, out2)) {
    matmul(env_.ctx, x.view({N, d_}), false, env_.params->weight(w13_), true, h);
    matmul_skinny_glu(env_.ctx, h, w2, out2, act_);
    return;
  }
#endif
  forward(x, out);
}

void SwiGluMlp::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t N = x.size(0) * x.size(1);
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  Tensor h = h_buf_.tensor(env_.act, {N, 2 * F_});
  Tensor a = a_buf_.tensor(env_.act, {N, F_});
  Tensor dy2 = dy.view({N, d_});
  Tensor dh = env_.scratch->get("mlp.dh", env_.act, {N, 2 * F_});
  const Tensor da = swiglu_linear_bwd_writes_da(ctx, dy2, ps.weight(w2_), h, dh)
                        ? env_.scratch->get("mlp.da", env_.act, {N, F_})
                        : Tensor();
  swiglu_linear_bwd(ctx, dy2, ps.weight(w2_), h, da, dh, act_);
  const ParamStore::GradWrite dw2 = ps.grad_write(w2_), dw13 = ps.grad_write(w13_);
  matmul(ctx, dy2, true, a, false, dw2.grad, 1.f, dw2.beta);
  matmul(ctx, dh, false, ps.weight(w13_), false, dx.view({N, d_}));
  matmul(ctx, dh, true, x.view({N, d_}), false, dw13.grad, 1.f, dw13.beta);
}

}  // namespace linac
