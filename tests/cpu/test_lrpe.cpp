// LRPE-d CPU reference: forward against the formula, backward (dx, accumulated dtheta) against
// central differences on q/k slices of a fused buffer, near the start and at far positions;
// with document bounds, positions restart at every document; each row at its own position
// (lrpe_fwd_at, decoding) equals the row alone at that pos0, bit for bit.
#include <algorithm>
#include <cmath>

#include "document_checks.h"
#include "lrpe/lrpe.h"
#include "test_util.h"

namespace linac::test_lrpe {
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

// Documents: positions restart at each document, so a packed window gives y and dx of every
// document rotated alone from position 0, and dtheta their sum (up to its summation order).
void check_documents_alone(DType dt, double tol) {
  const std::vector<std::vector<int64_t>> lengths = {{1, 6, 4, 9}, {20}, {3, 1, 1, 15}};
  const test::PackedWindow w = test::packed_window(lengths, 16, 4);
  const int64_t B = 3, T = 20, H = 2, D = 5;
  const DocBounds docs{w.docs->data<int32_t>(), w.docs->data<int32_t>() + B * T};
  const OwnedTensor xb = test::random_tensor({B, T, 2, H, D}, dt, 1, -2, 2);
  const OwnedTensor theta = test::random_tensor({H, D}, dt, 2, 0.01, 1.0);
  const OwnedTensor dy = test::random_tensor({B, T, H, 2 * D}, dt, 3);
  const Tensor x = xb.t.select(2, 1);
  struct Out {
    OwnedTensor y, dx, dtheta;
  };
  auto fresh = [&] {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, H, 2 * D}), OwnedTensor(dt, Device::CPU, {B, T, H, D}),
          OwnedTensor(dt, Device::CPU, {H, D})};
    test::poison(r.y);
    test::poison(r.dx);
    zero_tensor(r.dtheta);
    return r;
  };
  Out packed = fresh(), alone = fresh();
  lrpe_fwd(Ctx{}, x, theta, packed.y, 0, docs);
  lrpe_bwd(Ctx{}, x, theta, dy, packed.dx, packed.dtheta, 0, docs);
  for (int64_t b = 0; b < B; ++b) {
    int64_t s = 0;
    for (int64_t n : lengths[static_cast<size_t>(b)]) {
      auto seg = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(1, s, n); };
      lrpe_fwd(Ctx{}, seg(x), theta, seg(alone.y), 0);
      lrpe_bwd(Ctx{}, seg(x), theta, seg(dy), seg(alone.dx), alone.dtheta, 0);
      s += n;
    }
  }
  EXPECT_EQ(test::max_abs_diff(to_doubles(packed.y), to_doubles(alone.y)), 0.0) << "y";
  EXPECT_EQ(test::max_abs_diff(to_doubles(packed.dx), to_doubles(alone.dx)), 0.0) << "dx";
  EXPECT_LT(test::rel_error(packed.dtheta, alone.dtheta), tol) << "dtheta";
  // Without bounds the later documents sit at other positions.
  Out stream = fresh();
  lrpe_fwd(Ctx{}, x, theta, stream.y, 0);
  EXPECT_GT(test::rel_error(stream.y, alone.y), 0.1);
}

TEST(LrpeCpu, RowPositionsEqualEachRowAtItsPos0) {
  for (DType dt : {DType::F64, DType::F32}) {
    LrpeProblem p(4, 2, 3, 6, 0);
    const OwnedTensor x = to(p.xb, Device::CPU, dt), theta = to(p.theta, Device::CPU, dt);
    const std::vector<int32_t> pos = {0, 5, 4093, 17};
    OwnedTensor positions(DType::I32, Device::CPU, {4});
    std::copy(pos.begin(), pos.end(), positions->data<int32_t>());
    OwnedTensor y(dt, Device::CPU, {4, 2, 3, 12}), y1(dt, Device::CPU, {1, 2, 3, 12});
    test::poison(y);
    lrpe_fwd_at(Ctx{}, x->select(2, 1), theta, y, positions);
    for (int64_t b = 0; b < 4; ++b) {
      lrpe_fwd(Ctx{}, x->select(2, 1).narrow(0, b, 1), theta, y1, pos[static_cast<size_t>(b)]);
      EXPECT_EQ(test::view_values(y->narrow(0, b, 1)), to_doubles(y1)) << "row " << b;
    }
  }
  LrpeProblem p(2, 1, 1, 4, 0);
  OwnedTensor y(DType::F64, Device::CPU, {2, 1, 1, 8}), wrong(DType::I32, Device::CPU, {3});
  EXPECT_THROW(lrpe_fwd_at(Ctx{}, p.x(), p.theta, y, wrong), Error);
}

TEST(LrpeCpu, DocumentPositionsRestart) {
  check_documents_alone(DType::F64, 1e-13);
  check_documents_alone(DType::F32, 1e-5);
}

}  // namespace
}  // namespace linac::test_lrpe
