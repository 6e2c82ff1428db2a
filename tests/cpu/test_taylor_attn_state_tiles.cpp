// The Taylor state's tile map (kernels/taylor_attn/taylor_attn_state_tiles.h), by which the GPU
// state warps and totals kernel build their feature tiles and store their sums: every row of the
// padded state is stored exactly once, and the kernels' sums, emulated in double (each tile row's
// feature built as they build it, T not a multiple of 16), are phi(x)^T y of the CPU feature
// map, with the padding rows zero.
#include <cmath>
#include <limits>
#include <vector>

#include "taylor_attn/taylor_attn.h"
#include "taylor_attn/taylor_attn_state_tiles.h"
#include "test_util.h"

namespace linac::test_taylor_attn_state_tiles {
namespace {

using namespace taylor_tiles;

TEST(TaylorStateTiles, EveryStateRowOnce) {
  ASSERT_EQ(kStateRows, 16 * 18);
  ASSERT_EQ(taylor_attn_state_rows(kF) + 15, kStateRows);  // the GPU pads the 273 rows to 18 blocks
  std::vector<int> stored(kStateRows, 0);
  std::vector<std::vector<int>> pair_seen(kF, std::vector<int>(kF, 0));
  for (int t = 0; t < kTiles; ++t)
    for (int r = 0; r < 16; ++r) {  // tile 8's rows 8..15 too: the constant's block
      SCOPED_TRACE("tile " + std::to_string(t) + " row " + std::to_string(r));
      const Targets to = tile_row_targets(t, r);
      ASSERT_GE(to.sum, 0);
      ASSERT_LT(to.sum, kStateRows);
      ++stored[to.sum];
      if (to.other >= 0) {
        ASSERT_LT(to.other, kStateRows);
        ++stored[to.other];
      }
      if (t < kTailTile || (t == kTailTile && r < 8)) {
        const Pair p = tile_pair(t, r);
        EXPECT_LE(p.f, p.j);
        EXPECT_EQ(to.sum, kF * p.f + p.j);
        EXPECT_EQ(to.other, p.f == p.j ? -1 : kF * p.j + p.f);
        ++pair_seen[p.f][p.j];
      }
    }
  for (int row = 0; row < kStateRows; ++row) EXPECT_EQ(stored[row], 1) << "state row " << row;
  for (int f = 0; f < kF; ++f)
    for (int j = f; j < kF; ++j) EXPECT_EQ(pair_seen[f][j], 1) << "product " << f << ", " << j;
}

TEST(TaylorStateTiles, SumsArePhiTransposeY) {
  const int64_t T = 77, V = 5, R = taylor_attn_state_rows(kF);
  const OwnedTensor xs = test::random_tensor({T, kF}, DType::F64, 3, -1.5, 1.5);
  const OwnedTensor ys = test::random_tensor({T, V}, DType::F64, 4);
  const double* x = xs.t.data<double>();
  const double* y = ys.t.data<double>();
  const double quad_scale = 0.25 / std::sqrt(2.0);  // x^ = x / 2, then 1 / sqrt 2

  // The kernel: per tile row and token the feature it builds, summed against y, stored by the map.
  std::vector<double> total(kStateRows * V, std::numeric_limits<double>::quiet_NaN());
  for (int t = 0; t < kTiles; ++t)
    for (int r = 0; r < 16; ++r) {  // tile 8's rows 8..15 too: the constant's block
      std::vector<double> sum(V, 0.0);
      for (int64_t tok = 0; tok < T; ++tok) {
        const double* xt = x + tok * kF;
        double phi;
        if (t < kTailTile || (t == kTailTile && r < 8)) {
          const Pair p = tile_pair(t, r);
          phi = xt[p.f] * xt[p.j] * quad_scale;
        } else if (t == kTailTile) {
          phi = r == 8 ? 1.0 : 0.0;
        } else {
          phi = 0.5 * xt[r];
        }
        for (int64_t c = 0; c < V; ++c) sum[c] += phi * y[tok * V + c];
      }
      const Targets to = tile_row_targets(t, r);
      for (int64_t c = 0; c < V; ++c) {
        total[to.sum * V + c] = sum[c];
        if (to.other >= 0) total[to.other * V + c] = to.other_zero ? 0.0 : sum[c];
      }
    }

  // The reference: the CPU feature map's phi(x)^T y over its R rows, zero past them.
  std::vector<double> ref(kStateRows * V, 0.0), phi(R);
  for (int64_t tok = 0; tok < T; ++tok) {
    taylor_feature_map_cpu(kF, x + tok * kF, phi.data());
    for (int64_t row = 0; row < R; ++row)
      for (int64_t c = 0; c < V; ++c) ref[row * V + c] += phi[row] * y[tok * V + c];
  }
  for (int row = 0; row < kStateRows; ++row)
    for (int64_t c = 0; c < V; ++c)
      EXPECT_NEAR(total[row * V + c], ref[row * V + c], 1e-12 * (1 + std::fabs(ref[row * V + c])))
          << "state row " << row << " column " << c;
}

}  // namespace
}  // namespace linac::test_taylor_attn_state_tiles
