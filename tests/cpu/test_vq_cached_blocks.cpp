// vq_cuda::for_cached_blocks (vq_packed.h): the blocks whose cache products the GPU block form
// computes. Every block of the chunk that is two or more into its pair exactly once and no other,
// through calls at a stride of R blocks (per block index) or of one (per pair), and no more calls
// than the fewer of the two ways takes; past kCacheSkipMaxR blocks per pair, one call over the whole
// chunk. Over every chunk of several heads' pairs, including chunks that start and end inside a
// pair and chunks smaller than a pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "vq_attn/vq_packed.h"

namespace linac::test_vq_cached_blocks {
namespace {

TEST(VqCachedBlocks, EachCachedBlockOnceInFewCalls) {
  for (int64_t R = 1; R <= vq_cuda::kCacheSkipMaxR + 3; ++R)
    for (int64_t B : {1, 3}) {
      const vq_cuda::Geo g = vq_cuda::geo_of(B, R * 16, 2, 8, 8, 5, 16);
      ASSERT_EQ(g.R, R);
      const int64_t blocks = g.H * B * R;
      for (int64_t i0 = 0; i0 < blocks; ++i0)
        for (int64_t c = 1; i0 + c <= blocks; ++c) {
          SCOPED_TRACE("R " + std::to_string(R) + " B " + std::to_string(B) + " chunk " + std::to_string(i0) + " + " +
                       std::to_string(c));
          std::vector<int> seen(static_cast<size_t>(blocks), 0);
          int64_t calls = 0;
          vq_cuda::for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
            ++calls;
            EXPECT_GT(batch, 0);
            EXPECT_TRUE(stride == R || stride == 1);
            for (int64_t k = 0; k < batch; ++k) ++seen[static_cast<size_t>(i + k * stride)];
          });
          const bool whole = R > vq_cuda::kCacheSkipMaxR;
          if (whole) EXPECT_EQ(calls, 1);
          for (int64_t i = 0; i < blocks; ++i) {
            const bool wanted = i >= i0 && i < i0 + c && (whole || i % R >= 2);
            EXPECT_EQ(seen[static_cast<size_t>(i)], wanted ? 1 : 0) << "block " << i;
          }
          const int64_t pairs = (i0 + c - 1) / R - i0 / R + 1;
          if (!whole) EXPECT_LE(calls, std::max<int64_t>(0, std::min(R - 2, pairs)));
        }
    }
}

}  // namespace
}  // namespace linac::test_vq_cached_blocks
