// Gated linear unit CPU reference: forward against the formula (SiLU and identity gates),
// backward against finite differences for both, and large gate values.
#include <cmath>

#include "swiglu/swiglu.h"
#include "swiglu/swiglu_linear.h"
#include "test_util.h"

namespace linac::test_swiglu {
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

// The channel-mixer GEMMs with the gate against plain loops: h = x W_in^T and a = silu(g) u;
// dh = swiglu_bwd(h, dy W_out) with da written on the composite path.
TEST(SwigluCpu, LinearMatchesLoops) {
  const int64_t n = 5, d = 7, f = 6;
  OwnedTensor x = test::random_tensor({n, d}, DType::F64, 1), w_in = test::random_tensor({2 * f, d}, DType::F64, 2);
  OwnedTensor dy = test::random_tensor({n, d}, DType::F64, 3), w_out = test::random_tensor({d, f}, DType::F64, 4);
  OwnedTensor h(DType::F64, Device::CPU, {n, 2 * f}), a(DType::F64, Device::CPU, {n, f});
  OwnedTensor da(DType::F64, Device::CPU, {n, f}), dh(DType::F64, Device::CPU, {n, 2 * f});
  swiglu_linear_fwd(Ctx{}, x, w_in, h, a);
  swiglu_linear_bwd(Ctx{}, dy, w_out, h, da, dh);
  const double *xp = x->data<double>(), *wi = w_in->data<double>(), *dyp = dy->data<double>(),
               *wo = w_out->data<double>(), *hp = h->data<double>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      double g = 0, u = 0, dav = 0;
      for (int64_t k = 0; k < d; ++k) {
        g += xp[r * d + k] * wi[j * d + k];
        u += xp[r * d + k] * wi[(f + j) * d + k];
        dav += dyp[r * d + k] * wo[k * f + j];
      }
      EXPECT_NEAR(hp[r * 2 * f + j], g, 1e-14);
      EXPECT_NEAR(hp[r * 2 * f + f + j], u, 1e-14);
      const double s = 1 / (1 + std::exp(-g));
      EXPECT_NEAR(a->data<double>()[r * f + j], g * s * u, 1e-14);
      EXPECT_NEAR(da->data<double>()[r * f + j], dav, 1e-14);
      EXPECT_NEAR(dh->data<double>()[r * 2 * f + j], dav * u * s * (1 + g * (1 - s)), 1e-13);
      EXPECT_NEAR(dh->data<double>()[r * 2 * f + f + j], dav * g * s, 1e-13);
    }
}

// The value half's unit dots against f64 sums (f32 products: the table is f32 whatever the
// dtype); swiglu_linear_bwd's composite path writes the same table beside dh.
TEST(SwigluCpu, ValueDotsSumEachUnit) {
  const int64_t n = 9, f = 40, d = 11;  // five units per row
  OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 4, -3, 3);
  OwnedTensor dh = test::random_tensor({n, 2 * f}, DType::F64, 5, -3, 3);
  OwnedTensor dots(DType::F32, Device::CPU, {n, f / 8});
  swiglu_value_dots(Ctx{}, h, dh, dots);
  const double *hp = h->data<double>(), *dhp = dh->data<double>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f / 8; ++j) {
      double want = 0;
      for (int64_t c = 8 * j; c < 8 * j + 8; ++c) want += dhp[r * 2 * f + f + c] * hp[r * 2 * f + f + c];
      EXPECT_NEAR(dots->data<float>()[r * (f / 8) + j], want, 1e-5 * (1 + std::abs(want)));
    }
  OwnedTensor dy = test::random_tensor({n, d}, DType::F64, 6), w_out = test::random_tensor({d, f}, DType::F64, 7);
  OwnedTensor da(DType::F64, Device::CPU, {n, f}), dh2(DType::F64, Device::CPU, {n, 2 * f});
  OwnedTensor dots2(DType::F32, Device::CPU, {n, f / 8}), want(DType::F32, Device::CPU, {n, f / 8});
  test::poison(dots2);
  swiglu_linear_bwd(Ctx{}, dy, w_out, h, da, dh2, GluAct::Silu, dots2);
  swiglu_value_dots(Ctx{}, h, dh2, want);
  EXPECT_TRUE(test::same_bits(dots2, want));
  // F not a multiple of 8, and a table of the wrong width, are refused.
  OwnedTensor h12(DType::F64, Device::CPU, {n, 12}), dots1(DType::F32, Device::CPU, {n, 1});
  EXPECT_THROW(swiglu_value_dots(Ctx{}, h12, h12, dots1), std::exception);
  OwnedTensor narrow(DType::F32, Device::CPU, {n, f / 8 - 1});
  EXPECT_THROW(swiglu_value_dots(Ctx{}, h, dh, narrow), std::exception);
  EXPECT_THROW(swiglu_linear_bwd(Ctx{}, dy, w_out, h, da, dh2, GluAct::Silu, narrow), std::exception);
}

// The projection with SiLU from column c0 on against plain loops.
TEST(SwigluCpu, SiluLinearMatchesLoops) {
  const int64_t n = 5, d = 7, m = 20, c0 = 8;
  OwnedTensor x = test::random_tensor({n, d}, DType::F64, 1), w = test::random_tensor({m, d}, DType::F64, 4);
  OwnedTensor y(DType::F64, Device::CPU, {n, m}), v(DType::F64, Device::CPU, {n, m - c0});
  silu_linear_fwd(Ctx{}, x, w, y, v, c0);
  const double *xp = x->data<double>(), *wp = w->data<double>();
  auto silu = [](double t) { return t / (1 + std::exp(-t)); };
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) {
      double p = 0;
      for (int64_t k = 0; k < d; ++k) p += xp[r * d + k] * wp[j * d + k];
      EXPECT_NEAR(y->data<double>()[r * m + j], p, 1e-14);
      if (j >= c0) EXPECT_NEAR(v->data<double>()[r * (m - c0) + j - c0], silu(p), 1e-14);
    }
  // c0 need not be a multiple of 8 (the fused kernel's condition) ...
  OwnedTensor v_odd(DType::F64, Device::CPU, {n, m - 3});
  silu_linear_fwd(Ctx{}, x, w, y, v_odd, 3);
  EXPECT_NEAR(v_odd->data<double>()[0], silu(y->data<double>()[3]), 1e-14);
  // ... but lie in [0, M), with a of width M - c0.
  OwnedTensor v_none(DType::F64, Device::CPU, {n, 0});
  EXPECT_THROW(silu_linear_fwd(Ctx{}, x, w, y, v_none, m), std::exception);
  EXPECT_THROW(silu_linear_fwd(Ctx{}, x, w, y, v, 16), std::exception);
}

TEST(SwigluCpu, LinearRejectsMismatchedShapes) {
  OwnedTensor x = test::random_tensor({5, 7}, DType::F64, 1), w_in = test::random_tensor({12, 8}, DType::F64, 2);
  OwnedTensor h(DType::F64, Device::CPU, {5, 12}), a(DType::F64, Device::CPU, {5, 6});
  EXPECT_THROW(swiglu_linear_fwd(Ctx{}, x, w_in, h, a), std::exception);
  OwnedTensor w_out = test::random_tensor({7, 6}, DType::F64, 3), dh(DType::F64, Device::CPU, {5, 12});
  EXPECT_THROW(swiglu_linear_bwd(Ctx{}, x, w_out, h, Tensor(), dh), std::exception);  // no da on the CPU
}

}  // namespace
}  // namespace linac::test_swiglu
