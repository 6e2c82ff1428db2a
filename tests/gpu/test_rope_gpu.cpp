// RoPE CUDA vs the CPU reference (double), in place on q and k views of a fused qkv buffer; also
// with packed documents (positions restart at each document start).
#include <algorithm>
#include <vector>

#include "rope/rope.h"
#include "test_util.h"

namespace linac::test_rope_gpu {
namespace {

constexpr double kBase = 10000.0;

// docs.start (host memory) of a [b, t] window: row r holds documents of `lengths` cycled from its
// r-th entry.
OwnedTensor doc_starts(int64_t b, int64_t t, const std::vector<int64_t>& lengths) {
  return test::doc_layout(b, t, test::rotated_rows(lengths, b)).starts();
}

// Rotates the q and k slices of a [B, T, 3, H, D] buffer on both devices and compares the whole
// buffer (the v slice must come back bit for bit). lengths: documents packed in each row (empty:
// none).
void run_parity(DType dt, int64_t b, int64_t t, int64_t h, int64_t d, int64_t pos0, bool inverse, double tol,
                const std::vector<int64_t>& lengths = {}) {
  GpuContext gctx;
  OwnedTensor start, start_g;
  DocBounds docs_g, docs_r;  // the GPU's and the reference's
  if (!lengths.empty()) {
    start = doc_starts(b, t, lengths);
    start_g = to(start, Device::CUDA, DType::I32);
    docs_g.start = start_g.t.data<int32_t>();
    docs_r.start = start.t.data<int32_t>();
  }
  OwnedTensor qkv = test::random_tensor({b, t, 3, h, d}, DType::F64, 1, -2, 2);
  OwnedTensor g = to(qkv, Device::CUDA, dt);
  OwnedTensor r = to(g, Device::CPU, DType::F64);
  const std::vector<double> before = to_doubles(r);
  for (int s : {0, 1}) {
    if (inverse) {
      rope_bwd(gctx.ctx(), g.t.select(2, s), kBase, pos0, docs_g);
      rope_bwd(Ctx{}, r.t.select(2, s), kBase, pos0, docs_r);
    } else {
      rope_fwd(gctx.ctx(), g.t.select(2, s), kBase, pos0, docs_g);
      rope_fwd(Ctx{}, r.t.select(2, s), kBase, pos0, docs_r);
    }
  }
  gctx.synchronize();
  const std::vector<double> got = to_doubles(g);
  EXPECT_LT(test::rel_error(got, to_doubles(r)), tol) << "pos0 " << pos0 << " d " << d;
  for (int64_t bt = 0; bt < b * t; ++bt)
    for (int64_t e = 0; e < h * d; ++e) {
      const size_t o = static_cast<size_t>((bt * 3 + 2) * h * d + e);
      ASSERT_EQ(got[o], before[o]) << "v slice changed at " << o;
    }
}

TEST(RopeGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool inverse : {false, true}) {
    run_parity(DType::F32, 2, 77, 4, 64, 3, inverse, 1e-5);
    run_parity(DType::F32, 3, 13, 3, 10, 0, inverse, 1e-5);
    // Many heads: each thread rotates several batches of pair groups, the last one partial.
    run_parity(DType::F32, 1, 45, 24, 128, 0, inverse, 1e-5);
  }
}

TEST(RopeGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool inverse : {false, true}) {
    run_parity(DType::BF16, 2, 77, 4, 64, 3, inverse, 1e-2);
    run_parity(DType::BF16, 3, 13, 3, 10, 0, inverse, 1e-2);
    run_parity(DType::BF16, 2, 37, 16, 96, 5, inverse, 1e-2);  // Latte-Macchiato's q and k heads
    run_parity(DType::BF16, 1, 45, 24, 128, 0, inverse, 1e-2);
  }
}

// Documents of one token (position 0: unrotated), shorter than the kernel's 8-token blocks, and
// longer ones; the two rows hold different layouts.
TEST(RopeGpu, ParityDocs) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool inverse : {false, true}) {
    run_parity(DType::F32, 2, 77, 4, 64, 0, inverse, 1e-5, {1, 5, 17});
    run_parity(DType::F32, 3, 333, 3, 10, 3, inverse, 1e-5, {64, 1, 200});
    run_parity(DType::BF16, 2, 77, 4, 128, 0, inverse, 1e-2, {5, 1, 17, 3});
    run_parity(DType::BF16, 2, 1000, 2, 64, 0, inverse, 1e-2, {300, 7, 1});
  }
}

// Per-row positions read on the device (a decoding step's, Latte's VAPOR rotation): the same bits
// as each row rotated by itself at pos0 = pos[r] (whose parity with the CPU the tests above check),
// for rows at 0, inside and past the kernel's 8-token blocks and far out, one token each and four.
TEST(RopeGpu, RowPositionsRotateEachRowAtItsOwn) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const std::vector<int32_t> pos = {0, 5, 9, 4093, 70000};
  const OwnedTensor pos_g = test::int32_values(pos, Device::CUDA);
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t t : {1, 4})
      for (bool inverse : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(t) + (inverse ? " backward" : " forward"));
        const OwnedTensor x = to(test::random_tensor({5, t, 8, 96}, DType::F64, 6, -2, 2), Device::CUDA, dt);
        OwnedTensor all = to(x, Device::CUDA, dt), rows = to(x, Device::CUDA, dt);
        inverse ? rope_bwd(gctx.ctx(), all, kBase, pos_g) : rope_fwd(gctx.ctx(), all, kBase, pos_g);
        for (size_t r = 0; r < pos.size(); ++r) {
          const Tensor row = rows->narrow(0, static_cast<int64_t>(r), 1);
          inverse ? rope_bwd(gctx.ctx(), row, kBase, pos[r]) : rope_fwd(gctx.ctx(), row, kBase, pos[r]);
        }
        gctx.synchronize();
        EXPECT_TRUE(test::same_bits(all, rows));
        EXPECT_GT(test::rel_error(all, x), 0.1) << "rows away from position 0 are rotated";
      }
}

// Documents restart the positions: the rotation differs from the one without them.
TEST(RopeGpu, DocsMatter) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const OwnedTensor x = test::random_tensor({2, 77, 4, 64}, DType::F64, 2, -2, 2);
  OwnedTensor plain = to(x, Device::CUDA, DType::F32), packed = to(x, Device::CUDA, DType::F32);
  const OwnedTensor start = to(doc_starts(2, 77, {5, 17}), Device::CUDA, DType::I32);
  rope_fwd(gctx.ctx(), plain, kBase, 0);
  rope_fwd(gctx.ctx(), packed, kBase, 0, DocBounds{start.t.data<int32_t>(), nullptr});
  gctx.synchronize();
  EXPECT_GT(test::rel_error(packed, plain), 0.1);
}

TEST(RopeGpu, ParityF32FarPositions) {
  LINAC_SKIP_WITHOUT_GPU();
  // The f32 angle p * inv_freq is off by up to p * 2^-24 rad (rope.h): ~2.4e-4 rad at p = 4096
  // for the lowest pairs, a few 1e-5 in the norm-wise error; the double reference has none.
  run_parity(DType::F32, 2, 64, 4, 128, 4096, false, 1e-3);
  run_parity(DType::F32, 2, 64, 4, 128, 4096, true, 1e-3);
}

}  // namespace
}  // namespace linac::test_rope_gpu
