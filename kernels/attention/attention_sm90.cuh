// Shared by the Hopper attention kernels (attention_fwd_sm90.cu,
// attention_bwd_sm90.cu): tiles of one head's rows brought in by TMA, the
// softmax pieces on wgmma accumulators, the output rows.
//
// A CTA is one loading warpgroup (its first thread issues every TMA copy; the
// warpgroup hands its registers to the others) and kMathWGs math warpgroups of
// 64 rows each. Streamed tiles rotate through kStages shared-memory stages
// guarded by mbarriers: "full" (the copies of a stage have landed) and "empty"
// (every math warp is done with it), so loads run ahead of the math without any
// CTA-wide barrier. Tiles are [rows, DP] bf16 as DP / 64 column chunks of
// 128-byte swizzled rows (common/sm90.cuh), DP = attention_sm90_tile_cols(D) the head dim
// rounded up to 64 or 128: the copy engine fills the columns past D with zeros,
// so every product over them adds nothing and the accumulators' columns past D
// stay zero; they are never written out. (Head dims 80, 96, 112 thus run the
// 128-column kernels, paying for the padding, at about twice the mma.sync
// kernels' speed.)
#pragma once

#include <algorithm>

#include "attention/attention_common.cuh"
#include "common/sm90.cuh"
#include "common/tensor_map.h"

namespace linac::attn::sm90k {

using namespace linac::sm90;

// Work in tickets over units (a (batch, head) or (batch, key/value head)) x blocks (of queries or
// keys), taken in groups of `group` units whose tiles stay in L2 together (units_in_l2): within a
// group the highest block first, then the next lower, unit fastest.
struct GroupedTicket {
  int unit, block;
};
__device__ __forceinline__ GroupedTicket grouped_ticket(int t, int n_units, int n_blocks, int group) {
  const int g0 = t / (group * n_blocks) * group, gn = min(group, n_units - g0), r = t - g0 * n_blocks;
  return {g0 + r % gn, n_blocks - 1 - r / gn};
}
// Units per ticket group: as many as keep `bytes_per_unit` each in about 8 MiB of L2 (H200, the
// backward's dQ tiles: 2 to 16 MiB measure the same, 32 MiB up to 5% slower at D = 128).
inline int units_in_l2(int64_t bytes_per_unit, int64_t n_units) {
  return static_cast<int>(std::clamp<int64_t>((int64_t{8} << 20) / bytes_per_unit, 1, n_units));
}

// Register budgets after the hand-over (setmaxnreg): the loading warpgroup
// keeps kLoadRegs, each math warpgroup gets kMathRegs; 65536 registers per SM,
// one CTA per SM.
template <int kMathWGs>
struct RegBudget;
template <>
struct RegBudget<2> {
  static constexpr int kLoad = 24, kMath = 240;
};
template <>
struct RegBudget<3> {
  static constexpr int kLoad = 32, kMath = 160;
};

// TMA map of a [B,T,heads,D] argument with boxes of `rows` tokens; heads is the argument's own
// (H for q, o and their gradients, Hk for k, v and theirs).
inline CUtensorMap rows_map(const Tensor& x, const AttentionLayout& L, const AttentionLayout::Strides& s, int rows) {
  return head_rows_tensor_map(x.ptr, L.B, L.T, x.size(2), L.D, s.b, s.t, rows);
}

// Issues the copies of tokens [t0, t0 + ROWS) of head (b, h) into the tile at
// dst (D / 64 column chunks), completing on `bar`. The caller announced the
// bytes (tile_bytes) on `bar`.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int t0, int h, int b) {
#pragma unroll
  for (int c = 0; c < D / 64; ++c) tma_load_4d(dst + c * ROWS * 128, map, bar, c * 64, t0, h, b);
}
template <int ROWS, int D>
constexpr uint32_t tile_bytes = ROWS* D * 2;

