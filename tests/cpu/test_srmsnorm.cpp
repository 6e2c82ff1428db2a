// SimpleRMSNorm CPU reference: forward against the formula, backward against central
// differences (overwriting and accumulating; with the output gate, dx and du; with a constant
// factor), on rows that are
// column ranges of wider buffers.
#include <cmath>

#include "srmsnorm/srmsnorm.h"
#include "test_util.h"

namespace linac::test_srmsnorm {
namespace {

constexpr int64_t kPad = 5;  // extra columns around the [N, C] views
constexpr float kEps = 1e-6f;

// x, y, dx are columns [2, 2 + C) of [N, C + kPad] buffers; loss = sum(y * u) for a fixed random u.
struct SrmsnormProblem {
  int64_t n, c;
  OwnedTensor xb, u;
  SrmsnormProblem(int64_t n_, int64_t c_)
      : n(n_), c(c_), xb(test::random_tensor({n_, c_ + kPad}, DType::F64, 1, -2.0, 2.0)),
        u(test::random_tensor({n_, c_}, DType::F64, 3)) {}
  Tensor x() const { return xb.t.narrow(1, 2, c); }
  double loss() const {
    OwnedTensor yb(DType::F64, Device::CPU, {n, c + kPad}), rstd(DType::F64, Device::CPU, {n});
    srmsnorm_fwd(Ctx{}, x(), yb.t.narrow(1, 2, c), rstd, kEps);
    double l = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) l += yb->data<double>()[r * (c + kPad) + 2 + j] * u->data<double>()[r * c + j];
    return l;
  }
};

TEST(SrmsnormCpu, ForwardMatchesFormula) {
  SrmsnormProblem p(3, 37);
  OwnedTensor y(DType::F64, Device::CPU, {3, 37}), rstd(DType::F64, Device::CPU, {3});
  srmsnorm_fwd(Ctx{}, p.x(), y, rstd, kEps);
  const double* xb = p.xb->data<double>();
  for (int64_t r = 0; r < 3; ++r) {
    const double* x = xb + r * (37 + kPad) + 2;
    double ss = 0;
    for (int64_t j = 0; j < 37; ++j) ss += x[j] * x[j];
    const double rs = 1 / std::sqrt(ss / 37 + static_cast<double>(kEps));
    EXPECT_NEAR(rstd->data<double>()[r], rs, 1e-12);
    for (int64_t j = 0; j < 37; ++j) EXPECT_NEAR(y->data<double>()[r * 37 + j], x[j] * rs, 1e-12);
  }
}

// The residual add normalises h = x + add (strided views too) and writes h; x is read only.
TEST(SrmsnormCpu, ResidualAdd) {
  SrmsnormProblem p(4, 37);
  OwnedTensor ab = test::random_tensor({4, 37 + kPad}, DType::F64, 8), hb(DType::F64, Device::CPU, {4, 37 + kPad});
  test::poison(hb);
  const Tensor add = ab.t.narrow(1, 1, 37), h = hb.t.narrow(1, 3, 37);
  const std::vector<double> xv = test::view_values(p.x()), av = test::view_values(add);
  OwnedTensor sum(DType::F64, Device::CPU, {4, 37});
  for (size_t i = 0; i < xv.size(); ++i) sum->data<double>()[i] = xv[i] + av[i];
  OwnedTensor y(DType::F64, Device::CPU, {4, 37}), rstd(DType::F64, Device::CPU, {4});
  OwnedTensor y2(DType::F64, Device::CPU, {4, 37}), rstd2(DType::F64, Device::CPU, {4});
  srmsnorm_fwd(Ctx{}, sum, y, rstd, kEps);
  srmsnorm_fwd(Ctx{}, p.x(), y2, rstd2, kEps, add, h);
  EXPECT_EQ(to_doubles(y2), to_doubles(y));
  EXPECT_EQ(to_doubles(rstd2), to_doubles(rstd));
  EXPECT_EQ(test::view_values(h), to_doubles(sum));
  EXPECT_EQ(test::view_values(p.x()), xv);
  const std::vector<double> hv = to_doubles(hb);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j : {0, 1, 2, 40, 41}) EXPECT_TRUE(std::isnan(hv[static_cast<size_t>(r * (37 + kPad) + j)]));
}

