// Hopper attention input projection with RoPE in its epilogue (math in rope_linear.h):
//   y = x W^T                (f32 accumulation, rounded to bf16)
//   y[:, r0:r0+n_rot] rotated per head of D columns at position (row % T), or (row % T) -
//                            doc_start[row] with document bounds, from that rounded y, as rope_fwd
//                            rotates it (rope_math.cuh; (cos, sin) from rope_table_cuda)
// Layout: x [N, K], W [M, K], y [N, M]; bf16. cos_sin [T, D / 2] pairs of f32.
//
// Output tile: rows m0 .. m0 + 127, columns c0 .. c0 + BN - 1 (BN = 256 at D = 64 and 128, 192 at
// D = 96), as BN / 64 chunks of 64 columns. Tiles start at multiples of BN, a multiple of D, and r0
// is a multiple of D, so a head never straddles two tiles. A math warpgroup's 64 x BN accumulator
// is one wgmma m64nBNk16 chain; k runs in steps of 32 (64-byte rows, 64-byte swizzle) through five
// (D = 64), four (D = 128) or six (D = 96) stages of A = x [128, 32] and B = W [BN, 32] (two boxes
// of BN / 2 rows), both K-major, as in the SwiGLU up-projection (swiglu_linear_fwd_sm90.cu).
// Per math warpgroup a staging block of the chunks; the epilogue warps take it to registers and
// store it straight to global memory, the heads in [r0, r0 + n_rot) rotated on the way, eight
// pairs of one row at a time (a pair's halves are D / 2 columns apart: in one chunk at D = 64, in
// neighbouring chunks at D = 128, in the same or the next chunk at D = 96). The epilogue warps
// run three ways over a block. In a tile whose heads all rotate (q, k) or none (v), each thread
// keeps one place in the row and steps down the rows, so only the row's part of an address changes
// (the index arithmetic of a unit counter divided by a run-time row width had made the epilogue
// the tile's critical path: 2.69 -> 2.27 ms per 125M step on an H100, 2026-12-06); a tile with
// both kinds (heads that do not fill whole tiles, e.g. some GQA shapes) counts units. Rotating in
// shared memory for a TMA store moved 64 KB more per tile through shared memory, which the wgmmas
// and operand copies nearly saturate (see swiglu_linear_fwd_sm90.cu). The (cos, sin) rows of the
// tile's 128 positions arrive in shared memory by bulk copies that thread 32 issues as the tile
// begins, so they land while the math warpgroups work (read per 8 pairs from global memory, they
// held the epilogue warps up: no gain over the separate pass). With document bounds a run of
// consecutive positions ends at each document start, so the first epilogue warp finds the runs
// and copies them, one per run. Rows past N and columns past M are not stored; the TMA reads W's
// rows past M as zero. In clusters of two, rank r loads rows [r BN / 2, (r + 1) BN / 2) of each B
// stage and multicasts them.
#include "common/gemm_sm90.cuh"
#include "rope/rope_linear.h"
#include "rope/rope_math.cuh"

namespace linac {
namespace rope_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBK = 32, kCluster = 2;
using Cta = Roles<false>;

template <int D>
struct Cfg {
  static constexpr int kBN = D == 96 ? 192 : 256;  // whole heads per tile
  // As many stages as the (cos, sin) rows of a tile leave room for.
  static constexpr int kStages = D == 64 ? 5 : D == 96 ? 6 : 4;
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kStagingBytes = kBN / 64 * kChunkBytes;  // per math warpgroup: its 64 x BN outputs
  static constexpr uint32_t kTableBytes = kBM * (D / 2) * 8;  // (cos, sin) of the tile's 128 positions
  static constexpr uint32_t kTableOffset = kStages * kStageBytes + 2 * kStagingBytes;
  static constexpr uint32_t kBarOffset = kTableOffset + kTableBytes;
  // full and empty per stage, staged and free per math warpgroup, the table's
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 5);
};

// Epilogue thread 0 copies the (cos, sin) rows of positions (row0 + r) % t, r < 128, into `table`
// (runs of consecutive positions, one bulk copy each), completing on `bar`.
template <int D>
__device__ __forceinline__ void load_table(uint32_t table, int row0, int t, const float* cos_sin, uint32_t bar) {
  constexpr uint32_t kRowBytes = (D / 2) * 8;
  mbar_arrive_expect_tx(bar, kBM * kRowBytes);
  for (int r = 0; r < kBM;) {
    const int p = (row0 + r) % t, len = min(kBM - r, t - p);
    bulk_load(table + r * kRowBytes, cos_sin + static_cast<int64_t>(p) * (D / 2) * 2, len * kRowBytes, bar);
    r += len;
  }
}

