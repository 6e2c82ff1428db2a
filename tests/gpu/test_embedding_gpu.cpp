// Embedding CUDA vs the CPU reference (double); deterministic backward; out-of-range ids.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "embedding/embedding.h"
#include "test_util.h"

namespace linac::test_embedding_gpu {
namespace {

constexpr int64_t kN = 4096, kV = 1000;

OwnedTensor host_tokens(const std::vector<int32_t>& ids) {
  OwnedTensor t(DType::I32, Device::CPU, {static_cast<int64_t>(ids.size())});
  std::copy(ids.begin(), ids.end(), t->data<int32_t>());
  return t;
}

// 60% of the positions hold token 7 (one long run after sorting); the rest are uniform.
std::vector<int32_t> skewed_ids(int64_t n, int64_t v, uint64_t seed) {
  Rng rng{seed, 2, 0};
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = rng.uniform() < 0.6 ? 7 : static_cast<int32_t>(rng.below(v));
  return ids;
}

void run_fwd_parity(DType table_dt, DType out_dt, int64_t d, double tol) {
  GpuContext gctx;
  OwnedTensor tok = host_tokens(skewed_ids(kN, kV, 1));
  OwnedTensor tokg = to(tok, Device::CUDA, DType::I32);
  OwnedTensor table = test::random_tensor({kV, d}, DType::F64, 2);
  OwnedTensor tg = to(table, Device::CUDA, table_dt);
  OwnedTensor tr = to(tg, Device::CPU, DType::F64);
  OwnedTensor outg(out_dt, Device::CUDA, {kN, d}), out(DType::F64, Device::CPU, {kN, d});
  test::poison(outg);
  embedding_fwd(gctx.ctx(), tokg, tg, outg);
  gctx.synchronize();
  embedding_fwd(Ctx{}, tok, tr, out);
  EXPECT_LE(test::rel_error(outg, out), tol) << "d " << d;
}

void run_bwd_parity(DType dout_dt, int64_t d) {
  GpuContext gctx;
  ASSERT_LE(embedding_bwd_workspace_bytes(kN), gctx.ctx().workspace_bytes);
  OwnedTensor tok = host_tokens(skewed_ids(kN, kV, 3));
  OwnedTensor tokg = to(tok, Device::CUDA, DType::I32);
  OwnedTensor dout = test::random_tensor({kN, d}, DType::F64, 4);
  OwnedTensor doutg = to(dout, Device::CUDA, dout_dt);
  OwnedTensor doutr = to(doutg, Device::CPU, DType::F64);
  // dtable starts non-zero: the backward accumulates.
  OwnedTensor dt0 = test::random_tensor({kV, d}, DType::F64, 5);
  OwnedTensor dtg = to(dt0, Device::CUDA, DType::F32);
  OwnedTensor dtr = to(dtg, Device::CPU, DType::F64);
  embedding_bwd(gctx.ctx(), tokg, doutg, dtg);
  gctx.synchronize();
  embedding_bwd(Ctx{}, tok, doutr, dtr);
  // Same rounded inputs; only the f32 summation order differs (~2500 rows for the hot token).
  EXPECT_LT(test::rel_error(dtg, dtr), 1e-5) << "d " << d;
}

TEST(EmbeddingGpu, ForwardF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_fwd_parity(DType::F32, DType::F32, 256, 0.0);
  run_fwd_parity(DType::F32, DType::F32, 37, 0.0);
}

TEST(EmbeddingGpu, ForwardBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_fwd_parity(DType::BF16, DType::BF16, 256, 0.0);
  run_fwd_parity(DType::BF16, DType::F32, 37, 0.0);
  // f32 master table read into a bf16 activation: one rounding to nearest-even.
  run_fwd_parity(DType::F32, DType::BF16, 256, 1e-2);
  run_fwd_parity(DType::F32, DType::BF16, 37, 1e-2);
}

TEST(EmbeddingGpu, BackwardF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_bwd_parity(DType::F32, 256);
  run_bwd_parity(DType::F32, 37);
}

TEST(EmbeddingGpu, BackwardBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_bwd_parity(DType::BF16, 256);
  run_bwd_parity(DType::BF16, 37);
}

TEST(EmbeddingGpu, BackwardIsDeterministic) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t d = 300;
  OwnedTensor tokg = to(host_tokens(skewed_ids(kN, kV, 6)), Device::CUDA, DType::I32);
  OwnedTensor doutg = to(test::random_tensor({kN, d}, DType::F64, 7), Device::CUDA, DType::BF16);
  OwnedTensor dt0 = test::random_tensor({kV, d}, DType::F64, 8);
  OwnedTensor a = to(dt0, Device::CUDA, DType::F32), b = to(dt0, Device::CUDA, DType::F32);
  embedding_bwd(gctx.ctx(), tokg, doutg, a);
  embedding_bwd(gctx.ctx(), tokg, doutg, b);
  gctx.synchronize();
  EXPECT_EQ(to_doubles(a), to_doubles(b));
}

TEST(EmbeddingGpu, OutOfRangeIdsAreSkipped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t n = 300, d = 64;
  std::vector<int32_t> ids = skewed_ids(n, kV, 9);
  const std::vector<size_t> bad = {0, 17, 18, 150, 299};
  const int32_t bad_ids[] = {-1, static_cast<int32_t>(kV), -2147483647 - 1, 2147483647, static_cast<int32_t>(kV) + 5};
  for (size_t k = 0; k < bad.size(); ++k) ids[bad[k]] = bad_ids[k];
  OwnedTensor tokg = to(host_tokens(ids), Device::CUDA, DType::I32);
  OwnedTensor table = to(test::random_tensor({kV, d}, DType::F64, 10), Device::CUDA, DType::F32);
  OwnedTensor outg(DType::F32, Device::CUDA, {n, d});
  test::poison(outg);
  embedding_fwd(gctx.ctx(), tokg, table, outg);
  OwnedTensor dout = test::random_tensor({n, d}, DType::F32, 11);
  OwnedTensor dt0 = test::random_tensor({kV, d}, DType::F64, 12);
  OwnedTensor doutg = to(dout, Device::CUDA, DType::F32), dtg = to(dt0, Device::CUDA, DType::F32);
  embedding_bwd(gctx.ctx(), tokg, doutg, dtg);
  gctx.synchronize();

  const std::vector<double> out = to_doubles(outg), tab = to_doubles(table);
  for (int64_t i = 0; i < n; ++i) {
    const bool skipped = std::find(bad.begin(), bad.end(), static_cast<size_t>(i)) != bad.end();
    for (int64_t j = 0; j < d; ++j) {
      const double o = out[static_cast<size_t>(i * d + j)];
      if (skipped)
        ASSERT_TRUE(std::isnan(o)) << "row " << i << " of an out-of-range id was written";
      else
        ASSERT_EQ(o, tab[static_cast<size_t>(ids[static_cast<size_t>(i)] * d + j)]) << "row " << i;
    }
  }
  // Reference: the skipped positions contribute nothing (their ids mapped to 0, rows zeroed).
  OwnedTensor doutr = to(dout, Device::CPU, DType::F64);
  for (size_t k : bad) {
    ids[k] = 0;
    std::fill_n(doutr->data<double>() + k * d, d, 0.0);
  }
  OwnedTensor dtr = to(dtg, Device::CPU, DType::F64);
  OwnedTensor expect = to(to(dt0, Device::CPU, DType::F32), Device::CPU, DType::F64);
  embedding_bwd(Ctx{}, host_tokens(ids), doutr, expect);
  EXPECT_LT(test::rel_error(dtr, expect), 1e-5);
}

}  // namespace
}  // namespace linac::test_embedding_gpu
