#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "adamw/adamw.h"
#include "reduce/reduce.h"

namespace linac {

void AdamW::update(const Ctx& ctx, double lr, double grad_scale, int64_t step) {
  AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(tc_.beta1);
  a.beta2 = static_cast<float>(tc_.beta2);
  a.eps = static_cast<float>(tc_.adam_eps);
  a.grad_scale = static_cast<float>(grad_scale);
  a.step = step;
  const double other_decay = tc_.decay_norms_and_embeddings ? tc_.weight_decay : 0.0;
  for (const OwnedRange& r : params_.owned()) {
    // [lo, hi) of r, relative to r.lo, with weight decay wd.
    auto run = [&](int64_t lo, int64_t hi, double wd) {
      if (hi <= lo) return;
      a.weight_decay = static_cast<float>(wd);
      adamw_step(ctx, r.master.slice0(lo, hi), r.grad.slice0(lo, hi), r.m.slice0(lo, hi), r.v.slice0(lo, hi),
                 r.compute.defined() ? r.compute.slice0(lo, hi) : Tensor(), a);
    };
    int64_t at = r.lo;  // the ranges between decayed ones do not decay
    for (const auto& [dlo, dhi] : params_.decay_ranges()) {
      const int64_t lo = std::max(dlo, r.lo), hi = std::min(dhi, r.hi);
      if (lo >= hi) continue;
      run(at - r.lo, lo - r.lo, other_decay);
      run(lo - r.lo, hi - r.lo, tc_.weight_decay);
      at = hi;
    }
    run(at - r.lo, r.hi - r.lo, other_decay);
  }
}

double grad_norm(const Ctx& ctx, const ParamStore& params, const Comm* comm) {
  OwnedTensor out(params.master_dtype(), ctx.device, {1});
  if (!params.sharded()) {
    sum_squares(ctx, params.flat_grad(), out);
    return std::sqrt(to_doubles(ctx, out)[0]);
  }
  double local = 0;
  for (const OwnedRange& r : params.owned()) {
    if (r.lo < params.replicated_numel() && params.shard_rank() != 0) continue;
    sum_squares(ctx, r.grad, out);
    local += to_doubles(ctx, out)[0];
  }
  return std::sqrt(comm ? comm->sum(local) : local);
}

}  // namespace linac