// load_table with document bounds, by the 32 lanes of the first epilogue warp: row r's position
// is (row0 + r) % t - doc_start[row0 + r] (rows past n take 0; they are not stored). Lane l copies
// the runs of consecutive positions that begin at its rows l, l + 32, l + 64, l + 96, each up to
// the next run's first row, which a ballot of the run starts gives every lane.
template <int D>
__device__ __forceinline__ void load_table_docs(uint32_t table, int row0, int t, int n, const float* cos_sin,
                                                const int32_t* __restrict__ doc_start, uint32_t bar) {
  constexpr uint32_t kRowBytes = (D / 2) * 8;
  const int lane = static_cast<int>(threadIdx.x & 31);
  auto pos = [&](int r) {
    const int row = row0 + r;
    return row < n ? row % t - __ldg(doc_start + row) : 0;
  };
  int p[kBM / 32];
  unsigned starts[kBM / 32];
#pragma unroll
  for (int i = 0; i < kBM / 32; ++i) {
    const int r = 32 * i + lane;
    p[i] = pos(r);
    starts[i] = __ballot_sync(0xffffffffu, r == 0 || p[i] != pos(r - 1) + 1);
  }
  if (lane == 0) mbar_arrive_expect_tx(bar, kBM * kRowBytes);
  __syncwarp();  // the bytes are announced before any copy completes
#pragma unroll
  for (int i = 0; i < kBM / 32; ++i) {
    if (!(starts[i] >> lane & 1u)) continue;
    int next = kBM;
    for (int j = i; j < kBM / 32; ++j) {
      const unsigned later = j == i ? starts[j] & ((~0u << lane) << 1) : starts[j];
      if (later) {
        next = 32 * j + __ffs(static_cast<int>(later)) - 1;
        break;
      }
    }
    const int r = 32 * i + lane;
    bulk_load(table + r * kRowBytes, cos_sin + static_cast<int64_t>(p[i]) * (D / 2) * 2, (next - r) * kRowBytes, bar);
  }
}

// The byte offset in a staged block of the 16-byte unit of row `row` and 8-column group `group`.
__device__ __forceinline__ uint32_t group_offset(int row, int group) {
  return (group >> 3) * kChunkBytes + chunk_offset(row, group & 7, 0);
}

// rotate_unit: eight pairs of one row, (x1, x2) 16-byte units of the head's first and second
// half, rotated by the (c, s) pairs at cs (64 bytes).
__device__ __forceinline__ void rotate_unit(uint4 xv, uint4 yv, uint32_t cs, uint4& o1v, uint4& o2v) {
  const uint32_t x1[4] = {xv.x, xv.y, xv.z, xv.w}, x2[4] = {yv.x, yv.y, yv.z, yv.w};
  uint32_t o1[4], o2[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 qv = ld_shared_v4(cs + 16 * i);  // (c, s) of two pairs
    const float2 a = unpack_bf16(x1[i]), b = unpack_bf16(x2[i]);
    const float2 r0 = cuda::rope_rotate(a.x, b.x, __uint_as_float(qv.x), __uint_as_float(qv.y));
    const float2 r1 = cuda::rope_rotate(a.y, b.y, __uint_as_float(qv.z), __uint_as_float(qv.w));
    o1[i] = pack_bf16(r0.x, r1.x);
    o2[i] = pack_bf16(r0.y, r1.y);
  }
  o1v = make_uint4(o1[0], o1[1], o1[2], o1[3]);
  o2v = make_uint4(o2[0], o2[1], o2[2], o2[3]);
}

// Stores a staged 64 x BN block (rows row0.., columns c0..) to y, its heads h0 .. h1 - 1 rotated;
// epilogue thread e. The block is 64 x (BN / 8) units of 8 columns. A rotated unit is eight pairs of
// one row: 16-byte group g of the head's first half and the same group of its second half; `table`
// holds the (cos, sin) rows of the block's 64 positions.
template <int D>
__device__ __forceinline__ void store_block(uint32_t st, int h0, int h1, uint32_t table, int e, __nv_bfloat16* y,
                                            int row0, int c0, int n, int m) {
  constexpr int kGroups = D / 16, kBlockGroups = Cfg<D>::kBN / 8;  // rotated units per head and row; units per row
  const int per_row = (h1 - h0) * kGroups, rotated = 64 * per_row;
  __nv_bfloat16* const block = y + int64_t{row0} * m + c0;
  const int rows = n - row0, cols = m - c0;      // of the block inside y
  auto store = [&](int row, int col, uint4 v) {  // the unit at (row, col) of the block
    if (row < rows && col < cols) *reinterpret_cast<uint4*>(block + row * m + col) = v;
  };
  for (int u = e; u < rotated; u += Cta::kEpilogueThreads) {
    const int row = u / per_row, r = u - row * per_row, head = h0 + r / kGroups, g = r % kGroups;
    const int group = head * (D / 8) + g;  // the first half's unit; the second half's is D / 16 groups on
    const uint32_t lo = group_offset(row, group), hi = group_offset(row, group + kGroups);
    uint4 o1, o2;  // pairs 8g .. 8g + 7 of the row
    rotate_unit(ld_shared_v4(st + lo), ld_shared_v4(st + hi), table + (row * (D / 2) + 8 * g) * 8, o1, o2);
    store(row, head * D + 8 * g, o1);
    store(row, head * D + D / 2 + 8 * g, o2);
  }
  // The columns outside the rotated heads as they are: units of 8 columns before head h0 and from
  // head h1 on.
  const int skip0 = h0 * (D / 8), skipped = (h1 - h0) * (D / 8), plain_per_row = kBlockGroups - skipped;
  for (int u = e; u < 64 * plain_per_row; u += Cta::kEpilogueThreads) {
    const int row = u / plain_per_row, p = u - row * plain_per_row, group = p < skip0 ? p : p + skipped;
    store(row, 8 * group, ld_shared_v4(st + group_offset(row, group)));
  }
}

