// Short gated convolution, CPU reference: a hand-computed forward (zero left
// padding, bias not on the padding), gradient check in double of every input
// and parameter (a, g, h, ba, bg) with a and g as strided views of a fused
// projection buffer and da/dg of its gradient, parameter gradients accumulated,
// both activations, with and without biases, the backward without dg, and the
// decode step reproducing the forward bit for bit in f32 and f64.
#include <cmath>

#include "short_conv/short_conv.h"
#include "test_util.h"

namespace linac::test_short_conv {
namespace {

// A [B, T, C] view of columns [col0, col0 + C) of a contiguous [B, T, P]
// buffer.
Tensor btc(const Tensor &buf, int64_t col0, int64_t C) {
  const int64_t B = buf.size(0), T = buf.size(1), P = buf.size(2);
  Tensor t(static_cast<char *>(buf.ptr) + col0 * static_cast<int64_t>(dtype_size(buf.dtype)), buf.dtype, buf.device,
           {B, T, C});
  t.strides = {T * P, P, 1};
  return t;
}

// Every element of a strided [B, T, C] view, in order.
std::vector<double> gather(const Tensor &x) {
  const int64_t span = (x.size(0) - 1) * x.strides[0] + (x.size(1) - 1) * x.strides[1] + x.size(2);
  const std::vector<double> all = to_doubles(Tensor(x.ptr, x.dtype, x.device, {span}));
  std::vector<double> out;
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t t = 0; t < x.size(1); ++t)
      for (int64_t c = 0; c < x.size(2); ++c) out.push_back(all[b * x.strides[0] + t * x.strides[1] + c]);
  return out;
}

// a | g | one pad column in a [B, T, 2C + 1] buffer, so neither view is
// contiguous.
struct Problem {
  int64_t B, T, C, W;
  DType dt;
  OwnedTensor proj, dproj, h, ba, bg, u;
  Problem(int64_t b, int64_t t, int64_t c, int64_t w, DType d = DType::F64, uint64_t seed = 1)
      : B(b),
        T(t),
        C(c),
        W(w),
        dt(d),
        proj(test::random_tensor({b, t, 2 * c + 1}, d, seed)),
        dproj(d, Device::CPU, {b, t, 2 * c + 1}),
        h(test::random_tensor({c, w}, d, seed + 1)),
        ba(test::random_tensor({c}, d, seed + 2)),
        bg(test::random_tensor({c}, d, seed + 3)),
        u(test::random_tensor({b, t, c}, d, seed + 4)) {}
  Tensor a(const Tensor &x) const { return btc(x, 0, C); }
  Tensor g(const Tensor &x) const { return btc(x, C, C); }
  OwnedTensor forward(bool silu, bool biases) const {
    OwnedTensor z(dt, Device::CPU, {B, T, C});
    test::poison(z);
    short_conv_fwd(Ctx{}, a(proj), g(proj), h, biases ? ba.t : Tensor(), biases ? bg.t : Tensor(), z, {silu});
    return z;
  }
  // loss = sum(z * u)
  double loss(bool silu, bool biases) const {
    const auto z = to_doubles(forward(silu, biases));
    const auto uu = to_doubles(u);
    double s = 0;
    for (size_t i = 0; i < z.size(); ++i) s += z[i] * uu[i];
    return s;
  }
};

TEST(ShortConv, ForwardByHand) {
  // B = 1, T = 2, C = 1, W = 3, identity activation: the first token sees only
  // itself.
  Problem p(1, 2, 1, 3);
  const auto pr = to_doubles(p.proj), h = to_doubles(p.h);
  const double ba = to_doubles(p.ba)[0], bg = to_doubles(p.bg)[0];
  const double a0 = pr[0], g0 = pr[1], a1 = pr[3],
               g1 = pr[4];  // row stride 2C + 1 = 3
  const auto z = to_doubles(p.forward(false, true));
  EXPECT_NEAR(z[0], h[2] * (a0 + ba) * (g0 + bg), 1e-14);
  EXPECT_NEAR(z[1], (h[1] * (a0 + ba) + h[2] * (a1 + ba)) * (g1 + bg), 1e-14);
  const double c1 = h[1] * (a0 + ba) + h[2] * (a1 + ba);
  EXPECT_NEAR(to_doubles(p.forward(true, true))[1], c1 / (1 + std::exp(-c1)) * (g1 + bg), 1e-14);
  const auto z_nb = to_doubles(p.forward(false, false));
  EXPECT_NEAR(z_nb[1], (h[1] * a0 + h[2] * a1) * g1, 1e-14);
}

struct GradCase {
  int64_t B, T, C, W;
  bool silu, biases;
};

class ShortConvGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(ShortConvGrad, MatchesCentralDifferences) {
  const GradCase gc = GetParam();
  Problem p(gc.B, gc.T, gc.C, gc.W);
  // Parameter gradients start from random values: the backward must add to
  // them.
  OwnedTensor dh0 = test::random_tensor({gc.C, gc.W}, DType::F64, 11), dh(DType::F64, Device::CPU, {gc.C, gc.W});
  OwnedTensor db0 = test::random_tensor({gc.C}, DType::F64, 12), dba(DType::F64, Device::CPU, {gc.C}),
              dbg(DType::F64, Device::CPU, {gc.C});
  copy_tensor(dh, dh0);
  copy_tensor(dba, db0);
  copy_tensor(dbg, db0);
  test::poison(p.dproj);
  short_conv_bwd(Ctx{}, p.a(p.proj), p.g(p.proj), p.h, gc.biases ? p.ba.t : Tensor(), gc.biases ? p.bg.t : Tensor(),
                 p.u, p.a(p.dproj), p.g(p.dproj), dh, gc.biases ? dba.t : Tensor(), gc.biases ? dbg.t : Tensor(),
                 {gc.silu});
  const std::vector<double> da = gather(p.a(p.dproj)), dg = gather(p.g(p.dproj));
  ASSERT_TRUE(test::all_finite(da) && test::all_finite(dg));
  auto loss = [&] { return p.loss(gc.silu, gc.biases); };

