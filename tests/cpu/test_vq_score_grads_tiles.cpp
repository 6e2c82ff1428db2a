// The tile order of the Hopper score-gradient kernel (kernels/vq_attn/vq_score_grads_tiles.h),
// which the kernel walks with closed forms and binary searches: over every chunk of pairs of
// several block counts (chunks that start and end inside a pair), block lengths off the tile grid
// and with odd and even row tiles per block (clusters of one and two), cache sizes off the tile
// grid, the order visits every (row group, column) exactly once, the first `computed` of them
// exactly those where p can be non-zero (the window's columns up to the group's last key, less the
// previous block at a pair's first block; the cache's past a pair's first two blocks), with their
// count per row group the host's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "vq_attn/vq_score_grads_tiles.h"

namespace linac::test_vq_score_grads_tiles {
namespace {

using namespace vq_score_grads_sm90;

TEST(VqScoreGradsTiles, ComputedFirstEachTileOnce) {
  int chunks = 0;
  for (int64_t Lb : {8, 100, 128, 384, 512, 1024})
    for (int64_t S : {7, 256, 300, 512})
      for (int64_t R : {1, 2, 3, 4, 5, 7})
        for (int64_t i0 = 0; i0 < 9; ++i0)
          for (int64_t c = 1; c < 9; ++c) {
            const TileOrder a = tile_order(i0, c, R, Lb, S);
            SCOPED_TRACE("Lb " + std::to_string(Lb) + " S " + std::to_string(S) + " R " + std::to_string(R) +
                         " chunk " + std::to_string(i0) + " + " + std::to_string(c));
            ASSERT_EQ(a.cluster, a.tpb % 2 == 0 ? 2 : 1);
            const int groups = a.c * a.gpb;
            std::vector<int> seen(static_cast<size_t>(groups * a.cols), -1);
            for (int t = 0; t < groups * a.cols; ++t) {
              const TileAt x = tile_at(a, t, a.cluster);
              ASSERT_TRUE(x.group >= 0 && x.group < groups && x.col >= 0 && x.col < a.cols) << "tile " << t;
              int& s = seen[static_cast<size_t>(x.group * a.cols + x.col)];
              ASSERT_EQ(s, -1) << "tile " << t << " repeats";
              s = t < a.computed ? 1 : 0;
            }
            for (int g = 0; g < groups; ++g) {
              const int64_t ib = i0 + g / a.gpb, n = ib % R;
              // The group's last query row and the last key it sees (window entries e <= Lb + row).
              const int64_t last_row = std::min<int64_t>((g % a.gpb + 1) * a.cluster * kTileRows, Lb) - 1;
              for (int col = 0; col < a.cols; ++col) {
                bool live;
                if (col < a.cw) {
                  const int64_t e0 = int64_t{col} * kTileEntries;
                  live = e0 <= Lb + last_row && !(n == 0 && e0 + kTileEntries <= Lb);
                } else {
                  live = n >= 2;
                }
                EXPECT_EQ(seen[static_cast<size_t>(g * a.cols + col)], live ? 1 : 0)
                    << "row group " << g << " column " << col;
              }
            }
            ++chunks;
          }
  EXPECT_EQ(chunks, 6 * 4 * 6 * 9 * 8);
}

}  // namespace
}  // namespace linac::test_vq_score_grads_tiles