// store_block for a block whose heads all rotate (the q and k tiles), with the unit's place in the
// row fixed per thread: thread e takes column unit e % kPerRow of rows e / kPerRow, + kRowStep, ...
// (kPerRow divides the 96 epilogue threads), so only the row's part of each address changes. Every
// column of a rotated head lies inside y; rows past n are not stored.
template <int D>
__device__ __forceinline__ void store_block_rotated(uint32_t st, uint32_t table, int e, __nv_bfloat16* y, int row0,
                                                    int c0, int n, int m) {
  constexpr int kGroups = D / 16, kPerRow = Cfg<D>::kBN / D * kGroups, kRowStep = Cta::kEpilogueThreads / kPerRow;
  static_assert(Cta::kEpilogueThreads % kPerRow == 0, "whole rows per pass");
  const int r = e % kPerRow, head = r / kGroups, g = r % kGroups;
  const int lo = head * (D / 8) + g, hi = lo + kGroups;  // 16-byte groups of the pair's halves
  const uint32_t lo_chunk = st + (lo >> 3) * kChunkBytes, hi_chunk = st + (hi >> 3) * kChunkBytes;
  const int lo_g = lo & 7, hi_g = hi & 7;
  const int rows = min(n - row0, 64);
  __nv_bfloat16* out = y + int64_t{row0} * m + c0 + head * D + 8 * g;
  for (int row = e / kPerRow; row < rows; row += kRowStep) {
    const uint32_t base = row * 128, sw = row & 7;
    uint4 o1, o2;
    rotate_unit(ld_shared_v4(lo_chunk + base + ((lo_g ^ sw) << 4)), ld_shared_v4(hi_chunk + base + ((hi_g ^ sw) << 4)),
                table + (row * (D / 2) + 8 * g) * 8, o1, o2);
    __nv_bfloat16* at = out + int64_t{row} * m;
    *reinterpret_cast<uint4*>(at) = o1;
    *reinterpret_cast<uint4*>(at + D / 2) = o2;
  }
}

// store_block for a block without rotated heads (the v tiles): thread e takes 8-column unit
// e % kPerRow of rows e / kPerRow, + kRowStep, ...
template <int D>
__device__ __forceinline__ void store_block_plain(uint32_t st, int e, __nv_bfloat16* y, int row0, int c0, int n,
                                                  int m) {
  constexpr int kPerRow = Cfg<D>::kBN / 8, kRowStep = Cta::kEpilogueThreads / kPerRow;
  static_assert(Cta::kEpilogueThreads % kPerRow == 0, "whole rows per pass");
  const int group = e % kPerRow;
  if (c0 + 8 * group >= m) return;
  const uint32_t chunk = st + (group >> 3) * kChunkBytes;
  const int gi = group & 7;
  const int rows = min(n - row0, 64);
  __nv_bfloat16* out = y + int64_t{row0} * m + c0 + 8 * group;
  for (int row = e / kPerRow; row < rows; row += kRowStep)
    *reinterpret_cast<uint4*>(out + int64_t{row} * m) = ld_shared_v4(chunk + row * 128 + ((gi ^ (row & 7)) << 4));
}

