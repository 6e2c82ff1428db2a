// SwiGLU CUDA vs the CPU reference (double), f32 and bf16, scalar (F = 37) and vector (F = 256)
// paths.
#include "swiglu/swiglu.h"
#include "test_util.h"

namespace linac {
namespace {

void run_parity(DType h_dt, DType a_dt, DType g_dt, int64_t f, double tol) {
  GpuContext gctx;
  const int64_t n = 300;
  OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 1, -6, 6);
  OwnedTensor da = test::random_tensor({n, f}, DType::F64, 2);
  OwnedTensor hg = to(h, Device::CUDA, h_dt), dag = to(da, Device::CUDA, g_dt);
  OwnedTensor hr = to(hg, Device::CPU, DType::F64), dar = to(dag, Device::CPU, DType::F64);
  OwnedTensor ag(a_dt, Device::CUDA, {n, f}), dhg(g_dt, Device::CUDA, {n, 2 * f});
  test::poison(ag);
  test::poison(dhg);
  swiglu_fwd(gctx.ctx(), hg, ag);
  swiglu_bwd(gctx.ctx(), hg, dag, dhg);
  gctx.synchronize();
  OwnedTensor a(DType::F64, Device::CPU, {n, f}), dh(DType::F64, Device::CPU, {n, 2 * f});
  swiglu_fwd(Ctx{}, hr, a);
  swiglu_bwd(Ctx{}, hr, dar, dh);
  EXPECT_LT(test::rel_error(ag, a), tol) << "F " << f;
  EXPECT_LT(test::rel_error(dhg, dh), tol) << "F " << f;
}

TEST(SwigluGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t f : {37, 256}) run_parity(DType::F32, DType::F32, DType::F32, f, 1e-5);
}

TEST(SwigluGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t f : {37, 256}) run_parity(DType::BF16, DType::BF16, DType::BF16, f, 1e-2);
}

TEST(SwigluGpu, ParityBf16InputF32Outputs) {
  LINAC_SKIP_WITHOUT_GPU();
  // Inputs are the same rounded values on both sides and outputs stay f32: f32 tolerance.
  for (int64_t f : {37, 256}) run_parity(DType::BF16, DType::F32, DType::F32, f, 1e-5);
}

}  // namespace
}  // namespace linac
