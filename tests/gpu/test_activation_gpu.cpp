// SiLU CUDA vs the CPU reference (double), f32 and bf16, on column ranges of fused buffers:
// misaligned ranges (the one-column path) and 4-aligned ones (the four-column path), narrow
// (many rows per CTA) and wide (several passes per row).
#include <cmath>

#include "activation/activation.h"
#include "test_util.h"

namespace linac::test_activation_gpu {
namespace {

// x is columns [off, off + C) of a fused [N, C + 2 off] projection; y and dx are column ranges
// of their own padded buffers (dx also at off); dy is contiguous. off = 5: no row is 4-aligned;
// off = 8 with C a multiple of 4: every row is.
void run_parity(DType dt, int64_t c, int64_t off, double tol) {
  SCOPED_TRACE("C " + std::to_string(c) + " offset " + std::to_string(off));
  const int64_t n = 300;
  GpuContext gctx;
  OwnedTensor xg = to(test::random_tensor({n, c + 2 * off}, DType::F64, 1, -8, 8), Device::CUDA, dt);
  OwnedTensor dyg = to(test::random_tensor({n, c}, DType::F64, 2), Device::CUDA, dt);
  OwnedTensor yg(dt, Device::CUDA, {n, c + 4}), dxg(dt, Device::CUDA, {n, c + off});
  test::poison(yg);
  test::poison(dxg);
  const Tensor x = xg->narrow(1, off, c), y = yg->narrow(1, 0, c), dx = dxg->narrow(1, off, c);
  silu_fwd(gctx.ctx(), x, y);
  silu_bwd(gctx.ctx(), x, dyg, dx);
  gctx.synchronize();

  OwnedTensor xr = to(xg, Device::CPU, DType::F64), dyr = to(dyg, Device::CPU, DType::F64);
  OwnedTensor yr(DType::F64, Device::CPU, {n, c}), dxr(DType::F64, Device::CPU, {n, c});
  silu_fwd(Ctx{}, xr->narrow(1, off, c), yr);
  silu_bwd(Ctx{}, xr->narrow(1, off, c), dyr, dxr);
  EXPECT_LT(test::rel_error(test::view_values(y), to_doubles(yr)), tol);
  EXPECT_LT(test::rel_error(test::view_values(dx), to_doubles(dxr)), tol);
  // Every element outside the views is still NaN.
  for (const OwnedTensor* buf : {&yg, &dxg}) {
    const std::vector<double> all = to_doubles(*buf);
    int64_t nan = 0;
    for (double v : all) nan += std::isnan(v) ? 1 : 0;
    EXPECT_EQ(nan, (*buf)->numel() - n * c) << "written outside the view";
  }
}

TEST(SiluGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t c : {37, 128, 1540}) run_parity(DType::F32, c, 5, 1e-5);
  for (int64_t c : {12, 128, 1540}) run_parity(DType::F32, c, 8, 1e-5);
}

TEST(SiluGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t c : {37, 128, 1540}) run_parity(DType::BF16, c, 5, 1e-2);
  for (int64_t c : {12, 128, 1540}) run_parity(DType::BF16, c, 8, 1e-2);
}

}  // namespace
}  // namespace linac::test_activation_gpu
