// SiLU CPU reference: forward against the formula, backward against central differences on
// column ranges of fused buffers, and large inputs.
#include <cmath>

#include "activation/activation.h"
#include "test_util.h"

namespace linac::test_activation {
namespace {

TEST(SiluCpu, ForwardMatchesFormula) {
  const int64_t n = 4, c = 19;
  OwnedTensor x = test::random_tensor({n, c}, DType::F64, 1, -8, 8);
  OwnedTensor y(DType::F64, Device::CPU, {n, c});
  silu_fwd(Ctx{}, x, y);
  for (int64_t i = 0; i < n * c; ++i) {
    const double v = x->data<double>()[i];
    EXPECT_NEAR(y->data<double>()[i], v / (1 + std::exp(-v)), 1e-14);
  }
}

TEST(SiluCpu, GradCheckDoubleStrided) {
  // x is columns [3, 3 + C) of a fused [N, P] projection, y and dx column ranges of other buffers.
  const int64_t n = 6, c = 23, p = 40;
  OwnedTensor xb = test::random_tensor({n, p}, DType::F64, 2, -5, 5);
  OwnedTensor u = test::random_tensor({n, c}, DType::F64, 3);
  const Tensor x = xb.t.narrow(1, 3, c);
  auto loss = [&] {
    OwnedTensor yb(DType::F64, Device::CPU, {n, p});
    silu_fwd(Ctx{}, x, yb.t.narrow(1, 10, c));
    double l = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) l += yb->data<double>()[r * p + 10 + j] * u->data<double>()[r * c + j];
    return l;
  };
  OwnedTensor dxb(DType::F64, Device::CPU, {n, p});
  test::poison(dxb);
  silu_bwd(Ctx{}, x, u, dxb.t.narrow(1, 3, c));
  std::vector<double> g = to_doubles(dxb);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < p; ++j) {
      const size_t i = static_cast<size_t>(r * p + j);
      if (j < 3 || j >= 3 + c) {
        EXPECT_TRUE(std::isnan(g[i])) << "dx written outside its view at column " << j;
        g[i] = 0;
      }
    }
  EXPECT_LT(test::check_grad(loss, xb->data<double>(), g.data(), g.size(), 128), 1e-6);
}

TEST(SiluCpu, LargeInputsStayFinite) {
  OwnedTensor x(DType::F32, Device::CPU, {1, 4}), y(DType::F32, Device::CPU, {1, 4});
  OwnedTensor dx(DType::F32, Device::CPU, {1, 4});
  const float v[4] = {-200.f, -90.f, 90.f, 200.f};
  for (int j = 0; j < 4; ++j) x->data<float>()[j] = v[j];
  OwnedTensor dy = test::random_tensor({1, 4}, DType::F32, 4);
  silu_fwd(Ctx{}, x, y);
  silu_bwd(Ctx{}, x, dy, dx);
  EXPECT_TRUE(test::all_finite(to_doubles(y)));
  EXPECT_TRUE(test::all_finite(to_doubles(dx)));
  EXPECT_EQ(y->data<float>()[3], 200.f);
  EXPECT_NEAR(y->data<float>()[0], 0.f, 1e-30f);
  EXPECT_NEAR(dx->data<float>()[3], dy->data<float>()[3], 1e-6f);  // silu'(200) = 1
}

}  // namespace
}  // namespace linac::test_activation
