// Fused AdamW CUDA vs the CPU reference (double) over three steps; vector and scalar (odd
// size, misaligned views) paths; the bf16 compute copy is the RNE rounding of the new param.
#include <vector>

#include "adamw/adamw.h"
#include "test_util.h"

namespace linac::test_adamw_gpu {
namespace {

// param, grad, m, v (and the copy) live at element `offset` of larger buffers, so offset 1
// takes the scalar path.
void run_parity(int64_t n, int64_t offset, bool with_copy) {
  GpuContext gctx;
  OwnedTensor bp(DType::F32, Device::CUDA, {n + offset}), bg(DType::F32, Device::CUDA, {n + offset});
  OwnedTensor bm(DType::F32, Device::CUDA, {n + offset}), bv(DType::F32, Device::CUDA, {n + offset});
  OwnedTensor bc(DType::BF16, Device::CUDA, {with_copy ? n + offset : 0});
  const Tensor p = bp.t.narrow(0, offset, n), g = bg.t.narrow(0, offset, n);
  const Tensor m = bm.t.narrow(0, offset, n), v = bv.t.narrow(0, offset, n);
  const Tensor copy = with_copy ? bc.t.narrow(0, offset, n) : Tensor{};
  // The CPU starts from the f32 values the GPU holds.
  OwnedTensor p32 = test::random_tensor({n}, DType::F32, 1), m32 = test::random_tensor({n}, DType::F32, 2, -0.1, 0.1);
  OwnedTensor v32 = test::random_tensor({n}, DType::F32, 3, 0, 0.05);
  copy_tensor(p, p32);
  copy_tensor(m, m32);
  copy_tensor(v, v32);
  OwnedTensor pr = to(p32, Device::CPU, DType::F64), mr = to(m32, Device::CPU, DType::F64);
  OwnedTensor vr = to(v32, Device::CPU, DType::F64);
  if (with_copy) test::poison(copy);
  AdamWArgs a{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.8f};
  for (int64_t step = 1; step <= 3; ++step) {
    a.step = step;
    OwnedTensor g32 = test::random_tensor({n}, DType::F32, 10 + static_cast<uint64_t>(step), -2, 2);
    copy_tensor(g, g32);
    adamw_step(gctx.ctx(), p, g, m, v, copy, a);
    gctx.synchronize();  // before the next step's gradient overwrites g
    OwnedTensor gr = to(g32, Device::CPU, DType::F64);
    adamw_step(Ctx{}, pr, gr, mr, vr, Tensor{}, a);
  }
  EXPECT_LT(test::rel_error(p, pr), 1e-6);
  EXPECT_LT(test::rel_error(m, mr), 1e-6);
  EXPECT_LT(test::rel_error(v, vr), 1e-6);
  if (with_copy) {
    const std::vector<double> pv = to_doubles(p), cv = to_doubles(copy);
    for (size_t i = 0; i < pv.size(); ++i)
      ASSERT_EQ(cv[i], round_bf16(static_cast<float>(pv[i]))) << "element " << i;
  }
}

TEST(AdamwGpu, ParityVectorPath) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(1000003, 0, true);
  run_parity(1000003, 0, false);
}

TEST(AdamwGpu, ParityMisalignedScalarPath) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(1000003, 1, true);
  run_parity(7, 1, false);
}

}  // namespace
}  // namespace linac::test_adamw_gpu