// The P (or dS) A fragment of k-step kk from a 64 x N accumulator: columns 16
// kk .. 16 kk + 15.
template <int N>
__device__ __forceinline__ void acc_to_a(const float (&c)[N / 2], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16(c[8 * kk + 0], c[8 * kk + 1]);
  a[1] = pack_bf16(c[8 * kk + 2], c[8 * kk + 3]);
  a[2] = pack_bf16(c[8 * kk + 4], c[8 * kk + 5]);
  a[3] = pack_bf16(c[8 * kk + 6], c[8 * kk + 7]);
}

// Writes rows row0 and row0 + 8 (r = 0, 1) of a 64 x N accumulator times `scale` as bf16, its
// first `cols` columns (a multiple of 8), to the head whose first column is x of a
// [B,T,heads,D] tensor (added to what is there with `accumulate`, in f32, rounded once); rows at
// or past T are dropped.
template <int N>
__device__ __forceinline__ void store_rows(bf16_t* x, const AttentionLayout::Strides& s, int b, int T, int row0,
                                           const float (&acc)[N / 2], const float (&scale)[2], int cols,
                                           bool accumulate = false) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    if (t >= T) continue;
    bf16_t* row = x + b * s.b + int64_t{t} * s.t + 2 * tq;
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
      if (8 * j < cols) {
        float v0 = acc[4 * j + 2 * r] * scale[r], v1 = acc[4 * j + 2 * r + 1] * scale[r];
        if (accumulate) {
          const float2 old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + 8 * j));
          v0 += old.x, v1 += old.y;
        }
        *reinterpret_cast<uint32_t*>(row + 8 * j) = pack_bf16(v0, v1);
      }
  }
}

// store_rows of a head of D columns (a multiple of 16, at most the accumulator's N) with each RoPE
// pair (i, i + D/2) of a row at position t turned back by its angle (rope.h's backward: y_i = x_i
// cos + x_{i+D/2} sin, y_{i+D/2} = x_{i+D/2} cos - x_i sin) before the bf16 rounding. The thread's
// columns 8j + 2tq + e (j < D/16) pair with those of j + D/16, so both ends of every pair are in
// its registers; cos_sin is rope_table_cuda's [T][D/2] of (cos, sin), read 16 bytes (columns c
// and c + 1) at a time. starts: null, or row b's document starts ([T] int32), which make the
// position t - starts[t]. x: the head's first column.
template <int N, int D = N>
__device__ __forceinline__ void store_rows_rope(bf16_t* x, const AttentionLayout::Strides& s, int b, int T, int row0,
                                                const float (&acc)[N / 2], const float (&scale)[2],
                                                const float* __restrict__ cos_sin,
                                                const int32_t* __restrict__ starts) {
  const int tq = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    if (t >= T) continue;
    bf16_t* row = x + b * s.b + int64_t{t} * s.t + 2 * tq;
    const int pos = starts ? t - __ldg(starts + t) : t;
    const float4* cs = reinterpret_cast<const float4*>(cos_sin + int64_t{pos} * D + 4 * tq);
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      const float4 c = __ldg(cs + 4 * j);  // (cos, sin) of columns 8j + 2tq and 8j + 2tq + 1
      const int lo = 4 * j + 2 * r, hi = 4 * (j + D / 16) + 2 * r;
      const float x0 = acc[lo] * scale[r], x1 = acc[lo + 1] * scale[r];
      const float y0 = acc[hi] * scale[r], y1 = acc[hi + 1] * scale[r];
      *reinterpret_cast<uint32_t*>(row + 8 * j) = pack_bf16(x0 * c.x + y0 * c.y, x1 * c.z + y1 * c.w);
      *reinterpret_cast<uint32_t*>(row + 8 * (j + D / 16)) = pack_bf16(y0 * c.x - x0 * c.y, y1 * c.z - x1 * c.w);
    }
  }
}

}  // namespace linac::attn::sm90k
