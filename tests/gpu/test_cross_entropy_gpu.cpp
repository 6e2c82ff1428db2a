// Fused cross-entropy CUDA vs the CPU reference (double): f32/bf16, in place, ignored rows, the
// kernels that hold a row in registers (V = 32000, 8192, 256) - on a Hopper GPU both the one
// streaming rows through shared memory (several rows per block: N well above the grid; there
// also the bf16 rows of V = 50272, 50264 and 51200, packed two logits to a register) and, by
// LINAC_CROSS_ENTROPY_KERNELS=sm80, the one reading them from global memory - the two-pass one
// with groups of four (V = 40000, 50272, 50264: above what registers hold) and with single
// elements (V = 129).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cross_entropy/cross_entropy.h"
#include "test_util.h"

namespace linac::test_cross_entropy_gpu {
namespace {

// The kernel families every case runs through on this GPU (cross_entropy_gpu_kernel).
std::vector<const char*> families() {
  std::vector<const char*> f{"sm80"};
  if (LINAC_WITH_SM90A && gpu_compute_capability() == 90) f.insert(f.begin(), "auto");
  return f;
}

// Every seventh row ignored; the first and last vocabulary entries appear as targets.
OwnedTensor make_targets(int64_t n, int64_t v, int64_t& counted) {
  OwnedTensor t(DType::I32, Device::CPU, {n});
  Rng rng{5, 3, 0};
  counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = static_cast<int32_t>(rng.below(v));
    if (i == 1) id = 0;
    if (i == 2) id = static_cast<int32_t>(v - 1);
    if (i % 7 == 3) id = -1;
    counted += id >= 0;
    t->data<int32_t>()[i] = id;
  }
  return t;
}

void run_parity_once(DType l_dt, DType d_dt, bool in_place, int64_t n, int64_t v, double grad_tol) {
  GpuContext gctx;
  int64_t counted = 0;
  OwnedTensor targets = make_targets(n, v, counted);
  const float scale = 1.f / static_cast<float>(counted);
  OwnedTensor logits = test::random_tensor({n, v}, DType::F64, 1, -8, 8);
  OwnedTensor lg = to(logits, Device::CUDA, l_dt), tg = to(targets, Device::CUDA, DType::I32);
  OwnedTensor lr = to(lg, Device::CPU, DType::F64);
  OwnedTensor dl_own(d_dt, Device::CUDA, {in_place ? 0 : n, v});
  const Tensor dlg = in_place ? lg.t : dl_own.t;
  OwnedTensor lossg(DType::F32, Device::CUDA, {n});
  if (!in_place) test::poison(dlg);
  test::poison(lossg);
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, dlg, lossg, scale);
  gctx.synchronize();
  OwnedTensor dlr(DType::F64, Device::CPU, {n, v}), lossr(DType::F64, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, lr, targets, dlr, lossr, scale);
  EXPECT_LT(test::rel_error(dlg, dlr), grad_tol) << "V " << v;
  // Losses are f32 sums over the same rounded logits whatever the dtypes.
  EXPECT_LT(test::rel_error(lossg, lossr), 1e-5) << "V " << v;
  const std::vector<double> dl = to_doubles(dlg), loss = to_doubles(lossg);
  for (int64_t i = 3; i < n; i += 7) {
    EXPECT_EQ(loss[static_cast<size_t>(i)], 0.0);
    for (int64_t j = 0; j < v; ++j) ASSERT_EQ(dl[static_cast<size_t>(i * v + j)], 0.0) << "ignored row " << i;
  }
}

void run_parity(DType l_dt, DType d_dt, bool in_place, int64_t n, int64_t v, double grad_tol) {
  for (const char* family : families()) {
    SCOPED_TRACE(std::string("LINAC_CROSS_ENTROPY_KERNELS=") + family);
    test::ScopedEnv choice("LINAC_CROSS_ENTROPY_KERNELS", family);
    run_parity_once(l_dt, d_dt, in_place, n, v, grad_tol);
  }
}

