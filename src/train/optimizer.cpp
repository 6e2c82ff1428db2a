#include "train/optimizer.h"

#include <cmath>

#include "adamw/adamw.h"
#include "reduce/reduce.h"

namespace linac {

void AdamW::update(const Ctx& ctx, double lr, double grad_scale, int64_t step) {
  const int64_t n = params_.flat_numel(), nd = params_.decay_numel();
  const Tensor p = params_.flat_master(), g = params_.flat_grad(), m = params_.flat_m(), v = params_.flat_v();
  const Tensor c = params_.flat_compute();
  AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(tc_.beta1);
  a.beta2 = static_cast<float>(tc_.beta2);
  a.eps = static_cast<float>(tc_.adam_eps);
  a.grad_scale = static_cast<float>(grad_scale);
  a.step = step;
  auto group = [&](int64_t lo, int64_t hi, double wd) {
    if (hi <= lo) return;
    a.weight_decay = static_cast<float>(wd);
    adamw_step(ctx, p.slice0(lo, hi), g.slice0(lo, hi), m.slice0(lo, hi), v.slice0(lo, hi),
               c.defined() ? c.slice0(lo, hi) : Tensor(), a);
  };
  group(0, nd, tc_.weight_decay);
  group(nd, n, tc_.decay_norms_and_embeddings ? tc_.weight_decay : 0.0);
}

double grad_norm(const Ctx& ctx, const ParamStore& params) {
  OwnedTensor out(params.master_dtype(), ctx.device, {1});
  sum_squares(ctx, params.flat_grad(), out);
  return std::sqrt(to_doubles(out)[0]);
}

}  // namespace linac
