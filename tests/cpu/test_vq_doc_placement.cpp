// The documents' placement in the GPU VQ-attention's packed layout (vq_packed.h), planned on the
// host: known rows (documents that follow each other in shared blocks, ones moved to a block
// boundary where they need a cache, the gap left as padding), and on random bounds the invariants
// the kernels rely on: every token at one packed row and back, a document's rows contiguous and
// its start recorded, every document that reaches two blocks past its first one starting a cache
// segment that covers all its blocks, every other document within two blocks, R within
// doc_blocks_bound.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "vq_attn/vq_packed.h"

namespace linac::test_vq_doc_placement {
namespace {

using vq_cuda::DocPlan;
using vq_cuda::plan_documents;

// Ends [B, T] of rows of documents of the given lengths (every row sums to the same T).
std::vector<int32_t> ends_of(const std::vector<std::vector<int64_t>>& rows, int64_t T) {
  std::vector<int32_t> end;
  for (const auto& row : rows) {
    int64_t a = 0;
    for (int64_t len : row) {
      for (int64_t t = a; t < a + len; ++t) end.push_back(static_cast<int32_t>(a + len));
      a += len;
    }
    EXPECT_EQ(a, T);
  }
  return end;
}

struct Tables {
  int64_t B, T, R, Tp;
  const int32_t *src, *start, *cache_from, *packed;
  Tables(const DocPlan& p, int64_t B_, int64_t T_, int64_t Lb) : B(B_), T(T_), R(p.R), Tp(p.R * Lb) {
    src = p.tables.data();
    start = src + B * Tp;
    cache_from = start + B * Tp;
    packed = cache_from + B * R;
    EXPECT_EQ(p.tables.size(), static_cast<size_t>(2 * B * Tp + B * R + B * T));
  }
};

TEST(VqDocPlacement, KnownRows) {
  const int64_t T = 200, Lb = 32;
  const std::vector<std::vector<int64_t>> rows = {{1, 63, 64, 5, 67}, {200}, {5, 150, 45}};
  const std::vector<int32_t> end = ends_of(rows, T);
  const DocPlan plan = plan_documents(end.data(), 3, T, Lb);
  const Tables tb(plan, 3, T, Lb);
  // Row 0: 1, 63 and 64 fit where they fall (64 ends exactly at block 4); 67 at offset 5 of block
  // 4 would reach block 6: it moves to 160 (block 5), 22 rows of padding before it.
  EXPECT_EQ(tb.R, 8);  // row 0 ends at 227
  const int32_t firsts0[] = {0, 1, 64, 128, 160};
  const int64_t tokens0[] = {0, 1, 64, 128, 133};
  for (int k = 0; k < 5; ++k) EXPECT_EQ(tb.packed[tokens0[k]], firsts0[k]) << "document " << k;
  for (int64_t tp = 138; tp < 160; ++tp) EXPECT_EQ(tb.src[tp], -1) << tp;
  EXPECT_EQ(tb.start[170], 160);
  EXPECT_EQ(tb.start[100], 64);
  const int32_t from0[] = {0, 0, 0, 0, 0, 5, 5, 5}, from1[] = {0, 0, 0, 0, 0, 0, 0, 0},
                from2[] = {0, 1, 1, 1, 1, 1, 6, 6};
  for (int64_t n = 0; n < 8; ++n) {
    EXPECT_EQ(tb.cache_from[n], from0[n]) << n;
    EXPECT_EQ(tb.cache_from[8 + n], from1[n]) << n;
    EXPECT_EQ(tb.cache_from[16 + n], from2[n]) << n;
  }
  // Row 1 is one document: the stream layout, padding past T.
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(tb.packed[T + t], t);
  EXPECT_EQ(tb.src[tb.Tp + 200], -1);
  // Row 2: 150 at offset 5 moves to 32; 45 at offset 22 of block 5 would reach block 7: to 192.
  EXPECT_EQ(tb.packed[2 * T + 5], 32);
  EXPECT_EQ(tb.packed[2 * T + 155], 192);
  EXPECT_EQ(tb.src[2 * tb.Tp + 191], -1);
}

// Random documents of 1 .. 3 Lb tokens (and some of exactly Lb, 2 Lb).
void check_random(int64_t B, int64_t T, int64_t Lb, uint64_t seed) {
  SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " Lb=" + std::to_string(Lb));
  Rng rng{seed, 3, 0};
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (auto& row : rows)
    for (int64_t left = T; left > 0;) {
      const uint64_t kind = rng.below(4);
      int64_t len = kind == 0 ? Lb : kind == 1 ? 2 * Lb : 1 + static_cast<int64_t>(rng.below(3 * Lb));
      len = std::min(len, left);
      row.push_back(len);
      left -= len;
    }
  const std::vector<int32_t> end = ends_of(rows, T);
  const DocPlan plan = plan_documents(end.data(), B, T, Lb);
  const Tables tb(plan, B, T, Lb);
  EXPECT_LE(tb.R, vq_cuda::doc_blocks_bound(T, Lb));
  for (int64_t b = 0; b < B; ++b) {
    int64_t tokens = 0;
    for (int64_t tp = 0; tp < tb.Tp; ++tp) tokens += tb.src[b * tb.Tp + tp] >= 0;
    EXPECT_EQ(tokens, T);
    int64_t a = 0;
    for (int64_t len : rows[static_cast<size_t>(b)]) {
      const int64_t first = tb.packed[b * T + a], n0 = first / Lb, n1 = (first + len - 1) / Lb;
      for (int64_t x = 0; x < len; ++x) {
        const int64_t tp = tb.packed[b * T + a + x];
        ASSERT_EQ(tp, first + x) << "row " << b << " token " << a + x;
        ASSERT_EQ(tb.src[b * tb.Tp + tp], a + x);
        ASSERT_EQ(tb.start[b * tb.Tp + tp], first);
      }
      if (n1 >= n0 + 2) {  // reads a cache: a segment of its own from its first block on
        EXPECT_EQ(first % Lb, 0) << "row " << b << " token " << a;
        for (int64_t n = n0; n <= n1; ++n) EXPECT_EQ(tb.cache_from[b * tb.R + n], n0) << "block " << n;
      }
      a += len;
    }
  }
}

TEST(VqDocPlacement, RandomBoundsKeepTheInvariants) {
  check_random(3, 200, 32, 1);
  check_random(2, 1000, 64, 2);
  check_random(4, 37, 4, 3);
  check_random(2, 50, 1, 4);
  check_random(1, 4096, 512, 5);
}

// Documents of 1 and 2 Lb + 1 tokens alternate: each long one would start one or two past a block
// boundary and moves to the next (to 8, then every 24 rows: 32, 56, 80, 104), so the row ends at
// 121: R = 16, which is the bound (gaps of at most 36 rows in T = 90).
TEST(VqDocPlacement, PaddingStaysWithinTheBound) {
  const int64_t Lb = 8, T = 5 * (2 * Lb + 2);
  std::vector<int64_t> row;
  for (int k = 0; k < 5; ++k) row.insert(row.end(), {1, 2 * Lb + 1});
  const std::vector<int32_t> end = ends_of({row}, T);
  const DocPlan plan = plan_documents(end.data(), 1, T, Lb);
  EXPECT_EQ(plan.R, 16);
  EXPECT_GT(plan.R, (T + Lb - 1) / Lb);
  EXPECT_EQ(vq_cuda::doc_blocks_bound(T, Lb), 16);
}

TEST(VqDocPlacement, RefusesBoundsOutOfOrder) {
  std::vector<int32_t> end = {2, 2, 1};  // the document at token 2 ends before it starts
  EXPECT_ANY_THROW(plan_documents(end.data(), 1, 3, 4));
  end = {2, 2, 4};  // past T
  EXPECT_ANY_THROW(plan_documents(end.data(), 1, 3, 4));
}

}  // namespace
}  // namespace linac::test_vq_doc_placement