// hits on the GPU equal the CPU's for the same rounded logits, ties included: rows of equal
// logits and rows whose maximum repeats before and after the target; the loss and gradient equal
// those of the call without hits.
void run_hits_parity_once(DType l_dt, int64_t n, int64_t v) {
  GpuContext gctx;
  int64_t counted = 0;
  OwnedTensor targets = make_targets(n, v, counted);
  OwnedTensor logits = test::random_tensor({n, v}, DType::F64, 4, -4, 4);
  double* x = logits->data<double>();
  const int32_t* t = targets->data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    double* row = x + i * v;
    if (t[i] < 0) continue;
    if (i % 5 == 0) row[t[i]] = 20;  // a clear hit
    if (i % 5 == 1) std::fill(row, row + v, 1.0);  // all equal: a hit only for target 0
    if (i % 5 == 2) row[t[i]] = 20, row[0] = 20;  // the max also at index 0
    if (i % 5 == 4) row[t[i]] = 20, row[v - 1] = 20;  // the max also at the last index
  }
  OwnedTensor lg = to(logits, Device::CUDA, l_dt), tg = to(targets, Device::CUDA, DType::I32);
  OwnedTensor lr = to(lg, Device::CPU, DType::F64);
  OwnedTensor dlg(DType::F32, Device::CUDA, {n, v}), lossg(DType::F32, Device::CUDA, {n}), hitg(DType::F32, Device::CUDA, {n});
  test::poison(hitg);
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, dlg, lossg, 1.f, hitg);
  gctx.synchronize();
  OwnedTensor dlr(DType::F64, Device::CPU, {n, v}), lossr(DType::F64, Device::CPU, {n}), hitr(DType::F64, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, lr, targets, dlr, lossr, 1.f, hitr);
  const std::vector<double> hg = to_doubles(hitg), hr = to_doubles(hitr);
  EXPECT_EQ(hg, hr) << "V " << v;
  double total = 0;
  for (double h : hr) total += h;
  EXPECT_GT(total, 0) << "no row was a hit: the check could not fail";
  EXPECT_LT(total, static_cast<double>(counted)) << "every row was a hit: the check could not fail";
  // The kernels that count hits keep the training kernels' loss and gradient, bit for bit.
  OwnedTensor dl_train(DType::F32, Device::CUDA, {n, v}), loss_train(DType::F32, Device::CUDA, {n});
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, dl_train, loss_train, 1.f);
  gctx.synchronize();
  EXPECT_EQ(to_doubles(loss_train), to_doubles(lossg)) << "V " << v;
  EXPECT_EQ(to_doubles(dl_train), to_doubles(dlg)) << "V " << v;
}

void run_hits_parity(DType l_dt, int64_t n, int64_t v) {
  for (const char* family : families()) {
    SCOPED_TRACE(std::string("LINAC_CROSS_ENTROPY_KERNELS=") + family);
    test::ScopedEnv choice("LINAC_CROSS_ENTROPY_KERNELS", family);
    run_hits_parity_once(l_dt, n, v);
  }
}

TEST(CrossEntropyGpu, HitsMatchCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  run_hits_parity(DType::F32, 300, 32000);
  run_hits_parity(DType::F32, 100, 40000);
  run_hits_parity(DType::F32, 37, 129);
  run_hits_parity(DType::F32, 6000, 256);
  run_hits_parity(DType::BF16, 2000, 8192);
  run_hits_parity(DType::BF16, 700, 50264);
}

TEST(CrossEntropyGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::F32, false, 300, 32000, 1e-5);
  run_parity(DType::F32, DType::F32, false, 60, 40000, 1e-5);
  run_parity(DType::F32, DType::F32, false, 37, 129, 1e-5);
  run_parity(DType::F32, DType::F32, false, 6000, 256, 1e-5);
}

TEST(CrossEntropyGpu, ParityF32InPlace) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::F32, true, 300, 32000, 1e-5);
  run_parity(DType::F32, DType::F32, true, 60, 40000, 1e-5);
  run_parity(DType::F32, DType::F32, true, 37, 129, 1e-5);
}

TEST(CrossEntropyGpu, ParityBf16InPlace) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, DType::BF16, true, 300, 32000, 1e-2);
  run_parity(DType::BF16, DType::BF16, true, 700, 50272, 1e-2);
  run_parity(DType::BF16, DType::BF16, true, 300, 51200, 1e-2);  // every packed register in use
  run_parity(DType::BF16, DType::BF16, true, 37, 129, 1e-2);
}

// The models' head under bf16: f32 logits, bf16 gradient.
TEST(CrossEntropyGpu, ParityF32LogitsBf16Gradient) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::BF16, false, 300, 32000, 1e-2);
  run_parity(DType::F32, DType::BF16, false, 700, 50272, 1e-2);
}

