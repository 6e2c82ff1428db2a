// Gated linear unit CUDA vs the CPU reference (double), f32 and bf16, scalar (F = 37) and vector
// (F = 256) paths, SiLU (SwiGLU) and identity (SGLU) gates.
#include "swiglu/swiglu.h"
#include "test_util.h"

namespace linac::test_swiglu_gpu {
namespace {

void run_parity(DType h_dt, DType a_dt, DType g_dt, int64_t f, GluAct act, double tol) {
  SCOPED_TRACE(std::string(act == GluAct::Silu ? "SiLU" : "identity") + " gate, F " + std::to_string(f));
  GpuContext gctx;
  const int64_t n = 300;
  OwnedTensor h = test::random_tensor({n, 2 * f}, DType::F64, 1, -6, 6);
  OwnedTensor da = test::random_tensor({n, f}, DType::F64, 2);
  OwnedTensor hg = to(h, Device::CUDA, h_dt), dag = to(da, Device::CUDA, g_dt);
  OwnedTensor hr = to(hg, Device::CPU, DType::F64), dar = to(dag, Device::CPU, DType::F64);
  OwnedTensor ag(a_dt, Device::CUDA, {n, f}), dhg(g_dt, Device::CUDA, {n, 2 * f});
  test::poison(ag);
  test::poison(dhg);
  swiglu_fwd(gctx.ctx(), hg, ag, act);
  swiglu_bwd(gctx.ctx(), hg, dag, dhg, act);
  gctx.synchronize();
  OwnedTensor a(DType::F64, Device::CPU, {n, f}), dh(DType::F64, Device::CPU, {n, 2 * f});
  swiglu_fwd(Ctx{}, hr, a, act);
  swiglu_bwd(Ctx{}, hr, dar, dh, act);
  EXPECT_LT(test::rel_error(ag, a), tol);
  EXPECT_LT(test::rel_error(dhg, dh), tol);
}

void run_parity_all(DType h_dt, DType a_dt, DType g_dt, double tol) {
  for (GluAct act : {GluAct::Silu, GluAct::Identity})
    for (int64_t f : {37, 256}) run_parity(h_dt, a_dt, g_dt, f, act, tol);
}

TEST(SwigluGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(DType::F32, DType::F32, DType::F32, 1e-5);
}

TEST(SwigluGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(DType::BF16, DType::BF16, DType::BF16, 1e-2);
}

TEST(SwigluGpu, ParityBf16InputF32Outputs) {
  LINAC_SKIP_WITHOUT_GPU();
  // Inputs are the same rounded values on both sides and outputs stay f32: f32 tolerance.
  run_parity_all(DType::BF16, DType::F32, DType::F32, 1e-5);
}

}  // namespace
}  // namespace linac::test_swiglu_gpu
