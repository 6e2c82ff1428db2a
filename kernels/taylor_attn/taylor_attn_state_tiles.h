// The state's feature tiles, as the fused kernels' state warps and the segment totals sum it
// (taylor_attn_state.cuh): which rows of the padded state
// (taylor_attn_common.cuh: block f < 16 holds x_f x_j / sqrt 2 in row 16 f + j, block 16 x_j in
// row 256 + j, block 17 the constant in row 272 and zeros in 273..287) each row of its ten mma
// tiles of 16 sums. Rows 16 f + j and 16 j + f are equal (x_f x_j and x_j x_f are the same f32
// product of two bf16 values), so the tiles hold each distinct product once:
//   tile t = 0..3  row r: (2t + r / 8, 8 + r % 8)                  f < 8 <= j: all 64
//   tile t = 4..7  row r: M[2 (t - 4) + r / 8][r % 8], where       f, j < 8 (36) and f, j >= 8
//                  M[i][j] = (i, j) if j >= i else (8 + j, 8 + i)   off the diagonal (28)
//   tile 8         rows 0..7: (8 + r, 8 + r); rows 8..15: the constant (r = 8) and zeros
//   tile 9         the linear features: row r is x_r
// Host and device: the kernels build and store by it, a CPU test checks that it covers the state.
#pragma once

#include "core/host_device.h"

namespace linac::taylor_tiles {

constexpr int kF = 16, kTiles = 10, kTailTile = 8, kStateRows = kF * kF + 2 * kF;

struct Pair {
  int f, j;
};

// The product (f, j), f <= j, that row r (0..15) of tile t < kTailTile sums, or row r < 8 of tile 8.
LINAC_HD Pair tile_pair(int t, int r) {
  if (t < 4) return {2 * t + (r >> 3), 8 + (r & 7)};
  if (t == kTailTile) return {8 + r, 8 + r};
  const int i = 2 * (t - 4) + (r >> 3), j = r & 7;
  return j >= i ? Pair{i, j} : Pair{8 + j, 8 + i};
}

// The state rows that row r of tile t is stored to: `sum` gets the row's sum, `other` (-1: none)
// the sum too, or zero where other_zero (the constant block's padding rows, which tile 8's rows 8..15
// stand for beside rows 272..279).
struct Targets {
  int sum, other;
  bool other_zero;
};

LINAC_HD Targets tile_row_targets(int t, int r) {
  if (t == kTailTile + 1) return {kF * kF + r, -1, false};
  if (t == kTailTile && r >= 8) return {kF * kF + kF + (r - 8), kF * kF + kF + r, true};
  const Pair p = tile_pair(t, r);
  return {kF * p.f + p.j, p.f != p.j ? kF * p.j + p.f : -1, false};
}

}  // namespace linac::taylor_tiles
