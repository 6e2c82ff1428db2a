// The inputs, loss and gradient check shared by the CPU tests of the linear-attention ops that
// carry a [Dk, Dv] state per head (GLA, lightning attention). q | k | v (| the op's extra
// columns, e.g. GLA's gates) are strided views of one [B, T, W] buffer with a pad column, so no
// view is contiguous, as the model passes them; s0 is the start state. The loss is
// sum(o * u) + sum(S_T * dsf), so every output and the final state carry gradient; the op's
// backward writes the input gradients into `grad`, in `in`'s layout.
#pragma once

#include <functional>

#include "test_util.h"

namespace linac::test {

struct StateScanProblem : QkvLayout {
  int64_t B, T;
  DType dt;
  OwnedTensor in, grad, s0, dsf, u;

  // extra_cols: the columns after v that the op reads from `in` (0 for q | k | v alone).
  StateScanProblem(int64_t b, int64_t t, int64_t h, int64_t dk, int64_t dv, int64_t extra_cols, DType d, uint64_t seed)
      : QkvLayout(h, dk, dv, extra_cols),
        B(b),
        T(t),
        dt(d),
        in(random_tensor({b, t, W}, d, seed)),
        grad(d, Device::CPU, {b, t, W}),
        s0(random_tensor({b, h, dk, dv}, d, seed + 1)),
        dsf(random_tensor({b, h, dk, dv}, d, seed + 2)),
        u(random_tensor({b, t, h, dv}, d, seed + 3)) {}

  struct Out {
    OwnedTensor o, sf;
  };
  // Outputs and the start-state gradient, poisoned so that a value the op leaves unwritten shows.
  Out new_out() const {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, H, Dv}), OwnedTensor(dt, Device::CPU, {B, H, Dk, Dv})};
    poison(r.o);
    poison(r.sf);
    return r;
  }
  OwnedTensor new_ds0() const {
    OwnedTensor ds0(dt, Device::CPU, {B, H, Dk, Dv});
    poison(ds0);
    return ds0;
  }
  double loss_of(const Out& r) const {
    double l = 0;
    const auto o = to_doubles(r.o), uu = to_doubles(u), sf = to_doubles(r.sf), d = to_doubles(dsf);
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * uu[i];
    for (size_t i = 0; i < sf.size(); ++i) l += sf[i] * d[i];
    return l;
  }
  // The gradient of q | k | v and then of each extra view, in that order.
  std::vector<double> grads(std::initializer_list<Tensor> extra = {}) const {
    std::vector<double> all;
    auto add = [&](const Tensor& x) {
      const auto part = view_values(x);
      all.insert(all.end(), part.begin(), part.end());
    };
    for (const Tensor& x : {q(grad), k(grad), v(grad)}) add(x);
    for (const Tensor& x : extra) add(x);
    return all;
  }
  // The backward's gradients (in `grad`, ds0) against central differences of `loss` (double):
  // 160 sampled entries of `in` (the pad column, poisoned by the backward, counts as 0) and 30 of s0.
  void expect_grads_match(const std::function<double()>& loss, const Tensor& ds0) const {
    const int64_t n = in->numel();
    std::vector<double> analytic = to_doubles(grad);
    for (int64_t i = W - 1; i < n; i += W) analytic[static_cast<size_t>(i)] = 0;
    EXPECT_LT(check_grad(loss, in->data<double>(), analytic.data(), static_cast<size_t>(n), 160, 3, 1e-5), 1e-6);
    const auto ds0v = to_doubles(ds0);
    EXPECT_LT(check_grad(loss, s0->data<double>(), ds0v.data(), ds0v.size(), 30, 4, 1e-5), 1e-6);
  }
};

}  // namespace linac::test