TEST(SrmsnormCpu, GradCheckDouble) {
  for (int64_t c : {2, 37, 130}) {
    for (bool accumulate : {false, true}) {
      const int64_t n = 5;
      SrmsnormProblem p(n, c);
      OwnedTensor y(DType::F64, Device::CPU, {n, c}), rstd(DType::F64, Device::CPU, {n});
      srmsnorm_fwd(Ctx{}, p.x(), y, rstd, kEps);
      // Without accumulate, dx starts as NaN and must be overwritten; with it, dx starts random.
      OwnedTensor dxb = test::random_tensor({n, c + kPad}, DType::F64, 9);
      if (!accumulate) test::poison(dxb);
      const std::vector<double> dx0 = to_doubles(dxb);
      srmsnorm_bwd(Ctx{}, p.x(), rstd, p.u, dxb.t.narrow(1, 2, c), accumulate);
      // Analytic gradient over the whole buffer: zero in the columns outside the view, which must
      // also be left as they were.
      std::vector<double> g = to_doubles(dxb);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < c + kPad; ++j) {
          const size_t i = static_cast<size_t>(r * (c + kPad) + j);
          if (j < 2 || j >= 2 + c) {
            if (accumulate) EXPECT_EQ(g[i], dx0[i]) << "column " << j << " outside the view changed";
            else EXPECT_TRUE(std::isnan(g[i])) << "column " << j << " outside the view changed";
            g[i] = 0;
          } else if (accumulate) {
            g[i] -= dx0[i];
          }
        }
      ASSERT_TRUE(test::all_finite(g));
      auto loss = [&] { return p.loss(); };
      EXPECT_LT(test::check_grad(loss, p.xb->data<double>(), g.data(), g.size(), 256), 1e-6)
          << "C " << c << " accumulate " << accumulate;
    }
  }
}

// The scaled norm y = srmsnorm(x) * scale: the forward is the plain norm times scale with the same
// rstd, and the backward's dx (overwritten or accumulated) is the gradient of sum(y * w), plus
// (pull / 2) ||y - t||^2 for a target t (a strided view) where the backward is given one.
TEST(SrmsnormCpu, ScaledGradCheckDouble) {
  const double scale = 0.2973017787506803;  // 128^-1/4, Transformer-VQ's
  for (int64_t c : {3, 130}) {
    for (bool accumulate : {false, true}) {
      for (double pull : {0.0, 0.7}) {
        const int64_t n = 4;
        SrmsnormProblem p(n, c);
        OwnedTensor tb = test::random_tensor({n, c + kPad}, DType::F64, 11, -0.5, 0.5);
        const Tensor t = pull > 0 ? tb.t.narrow(1, 3, c) : Tensor();
        OwnedTensor y(DType::F64, Device::CPU, {n, c}), rstd(DType::F64, Device::CPU, {n});
        OwnedTensor plain(DType::F64, Device::CPU, {n, c}), rstd0(DType::F64, Device::CPU, {n});
        srmsnorm_scaled_fwd(Ctx{}, p.x(), y, rstd, kEps, scale);
        srmsnorm_fwd(Ctx{}, p.x(), plain, rstd0, kEps);
        const std::vector<double> yv = to_doubles(y), pv = to_doubles(plain);
        for (size_t i = 0; i < yv.size(); ++i) ASSERT_NEAR(yv[i], pv[i] * scale, 1e-12);
        EXPECT_EQ(to_doubles(rstd), to_doubles(rstd0));
        OwnedTensor dx = test::random_tensor({n, c}, DType::F64, 9);
        const std::vector<double> dx0 = to_doubles(dx);
        if (!accumulate) test::poison(dx);
        srmsnorm_scaled_bwd(Ctx{}, p.x(), rstd, p.u, dx, scale, accumulate, t, pull);
        std::vector<double> g = to_doubles(dx);
        if (accumulate)
          for (size_t i = 0; i < g.size(); ++i) g[i] -= dx0[i];
        ASSERT_TRUE(test::all_finite(g));
        // Central differences over the view's columns of x's buffer.
        std::vector<double> gb(static_cast<size_t>(n * (c + kPad)), 0.0);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < c; ++j)
            gb[static_cast<size_t>(r * (c + kPad) + 2 + j)] = g[static_cast<size_t>(r * c + j)];
        const std::vector<double> tv = pull > 0 ? test::view_values(t) : std::vector<double>();
        auto loss = [&] {
          OwnedTensor yy(DType::F64, Device::CPU, {n, c}), rr(DType::F64, Device::CPU, {n});
          srmsnorm_scaled_fwd(Ctx{}, p.x(), yy, rr, kEps, scale);
          const std::vector<double> a = to_doubles(yy), b = to_doubles(p.u);
          double l = 0;
          for (size_t i = 0; i < a.size(); ++i)
            l += a[i] * b[i] + (pull > 0 ? 0.5 * pull * (a[i] - tv[i]) * (a[i] - tv[i]) : 0);
          return l;
        };
        EXPECT_LT(test::check_grad(loss, p.xb->data<double>(), gb.data(), gb.size(), 256), 1e-6)
            << "C " << c << " accumulate " << accumulate << " pull " << pull;
      }
    }
  }
}