template <int D>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    rope_linear_fwd_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                           __nv_bfloat16* __restrict__ y, const float* __restrict__ cos_sin,
                           const int32_t* __restrict__ doc_start, const int n, const int m, const int k, const int t,
                           const int r0, const int n_rot) {
  using C = Cfg<D>;
  constexpr int kBN = C::kBN;
  constexpr int kStages = C::kStages;
  extern __shared__ unsigned char smem[];
  const FusedSmem<C, kStages, kCluster> sm(smem);
  const auto& [pipe, hs] = sm;
  const uint32_t table = pipe.stage0 + C::kTableOffset;
  const uint32_t table_full = hs.end();
  const TileGrid<kCluster> grid(n, cdiv(m, kBN));
  const int nk = cdiv(k, kBK);
  const int wg = warpgroup_index();
  sm.init_barriers(1);  // table_full

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_x);
      prefetch_tensor_map(&tm_w);
      load_stages(pipe, grid, nk, [&](int tile) {
        const int m0 = grid.row0(tile), c0 = grid.col_block(tile) * kBN;
        return [&, m0, c0](uint32_t stage, uint32_t bar, int kb) {
          tma_load_4d(stage, &tm_x, bar, kb * kBK, m0, 0, 0);
          load_weight_halves<kCluster>(stage + C::kABytes, &tm_w, bar, C::kBBytes / 2, grid.rank,
                                       [&](int half) { return make_int4(kb * kBK, c0 + half * (kBN / 2), 0, 0); });
        };
      });
    } else if (threadIdx.x >= 32) {
      const int e = epilogue_thread();
      int nt = 0, nr = 0;  // tiles, tiles with rotated heads
      for (int tile = grid.first(); tile < grid.count; tile += grid.step(), ++nt) {
        const int m0 = grid.row0(tile), c0 = grid.col_block(tile) * kBN;
        // The tile's rotated heads h0 .. h1 - 1 (r0, n_rot and c0 are whole heads).
        const int h0 = min(max(r0 - c0, 0), kBN) / D, h1 = min(max(r0 + n_rot - c0, 0), kBN) / D;
        const bool rotates = h1 > h0;
        if (rotates && (doc_start ? e < 32 : e == 0)) {
          // While the math warpgroups work on this tile, once every epilogue warp is done with the
          // table (it read the last tile's block 1 before arriving on freed(1)).
          hs.wait_free(1, nt);
          fence_proxy_async_shared();
          if (doc_start)
            load_table_docs<D>(table, m0, t, n, cos_sin, doc_start, table_full);
          else
            load_table<D>(table, m0, t, cos_sin, table_full);
        }
        for (int w = 0; w < 2; ++w) {
          hs.wait_staged(w, nt);
          if (rotates && w == 0) mbar_wait(table_full, nr & 1);
          const uint32_t tw = table + w * (C::kTableBytes / 2);
          if (h0 == 0 && h1 == kBN / D)
            store_block_rotated<D>(hs.block(w, nt), tw, e, y, m0 + 64 * w, c0, n, m);
          else if (h1 == h0)
            store_block_plain<D>(hs.block(w, nt), e, y, m0 + 64 * w, c0, n, m);
          else
            store_block<D>(hs.block(w, nt), h0, h1, tw, e, y, m0 + 64 * w, c0, n, m);
          hs.release(w, nt);
        }
        nr += rotates;
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1;
    math_k_major<kBN, kBK>(pipe, grid, nk, C::kABytes, hs, w);
  }
  cluster_sync();  // no CTA leaves while the other may still arrive on its barriers
}

template <int D>
void launch(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, int64_t t, int64_t r0, int64_t n_rot,
            const float* cos_sin, const int32_t* doc_start) {
  using C = Cfg<D>;
  constexpr int kBN = C::kBN;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  const CUtensorMap tm_x = matrix_map(x.ptr, n, k, k, 1, 0, kBM, kBK);
  const CUtensorMap tm_w = matrix_map(w.ptr, m, k, k, 1, 0, kBN / 2, kBK);
  const int tiles = cdiv(cdiv(static_cast<int>(n), kBM), kCluster) * cdiv(static_cast<int>(m), kBN);
  launch_clusters<kCluster>(rope_linear_fwd_kernel<D>, tiles, C::kSmem, cuda::stream_of(ctx), tm_x, tm_w,
                            y.data<__nv_bfloat16>(), cos_sin, doc_start, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), static_cast<int>(t), static_cast<int>(r0), static_cast<int>(n_rot));
}

}  // namespace
}  // namespace rope_sm90

void rope_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, int64_t T, int64_t r0,
                          int64_t n_rot, int64_t head_dim, const float* cos_sin, const int32_t* doc_start) {
  LINAC_CHECK(x.size(0) < (int64_t{1} << 31) - rope_sm90::kBM, "rope_linear_fwd: too many rows for one call");
  if (head_dim == 64)
    rope_sm90::launch<64>(ctx, x, w, y, T, r0, n_rot, cos_sin, doc_start);
  else if (head_dim == 96)
    rope_sm90::launch<96>(ctx, x, w, y, T, r0, n_rot, cos_sin, doc_start);
  else
    rope_sm90::launch<128>(ctx, x, w, y, T, r0, n_rot, cos_sin, doc_start);
}

}  // namespace linac
