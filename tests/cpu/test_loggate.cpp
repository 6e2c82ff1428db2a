// Log-space gate: values against the formula (with and without the clamp), extreme inputs stay
// finite, and the backward against central differences in double (z away from the clamp edge).
#include <cmath>

#include "loggate/loggate.h"
#include "test_util.h"

namespace linac {
namespace {

double ref_gate(double x, double tau, double clamp) {
  const double v = std::log(1.0 / (1.0 + std::exp(-x))) / tau;
  return clamp < 0 ? std::max(v, clamp) : v;
}

TEST(LogGateCpu, ForwardValues) {
  const int64_t N = 7, D = 5;
  OwnedTensor z = test::random_tensor({N, D}, DType::F64, 1, -70, 20), b = test::random_tensor({D}, DType::F64, 2);
  OwnedTensor g(DType::F64, Device::CPU, {N, D});
  for (double clamp : {0.0, -3.0}) {
    loggate_fwd(Ctx{}, z, b, g, {16.0, clamp});
    for (int64_t i = 0; i < N * D; ++i)
      EXPECT_NEAR(g->data<double>()[i], ref_gate(z->data<double>()[i] + b->data<double>()[i % D], 16.0, clamp), 1e-12);
  }
  // Very negative inputs: logsigmoid(x) ~ x, never -inf.
  OwnedTensor zz(DType::F32, Device::CPU, {1, 2}), bb(DType::F32, Device::CPU, {2}), gg(DType::F32, Device::CPU, {1, 2});
  zz->data<float>()[0] = -1e4f, zz->data<float>()[1] = 1e4f;
  bb->data<float>()[0] = bb->data<float>()[1] = 0.f;
  loggate_fwd(Ctx{}, zz, bb, gg, {16.0, 0.0});
  EXPECT_NEAR(gg->data<float>()[0], -1e4f / 16, 1e-2);
  EXPECT_LE(gg->data<float>()[1], 0.f);
  EXPECT_TRUE(std::isfinite(gg->data<float>()[1]));
}

TEST(LogGateCpu, GradCheckDouble) {
  const int64_t N = 6, D = 9;
  // A strided z (a column slice of a wider buffer), as the mixer would pass one.
  OwnedTensor wide = test::random_tensor({N, D + 3}, DType::F64, 3, -60, 8), b = test::random_tensor({D}, DType::F64, 4);
  const Tensor z = Tensor(wide).narrow(1, 1, D);
  OwnedTensor dg = test::random_tensor({N, D}, DType::F64, 5), dz(DType::F64, Device::CPU, {N, D});
  for (double clamp : {0.0, -3.0}) {
    const LogGateOpts o{16.0, clamp};
    loggate_bwd(Ctx{}, z, b, dg, dz, o);
    OwnedTensor g(DType::F64, Device::CPU, {N, D});
    auto loss = [&] {
      loggate_fwd(Ctx{}, z, b, g, o);
      double l = 0;
      for (int64_t i = 0; i < N * D; ++i) l += g->data<double>()[i] * dg->data<double>()[i];
      return l;
    };
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < D; ++j) {
        double* x = z.data<double>() + r * (D + 3) + j;
        // Skip points within the finite-difference step of the clamp's kink.
        if (clamp < 0 && std::fabs(ref_gate(*x + b->data<double>()[j], 16.0, 0.0) - clamp) < 1e-3) continue;
        const double num = test::numeric_grad(loss, x, 0, 1e-5);
        EXPECT_NEAR(dz->data<double>()[r * D + j], num, 1e-7 * (1 + std::fabs(num))) << r << "," << j;
      }
  }
}

}  // namespace
}  // namespace linac
