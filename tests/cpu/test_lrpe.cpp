// LRPE-d CPU reference: forward against the formula, backward (dx, accumulated dtheta) against
// central differences on q/k slices of a fused buffer, near the start and at far positions.
#include <cmath>

#include "lrpe/lrpe.h"
#include "test_util.h"

namespace linac {
namespace {

// x is the k slice of a fused [B, T, 2, H, D] buffer (free batch and token strides);
// loss = sum(y * u) for a fixed random u.
struct LrpeProblem {
  int64_t b, t, h, d, pos0;
  OwnedTensor xb, theta, u;
  LrpeProblem(int64_t b_, int64_t t_, int64_t h_, int64_t d_, int64_t pos0_)
      : b(b_), t(t_), h(h_), d(d_), pos0(pos0_), xb(test::random_tensor({b_, t_, 2, h_, d_}, DType::F64, 1, -2, 2)),
        theta(test::random_tensor({h_, d_}, DType::F64, 2, 0.01, 1.0)),
        u(test::random_tensor({b_, t_, h_, 2 * d_}, DType::F64, 3)) {}
  Tensor x() const { return xb.t.select(2, 1); }
  double loss() const {
    OwnedTensor y(DType::F64, Device::CPU, {b, t, h, 2 * d});
    lrpe_fwd(Ctx{}, x(), theta, y, pos0);
    double l = 0;
    for (int64_t i = 0; i < y->numel(); ++i) l += y->data<double>()[i] * u->data<double>()[i];
    return l;
  }
};

TEST(LrpeCpu, ForwardMatchesFormula) {
  LrpeProblem p(2, 3, 2, 5, 7);
  OwnedTensor y(DType::F64, Device::CPU, {2, 3, 2, 10});
  lrpe_fwd(Ctx{}, p.x(), p.theta, y, p.pos0);
  const double* xb = p.xb->data<double>();
  const double* th = p.theta->data<double>();
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t ti = 0; ti < 3; ++ti)
      for (int64_t hi = 0; hi < 2; ++hi)
        for (int64_t j = 0; j < 5; ++j) {
          const double x = xb[(((bi * 3 + ti) * 2 + 1) * 2 + hi) * 5 + j];
          const double a = th[hi * 5 + j] * static_cast<double>(p.pos0 + ti);
          const double* yr = y->data<double>() + ((bi * 3 + ti) * 2 + hi) * 10;
          EXPECT_NEAR(yr[j], x * std::cos(a), 1e-14);
          EXPECT_NEAR(yr[5 + j], x * std::sin(a), 1e-14);
        }
}

void grad_check(int64_t b, int64_t t, int64_t h, int64_t d, int64_t pos0, double tol) {
  LrpeProblem p(b, t, h, d, pos0);
  OwnedTensor dxb(DType::F64, Device::CPU, {b, t, 2, h, d});
  test::poison(dxb);
  // dtheta starts non-zero to check that the backward accumulates.
  OwnedTensor dtheta = test::random_tensor({h, d}, DType::F64, 9);
  const std::vector<double> dtheta0 = to_doubles(dtheta);
  lrpe_bwd(Ctx{}, p.x(), p.theta, p.u, dxb.t.select(2, 1), dtheta, pos0);
  // Analytic gradient over the fused buffer: zero on the q slice, which dx must not touch.
  std::vector<double> gx = to_doubles(dxb);
  for (size_t i = 0; i < gx.size(); ++i)
    if ((i / static_cast<size_t>(h * d)) % 2 == 0) {
      EXPECT_TRUE(std::isnan(gx[i])) << "dx written outside its slice at " << i;
      gx[i] = 0;
    }
  std::vector<double> gth = to_doubles(dtheta);
  for (size_t i = 0; i < gth.size(); ++i) gth[i] -= dtheta0[i];
  auto loss = [&] { return p.loss(); };
  EXPECT_LT(test::check_grad(loss, p.xb->data<double>(), gx.data(), gx.size(), 128), tol) << "pos0 " << pos0;
  EXPECT_LT(test::check_grad(loss, p.theta->data<double>(), gth.data(), gth.size(), 128), tol) << "pos0 " << pos0;
}

TEST(LrpeCpu, GradCheckDouble) {
  grad_check(2, 5, 3, 7, 0, 1e-6);
  grad_check(1, 13, 2, 4, 3, 1e-6);
}

TEST(LrpeCpu, GradCheckDoubleFarPositions) {
  // Angles around theta * 5000: the central difference in theta is off by ~(p h)^2 / 6 relative.
  grad_check(2, 4, 2, 5, 5000, 1e-5);
  grad_check(3, 1, 2, 6, 4099, 1e-5);  // decoding: one token at a far position
}

}  // namespace
}  // namespace linac
