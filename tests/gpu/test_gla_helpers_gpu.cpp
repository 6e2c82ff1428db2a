// The GLA helper families on the GPU vs their CPU references (double) on the same rounded inputs:
// the log-space gate (f32 z / bf16 z, with and without the clamp) and the per-head norm + swish
// gate (f32 and bf16, strided r/dr views); each with 4-aligned rows (the kernels' groups of four)
// and without (their one-element path); the norm gate also with heads of 256, 384 and 512 values
// (its kernels that keep a head in registers). The low-rank gate (u W^T inside the gate) against its
// CPU reference on the same bf16 u and W, at the ranks and widths its kernels take, with a row
// count that leaves the last CTA part full, a strided u, and the bias gradient accumulated.
#include <tuple>

#include "loggate/loggate.h"
#include "loggate/loggate_lowrank.h"
#include "norm_gate/norm_gate.h"
#include "test_util.h"

namespace linac::test_gla_helpers_gpu {
namespace {

TEST(LogGateGpu, MatchesCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  const int64_t N = 333;
  for (int64_t D : {96, 97})
    for (DType zdt : {DType::F32, DType::BF16})
      for (double clamp : {0.0, -3.0}) {
        SCOPED_TRACE(std::string(dtype_name(zdt)) + " clamp " + std::to_string(clamp) + " D " + std::to_string(D));
        const LogGateOpts o{16.0, clamp};
        OwnedTensor z = to(test::random_tensor({N, D}, DType::F64, 1, -70, 10), Device::CUDA, zdt);
        OwnedTensor b = to(test::random_tensor({D}, DType::F64, 2), Device::CUDA, DType::F32);
        OwnedTensor dg = to(test::random_tensor({N, D}, DType::F64, 3), Device::CUDA, DType::F32);
        OwnedTensor gg(DType::F32, Device::CUDA, {N, D}), dz(zdt, Device::CUDA, {N, D});
        test::poison(gg);
        test::poison(dz);
        loggate_fwd(g.ctx(), z, b, gg, o);
        loggate_bwd(g.ctx(), z, b, dg, dz, o);
        gpu_synchronize();
        OwnedTensor zc = to(z, Device::CPU, DType::F64), bc = to(b, Device::CPU, DType::F64),
                    dgc = to(dg, Device::CPU, DType::F64);
        OwnedTensor gc(DType::F64, Device::CPU, {N, D}), dzc(DType::F64, Device::CPU, {N, D});
        loggate_fwd(Ctx{}, zc, bc, gc, o);
        loggate_bwd(Ctx{}, zc, bc, dgc, dzc, o);
        EXPECT_LT(test::rel_error(gg, gc), 1e-5);  // the GPU's approximate exp and log (loggate_math.h)
        EXPECT_LT(test::rel_error(dz, dzc), zdt == DType::F32 ? 1e-6 : 1e-2);
      }
}

TEST(LogGateLowRankGpu, MatchesCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gpu;
  const int64_t N = 333;
  for (int64_t R : {8, 16, 32})
    for (int64_t D : {512, 1024, 4, 100})
      for (double clamp : {0.0, -0.02}) {
        SCOPED_TRACE("R " + std::to_string(R) + " D " + std::to_string(D) + " clamp " + std::to_string(clamp));
        ASSERT_TRUE(loggate_lowrank_gpu_ok(gpu.ctx(), D, R, DType::BF16));
        const LogGateOpts o{16.0, clamp};
        // u as columns [8, 8 + R) of a wider bf16 buffer; every input rounded as the GPU sees it.
        OwnedTensor wide = to(test::random_tensor({N, R + 24}, DType::F64, 1, -2, 2), Device::CUDA, DType::BF16);
        const Tensor u = Tensor(wide).narrow(1, 8, R);
        OwnedTensor w = to(test::random_tensor({D, R}, DType::F64, 2, -0.5, 0.5), Device::CUDA, DType::BF16);
        OwnedTensor b = to(test::random_tensor({D}, DType::F64, 3), Device::CUDA, DType::F32);
        OwnedTensor dg = to(test::random_tensor({N, D}, DType::F64, 4), Device::CUDA, DType::F32);
        OwnedTensor db0 = to(test::random_tensor({D}, DType::F64, 5), Device::CUDA, DType::F32);
        OwnedTensor g(DType::F32, Device::CUDA, {N, D}), dz(DType::BF16, Device::CUDA, {N, D});
        OwnedTensor db = to(db0, Device::CUDA, DType::F32);
        test::poison(g);
        test::poison(dz);
        loggate_lowrank_fwd(gpu.ctx(), u, w, b, g, o);
        loggate_lowrank_bwd(gpu.ctx(), u, w, b, dg, dz, db, o);
        gpu_synchronize();
        OwnedTensor wide_c = to(wide, Device::CPU, DType::F64);
        const Tensor uc = Tensor(wide_c).narrow(1, 8, R);
        OwnedTensor wc = to(w, Device::CPU, DType::F64), bc = to(b, Device::CPU, DType::F64),
                    dgc = to(dg, Device::CPU, DType::F64);
        OwnedTensor gc(DType::F64, Device::CPU, {N, D}), dzc(DType::F64, Device::CPU, {N, D});
        OwnedTensor dbc = to(db0, Device::CPU, DType::F64);
        loggate_lowrank_fwd(Ctx{}, uc, wc, bc, gc, o);
        loggate_lowrank_bwd(Ctx{}, uc, wc, bc, dgc, dzc, dbc, o);
        EXPECT_LT(test::rel_error(g, gc), 1e-5);
        EXPECT_LT(test::rel_error(dz, dzc), 1e-2);
        EXPECT_LT(test::rel_error(db, dbc), 1e-5);
        // Reruns give the same bits (the bias sums go through partials in a fixed order).
        OwnedTensor g2(DType::F32, Device::CUDA, {N, D}), dz2(DType::BF16, Device::CUDA, {N, D});
        OwnedTensor db2 = to(db0, Device::CUDA, DType::F32);
        loggate_lowrank_fwd(gpu.ctx(), u, w, b, g2, o);
        loggate_lowrank_bwd(gpu.ctx(), u, w, b, dg, dz2, db2, o);
        gpu_synchronize();
        EXPECT_EQ(test::rel_error(g, g2), 0.0);
        EXPECT_EQ(test::rel_error(dz, dz2), 0.0);
        EXPECT_EQ(test::rel_error(db, db2), 0.0);
      }
  // Shapes the kernels do not take (the mixer then composes a GEMM and loggate).
  EXPECT_FALSE(loggate_lowrank_gpu_ok(gpu.ctx(), 512, 24, DType::BF16));
  EXPECT_FALSE(loggate_lowrank_gpu_ok(gpu.ctx(), 1028, 16, DType::BF16));
  EXPECT_FALSE(loggate_lowrank_gpu_ok(gpu.ctx(), 98, 16, DType::BF16));
  EXPECT_FALSE(loggate_lowrank_gpu_ok(gpu.ctx(), 512, 16, DType::F32));
  EXPECT_TRUE(loggate_lowrank_gpu_ok(Ctx{}, 98, 24, DType::F64));
}

// Head dims 256, 384 and 512 (GLA 1.3B's) take the register kernels, 80 the streaming kernel in
// groups of four, 78 one value at a time; H = 3 and 6 leave (row, head) items of one row in two
// blocks of 8 warps.
TEST(NormGateGpu, MatchesCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{301, 4, 80},  {301, 4, 78},   {301, 4, 256},
                                                          {301, 4, 384}, {5000, 3, 256}, {1001, 6, 512}};
  for (const auto& [N, H, D] : shapes)
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N " + std::to_string(N) + " H " + std::to_string(H) + " D " +
                   std::to_string(D));
      const int64_t W = H * D;
      OwnedTensor x = to(test::random_tensor({N, W}, DType::F64, 1, -1, 2), Device::CUDA, dt);
      OwnedTensor rw = to(test::random_tensor({N, W + 8}, DType::F64, 2, -4, 4), Device::CUDA, dt);
      OwnedTensor br = to(test::random_tensor({W}, DType::F64, 3), Device::CUDA, DType::F32);
      OwnedTensor dy = to(test::random_tensor({N, W}, DType::F64, 4), Device::CUDA, dt);
      OwnedTensor y(dt, Device::CUDA, {N, W}), dx(dt, Device::CUDA, {N, W}), drw(dt, Device::CUDA, {N, W + 8});
      OwnedTensor mean(DType::F32, Device::CUDA, {N, H}), rstd(DType::F32, Device::CUDA, {N, H});
      for (const Tensor* t : {&y.t, &dx.t, &drw.t}) test::poison(*t);
      const Tensor r = Tensor(rw).narrow(1, 8, W), dr = Tensor(drw).narrow(1, 0, W);
      norm_gate_fwd(g.ctx(), x, r, br, y, mean, rstd, 1e-5);
      norm_gate_bwd(g.ctx(), x, r, br, mean, rstd, dy, dx, dr);
      gpu_synchronize();
      OwnedTensor xc = to(x, Device::CPU, DType::F64), rwc = to(rw, Device::CPU, DType::F64);
      OwnedTensor brc = to(br, Device::CPU, DType::F64), dyc = to(dy, Device::CPU, DType::F64);
      OwnedTensor yc(DType::F64, Device::CPU, {N, W}), dxc(DType::F64, Device::CPU, {N, W}),
          drc(DType::F64, Device::CPU, {N, W});
      OwnedTensor mc(DType::F64, Device::CPU, {N, H}), rc(DType::F64, Device::CPU, {N, H});
      const Tensor rcv = Tensor(rwc).narrow(1, 8, W);
      norm_gate_fwd(Ctx{}, xc, rcv, brc, yc, mc, rc, 1e-5);
      norm_gate_bwd(Ctx{}, xc, rcv, brc, mc, rc, dyc, dxc, drc);
      const double tol = dt == DType::F32 ? 1e-5 : 1e-2;
      EXPECT_LT(test::rel_error(y, yc), tol);
      EXPECT_LT(test::rel_error(mean, mc), 1e-5);
      EXPECT_LT(test::rel_error(rstd, rc), 1e-5);
      EXPECT_LT(test::rel_error(dx, dxc), tol);
      std::vector<double> drg = to_doubles(drw), drv;
      for (int64_t n = 0; n < N; ++n) drv.insert(drv.end(), drg.begin() + n * (W + 8), drg.begin() + n * (W + 8) + W);
      EXPECT_LT(test::rel_error(drv, to_doubles(drc)), tol);
    }
}

}  // namespace
}  // namespace linac::test_gla_helpers_gpu
