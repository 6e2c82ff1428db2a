// Log-space gate: values against the formula (with and without the clamp), extreme inputs stay
// finite, and the backward against central differences in double (z away from the clamp edge).
// The low-rank gate (z = u W^T inside): the same values as the GEMM followed by the gate, and its
// dz and bias gradient against central differences through u and b.
#include <cmath>

#include "loggate/loggate.h"
#include "loggate/loggate_lowrank.h"
#include "matmul/matmul.h"
#include "test_util.h"

namespace linac::test_loggate {
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

TEST(LogGateLowRankCpu, IsTheGemmThenTheGate) {
  const int64_t N = 11, D = 13, R = 5;
  // u strided, as the mixer's view into its projection buffer.
  OwnedTensor wide = test::random_tensor({N, R + 4}, DType::F64, 6, -3, 3);
  const Tensor u = Tensor(wide).narrow(1, 2, R);
  OwnedTensor w = test::random_tensor({D, R}, DType::F64, 7, -2, 2), b = test::random_tensor({D}, DType::F64, 8);
  OwnedTensor dg = test::random_tensor({N, D}, DType::F64, 9), db0 = test::random_tensor({D}, DType::F64, 10);
  for (double clamp : {0.0, -0.05}) {
    const LogGateOpts o{16.0, clamp};
    OwnedTensor g(DType::F64, Device::CPU, {N, D}), dz(DType::F64, Device::CPU, {N, D}),
        db = to(db0, Device::CPU, DType::F64);
    loggate_lowrank_fwd(Ctx{}, u, w, b, g, o);
    loggate_lowrank_bwd(Ctx{}, u, w, b, dg, dz, db, o);
    OwnedTensor z(DType::F64, Device::CPU, {N, D}), g_ref(DType::F64, Device::CPU, {N, D}),
        dz_ref(DType::F64, Device::CPU, {N, D});
    matmul(Ctx{}, u, false, w, true, z);
    loggate_fwd(Ctx{}, z, b, g_ref, o);
    loggate_bwd(Ctx{}, z, b, dg, dz_ref, o);
    EXPECT_LT(test::rel_error(g, g_ref), 1e-14);
    EXPECT_LT(test::rel_error(dz, dz_ref), 1e-14);
    int clamped = 0;
    for (int64_t j = 0; j < D; ++j) {
      double s = db0->data<double>()[j];
      for (int64_t i = 0; i < N; ++i) s += dz_ref->data<double>()[i * D + j];
      EXPECT_NEAR(db->data<double>()[j], s, 1e-12) << j;
    }
    for (int64_t i = 0; i < N * D; ++i) clamped += dz->data<double>()[i] == 0.0;
    if (clamp < 0) EXPECT_GT(clamped, 0);  // the clamp's branch is exercised
  }
}

TEST(LogGateLowRankCpu, GradCheckDouble) {
  const int64_t N = 5, D = 7, R = 3;
  OwnedTensor u = test::random_tensor({N, R}, DType::F64, 11, -3, 3), w = test::random_tensor({D, R}, DType::F64, 12);
  OwnedTensor b = test::random_tensor({D}, DType::F64, 13), dg = test::random_tensor({N, D}, DType::F64, 14);
  const LogGateOpts o{4.0, 0.0};
  OwnedTensor dz(DType::F64, Device::CPU, {N, D}), db(DType::F64, Device::CPU, {D});
  zero_tensor(db);
  loggate_lowrank_bwd(Ctx{}, u, w, b, dg, dz, db, o);
  OwnedTensor g(DType::F64, Device::CPU, {N, D});
  auto loss = [&] {
    loggate_lowrank_fwd(Ctx{}, u, w, b, g, o);
    double l = 0;
    for (int64_t i = 0; i < N * D; ++i) l += g->data<double>()[i] * dg->data<double>()[i];
    return l;
  };
  // d loss / d u = dz W (what the caller's GEMM makes of dz), d loss / d b = db.
  std::vector<double> du(static_cast<size_t>(N * R), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < D; ++j)
        du[static_cast<size_t>(i * R + r)] += dz->data<double>()[i * D + j] * w->data<double>()[j * R + r];
  EXPECT_LT(test::check_grad(loss, u->data<double>(), du.data(), du.size()), 1e-6);
  EXPECT_LT(test::check_grad(loss, b->data<double>(), db->data<double>(), static_cast<size_t>(D)), 1e-6);
}

}  // namespace
}  // namespace linac::test_loggate
