// The order in which the Hopper score-gradient kernel (vq_score_grads_sm90.cu) takes its output
// tiles, on the host (which counts them) and in the kernel (which walks them); host code tests it.
// A chunk of c blocks [i0, i0 + c) is row groups (a cluster's row tiles of kTileRows query rows of
// one block; gpb per block) by column tiles of kTileEntries entries (the window's cw, then the
// cache's). Row group j of a block computes the window's column tiles [window_begin, window_end)
// and the cache's (cache_cols); in the others p is 0 for all of the group's rows: entries past Lb
// after its last row (keys after every query's), the previous block's at a pair's first block, and
// the cache's in a pair's first two blocks (block n's cache holds blocks <= n - 2: empty there).
// The computed tiles come first, row group by row group and in each the window's columns then the
// cache's; then the others, whose zeros the kernel's epilogue warps store without waiting for
// anything. In the plain order (each row group's columns in turn) a cluster took the same column
// in every row group it took, the grid's step being a multiple of the columns, so the clusters
// that drew the columns skipped most often idled: the SMs were busy about 80% of the kernel's
// time, 93.5% in this order (Nsight Compute, the 190M model's layer, H200, 2026-12-04).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace linac::vq_score_grads_sm90 {

constexpr int kTileRows = 128, kTileEntries = 256;

struct TileOrder {
  int64_t i0;  // the chunk's first block
  // blocks, per pair; row tiles per block (a multiple of the cluster), window column tiles; rows of
  // a block (Lb); CTAs per cluster
  int c, R, tpb, cw, Lb, cluster;
  // column tiles; row groups per block; tiles computed in a block that does not start a pair and
  // has a cache, and in the chunk
  int cols, gpb, per_block, computed;
};

// cluster: a.cluster (the kernel passes its compile-time copy).
LINAC_HD int window_end(const TileOrder& a, int j, int cluster) {
  const int rows = (j + 1) * cluster * kTileRows, last = rows < a.Lb ? rows - 1 : a.Lb - 1;
  return (a.Lb + last) / kTileEntries + 1 < a.cw ? (a.Lb + last) / kTileEntries + 1 : a.cw;
}
LINAC_HD int window_begin(const TileOrder& a, int ib) { return ib % a.R == 0 ? a.Lb / kTileEntries : 0; }
LINAC_HD int cache_cols(const TileOrder& a, int ib) { return ib % a.R < 2 ? 0 : a.cols - a.cw; }
// Blocks of [0, x) among their pair's first two.
LINAC_HD int early_blocks(const TileOrder& a, int x) {
  return x / a.R * (a.R < 2 ? a.R : 2) + (x % a.R < 2 ? x % a.R : 2);
}
// Tiles computed in the chunk's row groups [0, g).
LINAC_HD int computed_before(const TileOrder& a, int g, int cluster) {
  const int i0 = static_cast<int>(a.i0), nb = g / a.gpb, ib = i0 + nb;
  const int firsts = (ib + a.R - 1) / a.R - (i0 + a.R - 1) / a.R;  // blocks of [i0, ib) that start a pair
  const int early = early_blocks(a, ib) - early_blocks(a, i0);     // and that are among the first two
  int n = nb * a.per_block - firsts * a.gpb * window_begin(a, 0) - early * a.gpb * (a.cols - a.cw);
  for (int j = 0; j < g % a.gpb; ++j) n += window_end(a, j, cluster) - window_begin(a, ib) + cache_cols(a, ib);
  return n;
}
// The last row group g with before(g) <= n, before non-decreasing in g.
template <class Before>
LINAC_HD int group_of(const TileOrder& a, int n, Before&& before) {
  int lo = 0, hi = a.c * a.gpb - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (before(mid) <= n)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

struct TileAt {
  int group, col;  // row group of the chunk, column tile
};
// The t-th tile of the order above (t < c gpb cols).
LINAC_HD TileAt tile_at(const TileOrder& a, int t, int cluster) {
  auto computed = [&](int g) { return computed_before(a, g, cluster); };
  TileAt x;
  if (t < a.computed) {
    x.group = group_of(a, t, computed);
    const int m = t - computed(x.group), lo = window_begin(a, static_cast<int>(a.i0) + x.group / a.gpb);
    const int n = window_end(a, x.group % a.gpb, cluster) - lo;
    x.col = m < n ? lo + m : a.cw + m - n;
  } else {
    // Skipped: the window's columns before window_begin, then those from window_end on, which run
    // on into the cache's where the block has none.
    auto skipped = [&](int g) { return g * a.cols - computed(g); };
    const int s = t - a.computed;
    x.group = group_of(a, s, skipped);
    const int m = s - skipped(x.group), lo = window_begin(a, static_cast<int>(a.i0) + x.group / a.gpb);
    x.col = m < lo ? m : window_end(a, x.group % a.gpb, cluster) + m - lo;
  }
  return x;
}

// The order of a chunk: Lb rows and S cache entries per block, R blocks a pair.
inline TileOrder tile_order(int64_t i0, int64_t c, int64_t R, int64_t Lb, int64_t S) {
  TileOrder a{};
  a.i0 = i0;
  a.c = static_cast<int>(c);
  a.R = static_cast<int>(R);
  a.Lb = static_cast<int>(Lb);
  a.tpb = static_cast<int>((Lb + kTileRows - 1) / kTileRows);
  a.cluster = a.tpb % 2 == 0 ? 2 : 1;
  a.cw = static_cast<int>((2 * Lb + kTileEntries - 1) / kTileEntries);
  a.cols = a.cw + static_cast<int>((S + kTileEntries - 1) / kTileEntries);
  a.gpb = a.tpb / a.cluster;
  for (int j = 0; j < a.gpb; ++j) a.per_block += window_end(a, j, a.cluster) + a.cols - a.cw;
  a.computed = computed_before(a, a.c * a.gpb, a.cluster);
  return a;
}

}  // namespace linac::vq_score_grads_sm90