  // Numeric gradients with respect to the fused buffer cover a and g (the pad
  // column is unused).
  const int64_t P = 2 * gc.C + 1;
  std::vector<double> analytic(static_cast<size_t>(gc.B * gc.T * P), 0.0);
  size_t ia = 0, ig = 0;
  for (int64_t row = 0; row < gc.B * gc.T; ++row)
    for (int64_t c = 0; c < gc.C; ++c) {
      analytic[static_cast<size_t>(row * P + c)] = da[ia++];
      analytic[static_cast<size_t>(row * P + gc.C + c)] = dg[ig++];
    }
  EXPECT_LT(test::check_grad(loss, p.proj->data<double>(), analytic.data(), analytic.size(), 96, 3, 1e-5), 1e-6)
      << "a, g";

  std::vector<double> dh_added = to_doubles(dh);
  const auto dh_init = to_doubles(dh0);
  for (size_t i = 0; i < dh_added.size(); ++i) dh_added[i] -= dh_init[i];
  EXPECT_LT(test::check_grad(loss, p.h->data<double>(), dh_added.data(), dh_added.size(), 64, 4, 1e-5), 1e-6) << "h";
  if (gc.biases) {
    std::vector<double> dba_added = to_doubles(dba), dbg_added = to_doubles(dbg);
    const auto b_init = to_doubles(db0);
    for (size_t i = 0; i < b_init.size(); ++i) dba_added[i] -= b_init[i], dbg_added[i] -= b_init[i];
    EXPECT_LT(test::check_grad(loss, p.ba->data<double>(), dba_added.data(), dba_added.size(), 64, 5, 1e-5), 1e-6)
        << "ba";
    EXPECT_LT(test::check_grad(loss, p.bg->data<double>(), dbg_added.data(), dbg_added.size(), 64, 6, 1e-5), 1e-6)
        << "bg";
  }
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (int64_t T : {1, 2, 5, 37})
    for (int64_t W : {1, 3, 4})
      for (bool silu : {true, false}) cases.push_back({2, T, 7, W, silu, true});
  cases.push_back({2, 5, 7, 3, true, false});
  cases.push_back({1, 9, 5, 8, true, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ShortConvGrad, ::testing::ValuesIn(grad_cases()), [](const auto &info) {
  const GradCase &c = info.param;
  return "T" + std::to_string(c.T) + "_W" + std::to_string(c.W) + (c.silu ? "_silu" : "_id") +
         (c.biases ? "" : "_nobias") + "_B" + std::to_string(c.B);
});

// Without dg (Latte's constant gate) the backward writes da, dh, dba and dbg exactly as with it and
// leaves dg's memory alone.
TEST(ShortConv, GateGradientIsOptional) {
  for (const bool silu : {true, false}) {
    SCOPED_TRACE(silu ? "silu" : "identity");
    const int64_t B = 2, T = 37, C = 7, W = 3;
    const Problem p(B, T, C, W, DType::F64, 9);
    struct Grads {
      OwnedTensor dproj, dh, dba, dbg;
    };
    auto backward = [&](bool want_dg) {
      Grads r{OwnedTensor(DType::F64, Device::CPU, {B, T, 2 * C + 1}), test::random_tensor({C, W}, DType::F64, 20),
              test::random_tensor({C}, DType::F64, 21), test::random_tensor({C}, DType::F64, 22)};
      test::poison(r.dproj);
      short_conv_bwd(Ctx{}, p.a(p.proj), p.g(p.proj), p.h, p.ba, p.bg, p.u, p.a(r.dproj),
                     want_dg ? p.g(r.dproj) : Tensor(), r.dh, r.dba, r.dbg, {silu});
      return r;
    };
    const Grads with = backward(true), without = backward(false);
    EXPECT_EQ(gather(p.a(without.dproj)), gather(p.a(with.dproj)));
    EXPECT_EQ(to_doubles(without.dh), to_doubles(with.dh));
    EXPECT_EQ(to_doubles(without.dba), to_doubles(with.dba));
    EXPECT_EQ(to_doubles(without.dbg), to_doubles(with.dbg));
    for (const double v : gather(p.g(without.dproj))) ASSERT_TRUE(std::isnan(v)) << "dg written";
    for (const double v : gather(p.g(with.dproj))) ASSERT_FALSE(std::isnan(v));
  }
}

// Stepping token by token from a zero state gives the forward's outputs
// exactly.
void check_steps_equal_forward(DType dt) {
  for (int64_t W : {1, 2, 3, 4, 8})
    for (bool biases : {true, false}) {
      SCOPED_TRACE("W=" + std::to_string(W) + (biases ? " biases" : " no biases"));
      const int64_t B = 3, T = 11, C = 13;
      Problem p(B, T, C, W, dt, 5);
      const OwnedTensor z = p.forward(true, biases);
      const std::vector<double> zf = to_doubles(z);
      OwnedTensor state(dt, Device::CPU, {B, W - 1, C}), zt(dt, Device::CPU, {B, C});
      if (W > 1) zero_tensor(state);
      for (int64_t t = 0; t < T; ++t) {
        test::poison(zt);
        short_conv_step(Ctx{}, p.a(p.proj).select(1, t), p.g(p.proj).select(1, t), p.h, biases ? p.ba.t : Tensor(),
                        biases ? p.bg.t : Tensor(), state, zt, {true});
        const std::vector<double> zs = to_doubles(zt);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(zs[static_cast<size_t>(b * C + c)], zf[static_cast<size_t>((b * T + t) * C + c)])
                << "t=" << t << " b=" << b << " c=" << c;
      }
    }
}

TEST(ShortConv, StepsEqualForwardF64) { check_steps_equal_forward(DType::F64); }
TEST(ShortConv, StepsEqualForwardF32) { check_steps_equal_forward(DType::F32); }

TEST(ShortConv, RejectsBadArguments) {
  Problem p(1, 4, 3, 3);
  OwnedTensor z(DType::F64, Device::CPU, {1, 4, 3});
  OwnedTensor wide(DType::F64, Device::CPU, {3, kShortConvMaxWidth + 1});
  EXPECT_ANY_THROW(short_conv_fwd(Ctx{}, p.a(p.proj), p.g(p.proj), wide, Tensor(), Tensor(), z, {}));
  OwnedTensor dh(DType::F64, Device::CPU, {3, 3});
  EXPECT_ANY_THROW(short_conv_bwd(Ctx{}, p.a(p.proj), p.g(p.proj), p.h, Tensor(), Tensor(), z, p.a(p.dproj),
                                  p.g(p.dproj), dh, p.ba, Tensor(), {}));
}

}  // namespace
}  // namespace linac::test_short_conv