// The gated norm y = srmsnorm(x) * u: the forward is the plain norm times u, and the backward's dx
// and du are the gradients of sum(y * w) for a fixed random w (x, u, dx, du strided views).
TEST(SrmsnormCpu, GateGradCheckDouble) {
  for (int64_t c : {3, 37, 130}) {
    const int64_t n = 4, w = c + kPad;
    SrmsnormProblem p(n, c);  // x, and p.u as the loss's weights w
    OwnedTensor ub = test::random_tensor({n, w}, DType::F64, 21, -1.5, 1.5);
    const Tensor u = ub.t.narrow(1, 1, c);
    auto gated = [&](const Tensor& y, const Tensor& rstd) { srmsnorm_gate_fwd(Ctx{}, p.x(), u, y, rstd, kEps); };
    OwnedTensor y(DType::F64, Device::CPU, {n, c}), rstd(DType::F64, Device::CPU, {n});
    OwnedTensor plain(DType::F64, Device::CPU, {n, c}), rstd0(DType::F64, Device::CPU, {n});
    gated(y, rstd);
    srmsnorm_fwd(Ctx{}, p.x(), plain, rstd0, kEps);
    const std::vector<double> uv = test::view_values(u), yv = to_doubles(y), pv = to_doubles(plain);
    for (size_t i = 0; i < yv.size(); ++i) ASSERT_NEAR(yv[i], pv[i] * uv[i], 1e-12);
    EXPECT_EQ(to_doubles(rstd), to_doubles(rstd0));

    OwnedTensor dxb(DType::F64, Device::CPU, {n, w}), dub(DType::F64, Device::CPU, {n, w});
    test::poison(dxb);
    test::poison(dub);
    srmsnorm_gate_bwd(Ctx{}, p.x(), u, rstd, p.u, dxb.t.narrow(1, 2, c), dub.t.narrow(1, 1, c));
    // Analytic gradients over the whole buffers (zero outside the views, which stay NaN).
    auto whole = [&](const OwnedTensor& b, int64_t first) {
      std::vector<double> g = to_doubles(b);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < w; ++j) {
          double& v = g[static_cast<size_t>(r * w + j)];
          if (j < first || j >= first + c) {
            EXPECT_TRUE(std::isnan(v)) << "written outside the view, column " << j;
            v = 0;
          }
        }
      EXPECT_TRUE(test::all_finite(g));
      return g;
    };
    const std::vector<double> gx = whole(dxb, 2), gu = whole(dub, 1);
    auto loss = [&] {
      OwnedTensor yy(DType::F64, Device::CPU, {n, c}), rr(DType::F64, Device::CPU, {n});
      gated(yy, rr);
      const std::vector<double> a = to_doubles(yy), b = to_doubles(p.u);
      double l = 0;
      for (size_t i = 0; i < a.size(); ++i) l += a[i] * b[i];
      return l;
    };
    EXPECT_LT(test::check_grad(loss, p.xb->data<double>(), gx.data(), gx.size(), 256), 1e-6) << "dx, C " << c;
    EXPECT_LT(test::check_grad(loss, ub->data<double>(), gu.data(), gu.size(), 256), 1e-6) << "du, C " << c;
  }
}

}  // namespace
}  // namespace linac::test_srmsnorm
