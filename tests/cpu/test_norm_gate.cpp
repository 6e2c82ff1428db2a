// Per-head norm + swish gate: statistics and values against a direct computation, and the
// backward (dx, dr) against central differences in double, on strided r/dr views.
#include <cmath>

#include "norm_gate/norm_gate.h"
#include "test_util.h"

namespace linac::test_norm_gate {
namespace {

constexpr int64_t kN = 5, kH = 3, kD = 7;

TEST(NormGateCpu, ForwardValues) {
  OwnedTensor x = test::random_tensor({kN, kH * kD}, DType::F64, 1, -2, 3), r = test::random_tensor({kN, kH * kD}, DType::F64, 2, -4, 4);
  OwnedTensor br = test::random_tensor({kH * kD}, DType::F64, 3);
  OwnedTensor y(DType::F64, Device::CPU, {kN, kH * kD}), mean(DType::F64, Device::CPU, {kN, kH}), rstd(DType::F64, Device::CPU, {kN, kH});
  norm_gate_fwd(Ctx{}, x, r, br, y, mean, rstd, 1e-5);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t h = 0; h < kH; ++h) {
      const double* xr = x->data<double>() + n * kH * kD + h * kD;
      double m = 0, v = 0;
      for (int64_t j = 0; j < kD; ++j) m += xr[j] / kD;
      for (int64_t j = 0; j < kD; ++j) v += (xr[j] - m) * (xr[j] - m) / kD;
      EXPECT_NEAR(mean->data<double>()[n * kH + h], m, 1e-12);
      EXPECT_NEAR(rstd->data<double>()[n * kH + h], 1 / std::sqrt(v + 1e-5), 1e-9);
      for (int64_t j = 0; j < kD; ++j) {
        const int64_t c = h * kD + j;
        const double p = r->data<double>()[n * kH * kD + c] + br->data<double>()[c];
        EXPECT_NEAR(y->data<double>()[n * kH * kD + c], (xr[j] - m) / std::sqrt(v + 1e-5) * p / (1 + std::exp(-p)), 1e-9);
      }
    }
}

TEST(NormGateCpu, GradCheckDouble) {
  const int64_t W = kH * kD;
  OwnedTensor x = test::random_tensor({kN, W}, DType::F64, 4, -2, 3), rw = test::random_tensor({kN, W + 4}, DType::F64, 5, -4, 4);
  const Tensor r = Tensor(rw).narrow(1, 2, W);
  OwnedTensor br = test::random_tensor({W}, DType::F64, 6), dy = test::random_tensor({kN, W}, DType::F64, 7);
  OwnedTensor y(DType::F64, Device::CPU, {kN, W}), mean(DType::F64, Device::CPU, {kN, kH}), rstd(DType::F64, Device::CPU, {kN, kH});
  OwnedTensor dx(DType::F64, Device::CPU, {kN, W}), drw(DType::F64, Device::CPU, {kN, W + 1});
  const Tensor dr = Tensor(drw).narrow(1, 0, W);
  norm_gate_fwd(Ctx{}, x, r, br, y, mean, rstd, 1e-5);
  norm_gate_bwd(Ctx{}, x, r, br, mean, rstd, dy, dx, dr);
  auto loss = [&] {
    norm_gate_fwd(Ctx{}, x, r, br, y, mean, rstd, 1e-5);
    double l = 0;
    for (int64_t i = 0; i < kN * W; ++i) l += y->data<double>()[i] * dy->data<double>()[i];
    return l;
  };
  EXPECT_LT(test::check_grad(loss, x->data<double>(), dx->data<double>(), static_cast<size_t>(kN * W)), 1e-7);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t c = 0; c < W; ++c) {
      const double num = test::numeric_grad(loss, r.data<double>() + n * (W + 4) + c, 0, 1e-6);
      EXPECT_NEAR(dr.data<double>()[n * (W + 1) + c], num, 1e-7 * (1 + std::fabs(num)));
    }
}

}  // namespace
}  // namespace linac::test_norm_gate