TEST(CrossEntropyGpu, ParityBf16LogitsF32Gradient) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, DType::F32, false, 300, 32000, 1e-5);
  run_parity(DType::BF16, DType::F32, false, 700, 50264, 1e-5);
  run_parity(DType::BF16, DType::F32, false, 37, 129, 1e-5);
}

// On a Hopper GPU in a build for sm_90 register rows stream through shared memory (a silent fall
// back would pass every parity test), bf16 ones up to 51,200 logits; the override, f32 rows over
// 32,768 and longer bf16 rows do not.
TEST(CrossEntropyGpu, KernelChoice) {
  LINAC_SKIP_WITHOUT_GPU();
  test::ScopedEnv unset("LINAC_CROSS_ENTROPY_KERNELS", nullptr);
  const bool hopper = LINAC_WITH_SM90A && gpu_compute_capability() == 90;
  OwnedTensor l32k(DType::F32, Device::CUDA, {4, 32000}), l40k(DType::F32, Device::CUDA, {4, 40000});
  OwnedTensor b50k(DType::BF16, Device::CUDA, {4, 50272}), b51k(DType::BF16, Device::CUDA, {4, 51208});
  OwnedTensor l129(DType::F32, Device::CUDA, {4, 129});
  EXPECT_EQ(std::string(cross_entropy_gpu_kernel(l32k, l32k)), hopper ? "rows_sm90" : "rows");
  EXPECT_EQ(std::string(cross_entropy_gpu_kernel(l40k, l40k)), "two_pass");
  EXPECT_EQ(std::string(cross_entropy_gpu_kernel(b50k, b50k)), hopper ? "rows_sm90" : "two_pass");
  EXPECT_EQ(std::string(cross_entropy_gpu_kernel(b51k, b51k)), "two_pass");
  EXPECT_EQ(std::string(cross_entropy_gpu_kernel(l129, l129)), "two_pass");
  {
    test::ScopedEnv forced("LINAC_CROSS_ENTROPY_KERNELS", "sm80");
    EXPECT_EQ(std::string(cross_entropy_gpu_kernel(l32k, l32k)), "rows");
    EXPECT_EQ(std::string(cross_entropy_gpu_kernel(b50k, b50k)), "two_pass");
  }
  test::ScopedEnv bad("LINAC_CROSS_ENTROPY_KERNELS", "sm75");
  EXPECT_THROW(cross_entropy_gpu_kernel(l32k, l32k), UserError);
}

TEST(CrossEntropyGpu, InPlaceEqualsOutOfPlace) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t n = 50, v = 32000;
  int64_t counted = 0;
  OwnedTensor tg = to(make_targets(n, v, counted), Device::CUDA, DType::I32);
  OwnedTensor lg = to(test::random_tensor({n, v}, DType::F64, 2, -8, 8), Device::CUDA, DType::BF16);
  OwnedTensor dl(DType::BF16, Device::CUDA, {n, v});
  OwnedTensor l1(DType::F32, Device::CUDA, {n}), l2(DType::F32, Device::CUDA, {n});
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, dl, l1, 0.01f);
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, lg, l2, 0.01f);
  gctx.synchronize();
  EXPECT_EQ(to_doubles(lg), to_doubles(dl));
  EXPECT_EQ(to_doubles(l2), to_doubles(l1));
}

TEST(CrossEntropyGpu, TargetOutsideVocabularyGivesNanLoss) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t n = 4, v = 1000;
  OwnedTensor targets(DType::I32, Device::CPU, {n});
  const int32_t ids[] = {5, static_cast<int32_t>(v), 2147483647, 999};
  std::copy(ids, ids + n, targets->data<int32_t>());
  OwnedTensor tg = to(targets, Device::CUDA, DType::I32);
  OwnedTensor lg = to(test::random_tensor({n, v}, DType::F64, 3), Device::CUDA, DType::F32);
  OwnedTensor dl(DType::F32, Device::CUDA, {n, v}), loss(DType::F32, Device::CUDA, {n});
  cross_entropy_fwd_bwd(gctx.ctx(), lg, tg, dl, loss, 1.f);
  gctx.synchronize();
  const std::vector<double> l = to_doubles(loss);
  EXPECT_TRUE(std::isfinite(l[0]) && std::isfinite(l[3]));
  EXPECT_TRUE(std::isnan(l[1]) && std::isnan(l[2]));
}

}  // namespace
}  // namespace linac::test_cross_entropy_gpu
