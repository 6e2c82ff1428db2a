// LRPE-d CUDA vs the CPU reference, f32 and bf16: x and dx are slices of a fused
// [B, T, 2, H, D] buffer, dy a slice of a fused [B, T, 2, H, 2D] one. Near the start the
// reference runs in double; at far positions (t ~ 4096+) it runs in f32, whose angles are
// rounded exactly as the GPU's (lrpe.h), so any other difference shows. dtheta accumulates
// and is reduced deterministically. Decoding's rows each at their own position (lrpe_fwd_at).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lrpe/lrpe.h"
#include "test_util.h"

namespace linac::test_lrpe_gpu {
namespace {

struct Shape {
  int64_t b, t, h, d, pos0;
};

void run_parity(DType dt, DType ref_dt, const Shape& s) {
  SCOPED_TRACE("B " + std::to_string(s.b) + " T " + std::to_string(s.t) + " H " + std::to_string(s.h) + " D " +
               std::to_string(s.d) + " pos0 " + std::to_string(s.pos0));
  const double tol = dt == DType::BF16 ? 1e-2 : 1e-5;
  GpuContext gctx;
  OwnedTensor xg = to(test::random_tensor({s.b, s.t, 2, s.h, s.d}, DType::F64, 1, -2, 2), Device::CUDA, dt);
  OwnedTensor thg = to(test::random_tensor({s.h, s.d}, DType::F64, 2, 1e-4, 1.0), Device::CUDA, DType::F32);
  OwnedTensor dyg = to(test::random_tensor({s.b, s.t, 2, s.h, 2 * s.d}, DType::F64, 3), Device::CUDA, dt);
  OwnedTensor dthg = to(test::random_tensor({s.h, s.d}, DType::F64, 4), Device::CUDA, DType::F32);
  OwnedTensor yg(dt, Device::CUDA, {s.b, s.t, s.h, 2 * s.d}), dxg(dt, Device::CUDA, {s.b, s.t, 2, s.h, s.d});
  test::poison(yg);
  test::poison(dxg);
  // The reference sees the same rounded inputs and the same initial dtheta.
  OwnedTensor xr = to(xg, Device::CPU, ref_dt), thr = to(thg, Device::CPU, ref_dt);
  OwnedTensor dyr = to(dyg, Device::CPU, ref_dt), dthr = to(dthg, Device::CPU, ref_dt);
  lrpe_fwd(gctx.ctx(), xg->select(2, 1), thg, yg, s.pos0);
  lrpe_bwd(gctx.ctx(), xg->select(2, 1), thg, dyg->select(2, 0), dxg->select(2, 1), dthg, s.pos0);
  gctx.synchronize();

  OwnedTensor yr(ref_dt, Device::CPU, {s.b, s.t, s.h, 2 * s.d}), dxr(ref_dt, Device::CPU, {s.b, s.t, s.h, s.d});
  lrpe_fwd(Ctx{}, xr->select(2, 1), thr, yr, s.pos0);
  lrpe_bwd(Ctx{}, xr->select(2, 1), thr, dyr->select(2, 0), dxr, dthr, s.pos0);
  EXPECT_LT(test::rel_error(yg, yr), tol);
  EXPECT_LT(test::rel_error(test::view_values(dxg->select(2, 1)), to_doubles(dxr)), tol);
  // dtheta is an f32 sum of f32 products of the same rounded inputs whatever the activation dtype.
  EXPECT_LT(test::rel_error(dthg, dthr), 1e-5);
  for (double v : test::view_values(dxg->select(2, 0))) ASSERT_TRUE(std::isnan(v)) << "dx written outside its slice";
}

TEST(LrpeGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::F64, {2, 77, 4, 128, 3});
  run_parity(DType::F32, DType::F64, {3, 13, 3, 20, 0});
}

TEST(LrpeGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, DType::F64, {2, 77, 4, 128, 3});
  run_parity(DType::BF16, DType::F64, {3, 13, 3, 20, 0});
}

TEST(LrpeGpu, ParityFarPositions) {
  LINAC_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    run_parity(dt, DType::F32, {2, 64, 4, 96, 4096});
    run_parity(dt, DType::F32, {1, 300, 2, 36, 130000});
    run_parity(dt, DType::F32, {3, 1, 4, 128, 5000});  // decoding: one token at its position
  }
}

TEST(LrpeGpu, RowPositionsParity) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t B = 5, H = 4, D = 64;
  const std::vector<int32_t> pos = {0, 1, 77, 4096, 130001};
  OwnedTensor positions(DType::I32, Device::CPU, {B});
  std::copy(pos.begin(), pos.end(), positions->data<int32_t>());
  const OwnedTensor pos_g = to(positions, Device::CUDA, DType::I32);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    OwnedTensor xg = to(test::random_tensor({B, 1, 2, H, D}, DType::F64, 5, -2, 2), Device::CUDA, dt);
    OwnedTensor thg = to(test::random_tensor({H, D}, DType::F64, 6, 1e-4, 1.0), Device::CUDA, DType::F32);
    OwnedTensor yg(dt, Device::CUDA, {B, 1, H, 2 * D});
    test::poison(yg);
    lrpe_fwd_at(gctx.ctx(), xg->select(2, 1), thg, yg, pos_g);
    gctx.synchronize();
    // The f32 reference rounds the angles as the GPU does (lrpe.h).
    OwnedTensor xr = to(xg, Device::CPU, DType::F32), thr = to(thg, Device::CPU, DType::F32);
    OwnedTensor yr(DType::F32, Device::CPU, {B, 1, H, 2 * D});
    lrpe_fwd_at(Ctx{}, xr->select(2, 1), thr, yr, positions);
    EXPECT_LT(test::rel_error(yg, yr), dt == DType::BF16 ? 1e-2 : 1e-5);
  }
}

TEST(LrpeGpu, DthetaIsDeterministic) {
  LINAC_SKIP_WITHOUT_GPU();
  // 1200 rows: every one of the 256 slabs holds several, so the reduction has real structure.
  const int64_t b = 4, t = 300, h = 4, d = 64, pos0 = 100;
  GpuContext gctx;
  OwnedTensor xg = to(test::random_tensor({b, t, h, d}, DType::F64, 1, -2, 2), Device::CUDA, DType::BF16);
  OwnedTensor thg = to(test::random_tensor({h, d}, DType::F64, 2, 1e-4, 1.0), Device::CUDA, DType::F32);
  OwnedTensor dyg = to(test::random_tensor({b, t, h, 2 * d}, DType::F64, 3), Device::CUDA, DType::BF16);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    OwnedTensor dxg(DType::BF16, Device::CUDA, {b, t, h, d}), dthg(DType::F32, Device::CUDA, {h, d});
    zero_tensor(dthg);
    lrpe_bwd(gctx.ctx(), xg, thg, dyg, dxg, dthg, pos0);
    gctx.synchronize();
    const std::vector<double> got = to_doubles(dthg);
    ASSERT_TRUE(test::all_finite(got));
    if (run == 0)
      first = got;
    else
      ASSERT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(double)), 0) << "run " << run;
  }
}

}  // namespace
}  // namespace linac::test_lrpe_gpu
