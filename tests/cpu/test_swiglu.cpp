// Gated linear unit CPU reference: forward against the formula (SiLU and identity gates),
// backward against finite differences for both, and large gate values.
#include <cmath>

#include "swiglu/swiglu.h"
#include "test_util.h"

namespace linac {
namespace {

TEST(SwigluCpu, ForwardMatchesFormula) {
  const int64_t n = 7, f = 37;
  OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 1, -4, 4);
  OwnedTensor a(DType::F64, Device::CPU, {n, f});
  swiglu_fwd(Ctx{}, h, a);
  const double* hp = h->data<double>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double g = hp[r * 2 * f + j], u = hp[r * 2 * f + f + j];
      EXPECT_NEAR(a->data<double>()[r * f + j], g / (1 + std::exp(-g)) * u, 1e-14);
    }
}

TEST(SwigluCpu, IdentityGateIsPlainProduct) {
  const int64_t n = 5, f = 13;
  OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 1, -4, 4);
  OwnedTensor a(DType::F64, Device::CPU, {n, f});
  swiglu_fwd(Ctx{}, h, a, GluAct::Identity);
  const double* hp = h->data<double>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j)
      EXPECT_EQ(a->data<double>()[r * f + j], hp[r * 2 * f + j] * hp[r * 2 * f + f + j]);
}

// With the identity gate the loss is linear in every element of h, so a large step makes the
// central differences exact and free of cancellation.
void grad_check(GluAct act) {
  const double step = act == GluAct::Identity ? 1e-2 : 1e-6;
  for (int64_t f : {1, 37, 64}) {
    const int64_t n = 7;
    OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 2, -4, 4);
    OwnedTensor u = test::random_tensor({n, f}, DType::F64, 3);
    auto loss = [&] {
      OwnedTensor a(DType::F64, Device::CPU, {n, f});
      swiglu_fwd(Ctx{}, h, a, act);
      double l = 0;
      for (int64_t i = 0; i < n * f; ++i) l += a->data<double>()[i] * u->data<double>()[i];
      return l;
    };
    OwnedTensor dh(DType::F64, Device::CPU, {n, 2 * f});
    test::poison(dh);
    swiglu_bwd(Ctx{}, h, u, dh, act);
    EXPECT_LT(test::check_grad(loss, h->data<double>(), dh->data<double>(), static_cast<size_t>(n * 2 * f), 128, 7,
                              step),
              1e-6)
        << "F " << f;
  }
}

TEST(SwigluCpu, GradCheckDouble) { grad_check(GluAct::Silu); }

TEST(SwigluCpu, GradCheckDoubleIdentity) { grad_check(GluAct::Identity); }

TEST(SwigluCpu, LargeGatesStayFinite) {
  const int64_t n = 3, f = 4;
  OwnedTensor h(DType::F32, Device::CPU, {n, 2 * f});
  const float gates[4] = {-200.f, -90.f, 90.f, 200.f};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      h->data<float>()[r * 2 * f + j] = gates[j];
      h->data<float>()[r * 2 * f + f + j] = 1.5f;
    }
  OwnedTensor a(DType::F32, Device::CPU, {n, f}), dh(DType::F32, Device::CPU, {n, 2 * f});
  OwnedTensor da = test::random_tensor({n, f}, DType::F32, 4);
  swiglu_fwd(Ctx{}, h, a);
  swiglu_bwd(Ctx{}, h, da, dh);
  EXPECT_TRUE(test::all_finite(to_doubles(a)));
  EXPECT_TRUE(test::all_finite(to_doubles(dh)));
  EXPECT_NEAR(a->data<float>()[3], 300.f, 1e-4f);  // silu(200) * 1.5
  EXPECT_NEAR(a->data<float>()[0], 0.f, 1e-30f);
}

}  // namespace
}  // namespace linac
