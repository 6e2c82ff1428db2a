// The state warps' chunk update, shared by the fused kernels (taylor_attn_fused.cuh) and the segment
// totals kernel (taylor_attn_totals.cu), so both sum a chunk's products in the same order and a
// segment's total carries the bits the fused pass would have reached:
//   S += phi(X^)^T Y   over the kC rows of one chunk, for the tiles a warp holds (S: their 16-row
//                      strips x DvP columns of the f32 state, mma accumulators).
// X is the chunk's [kC, kF] rows as stored (x^ = x / 2), Y its [kC, >= DvP] value rows (v~ or g~);
// phi(X^)^T is built straight into mma A fragments (feature order: taylor_attn_common.cuh). The
// state's quadratic rows come in equal pairs (16 f + j and 16 j + f), so its 288 rows are summed as
// ten tiles of 16 distinct rows (taylor_attn_state_tiles.h) and each sum stored to both its rows.
#pragma once

#include <type_traits>

#include "taylor_attn/taylor_attn_common.cuh"
#include "taylor_attn/taylor_attn_state_tiles.h"

namespace linac::taylor_cuda {

static_assert(taylor_tiles::kF == kF && taylor_tiles::kStateRows == kRows, "the tiles cover this state layout");

// Feature jj of block fb of a row whose prescaled values are xf = x[fb] and xj = x[jj] (first: jj == 0),
// the same f32 arithmetic as feature().
__device__ __forceinline__ float phi_of(int fb, float xf, float xj, bool first) {
  if (fb < kF) return xf * xj * kRsqrt2;
  if (fb == kF) return xj;
  return fb == kF + 1 && first ? 1.f : 0.f;
}

// x^ = x / 2 (F^(-1/4) at F = 16, exact), as prep stores it.
__device__ __forceinline__ float scaled(bf16_t x) { return 0.5f * linac::cuda::to_float(x); }

// The quadratic features x^_f x^_j / sqrt 2 straight from the stored x (x^ = x / 2): x_f x_j is
// exact in f32 (bf16 significands) and powers of two scale exactly, so x_f x_j kQuadScale rounds to
// phi_of's value without the two scalings.
constexpr float kQuadScale = 0.25f * kRsqrt2;

// Every row of a chunk enters the state (the stream, and a chunk in which no document starts).
struct AllRows {
  __device__ __forceinline__ bool operator()(int) const { return true; }
};

// One k-step (16 tokens) of S += phi^T Y: the A fragments of the warp's NB feature tiles against
// the step's Y fragments, n-tile pairs up to ntv. Every update of a state or a total runs it, so
// the same products are summed in the same order wherever a state row sits in its tile.
template <int NB, int NT>
__device__ __forceinline__ void state_kstep_mma(float (&S)[NB][NT][4], const uint32_t (&A)[NB][4], const bf16_t* Ys,
                                                int ldy, int kstep, int ntv) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    if (2 * np >= ntv) break;
    uint32_t B[4];
    sm80::ldsm_b_kn(Ys, ldy, 16 * kstep, 16 * np, B);
#pragma unroll
    for (int bl = 0; bl < NB; ++bl) {
      sm80::mma_bf16(S[bl][2 * np], A[bl], B[0], B[1]);
      sm80::mma_bf16(S[bl][2 * np + 1], A[bl], B[2], B[3]);
    }
  }
}

// The state's ten tiles (taylor_attn_state_tiles.h): each distinct quadratic product once, the
// diagonal of x_8..x_15 with the constant, the linear features. One chunk's update of the NB
// tiles tiles[] (consecutive) a warp holds, a k-step per 16 tokens: the lane builds the A
// fragments of its rows g and g + 8 in each tile for tokens tb, tb + 1, tb + 8, tb + 9. kTail:
// the warp's tiles are 8 and/or 9 (else all are products). ntv = DvP / 8 value n-tiles are summed
// (those past it untouched but for the pair that straddles it, whose columns past DvP read Y's
// zero padding). keep(token): whether the chunk's row enters; the others' phi is zero (AllRows
// folds away). A product is (x_f x_j) kQuadScale from the stored x: these instructions, not the
// tensor pipe, bound the state warps and the totals kernel (NOTES.md).
template <bool kTail, int NB, int NT, class Keep>
__device__ __forceinline__ void state_tiles_add_chunk_as(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx,
                                                         const bf16_t* Ys, int ldy, const int (&tiles)[NB], int ntv,
                                                         Keep keep) {
  using linac::cuda::pack_bf16;
  using linac::cuda::to_float;
  const Frag f;
  constexpr bool kAll = std::is_same_v<Keep, AllRows>;
  // The feature columns of the lane's rows g and g + 8 in each product tile (two each).
  int c[NB][4] = {};
  if constexpr (!kTail) {
#pragma unroll
    for (int bl = 0; bl < NB; ++bl) {
      const taylor_tiles::Pair lo = taylor_tiles::tile_pair(tiles[bl], f.g),
                               hi = taylor_tiles::tile_pair(tiles[bl], f.g + 8);
      c[bl][0] = lo.f, c[bl][1] = lo.j, c[bl][2] = hi.f, c[bl][3] = hi.j;
    }
  }
#pragma unroll
  for (int kstep = 0; kstep < kC / 16; ++kstep) {
    const int tb = 16 * kstep + 2 * f.q;
    float lo[NB][4], hi[NB][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = tb + (i & 1) + 8 * (i >> 1);
      bool in = true;
      if constexpr (!kAll) in = keep(tok);
      const bf16_t* row = Xs + tok * ldx;
#pragma unroll
      for (int bl = 0; bl < NB; ++bl) {
        float l, h;
        if (!kTail) {
          l = to_float(row[c[bl][0]]) * to_float(row[c[bl][1]]) * kQuadScale;
          h = to_float(row[c[bl][2]]) * to_float(row[c[bl][3]]) * kQuadScale;
        } else if (tiles[bl] == taylor_tiles::kTailTile) {  // warp-uniform: row g is (8 + g, 8 + g)
          const float x = to_float(row[8 + f.g]);
          l = x * x * kQuadScale;
          h = f.g == 0 ? 1.f : 0.f;
        } else {
          l = scaled(row[f.g]);
          h = scaled(row[f.g + 8]);
        }
        lo[bl][i] = kAll || in ? l : 0.f;
        hi[bl][i] = kAll || in ? h : 0.f;
      }
    }
    uint32_t A[NB][4];
#pragma unroll
    for (int bl = 0; bl < NB; ++bl) {
      A[bl][0] = pack_bf16(lo[bl][0], lo[bl][1]);
      A[bl][1] = pack_bf16(hi[bl][0], hi[bl][1]);
      A[bl][2] = pack_bf16(lo[bl][2], lo[bl][3]);
      A[bl][3] = pack_bf16(hi[bl][2], hi[bl][3]);
    }
    state_kstep_mma(S, A, Ys, ldy, kstep, ntv);
  }
}

template <int NB, int NT, class Keep = AllRows>
__device__ __forceinline__ void state_tiles_add_chunk(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx,
                                                      const bf16_t* Ys, int ldy, const int (&tiles)[NB], int ntv,
                                                      Keep keep = {}) {
  if (tiles[0] < taylor_tiles::kTailTile)  // warp-uniform
    state_tiles_add_chunk_as<false>(S, Xs, ldx, Ys, ldy, tiles, ntv, keep);
  else
    state_tiles_add_chunk_as<true>(S, Xs, ldx, Ys, ldy, tiles, ntv, keep);
}

// A chunk's update with document bounds (taylor_attn.h): at a chunk in which a document starts the
// state restarts, and only the rows the next state holds enter it: forward the keys of the chunk's
// last document, reverse (kRev) the queries whose document started before the chunk. starts: the
// chunk's document starts (tokens [t0, t0 + rows)); add(keep) runs the update with keep(token)
// saying whether a row enters (AllRows: every row). The rows are the scan kernel's, so the sums
// are its bits.
template <bool kRev, int NB, int NT, class Add>
__device__ __forceinline__ void chunk_update_docs(float (&S)[NB][NT][4], const int* starts, int t0, int rows,
                                                  Add&& add) {
  const int last = starts[rows - 1];
  if (last < t0) return add(AllRows{});  // no start in the chunk (CTA-uniform)
#pragma unroll
  for (int bl = 0; bl < NB; ++bl)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[bl][nt][e] = 0.f;
  add([&](int tok) { return kRev ? starts[tok] < t0 : t0 + tok >= last; });
}

template <bool kRev, int NB, int NT>
__device__ __forceinline__ void state_tiles_add_chunk_docs(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx,
                                                           const bf16_t* Ys, int ldy, const int (&tiles)[NB], int ntv,
                                                           const int* starts, int t0, int rows) {
  chunk_update_docs<kRev>(S, starts, t0, rows,
                          [&](auto keep) { state_tiles_add_chunk(S, Xs, ldx, Ys, ldy, tiles, ntv, keep); });
}

// The state rows that each of a lane's accumulator rows (g, g + 8: hf = 0, 1) of its tiles tiles[] is
// stored to (taylor_tiles::tile_row_targets).
template <int NB>
__device__ __forceinline__ void lane_row_targets(const int (&tiles)[NB], taylor_tiles::Targets (&to)[NB][2]) {
  const Frag f;
#pragma unroll
  for (int bl = 0; bl < NB; ++bl)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) to[bl][hf] = taylor_tiles::tile_row_targets(tiles[bl], f.g + 8 * hf);
}

// fn(element, the state rows it is stored to, state column) over a state warp's accumulator
// elements within DvP (its tiles tiles[]).
template <int NB, int NT, class Fn>
__device__ __forceinline__ void each_state_element(float (&S)[NB][NT][4], const int (&tiles)[NB], int ntv, Fn&& fn) {
  const Frag f;
  taylor_tiles::Targets to[NB][2];
  lane_row_targets(tiles, to);
#pragma unroll
  for (int bl = 0; bl < NB; ++bl)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (nt < ntv) fn(S[bl][nt][e], to[bl][e >> 1], f.col(0, nt, e));
}

// fn(state row, value) for each row a tile row's sum v is stored to: its own row, and its twin
// (v again, or zero for the constant block's padding rows).
template <class Fn>
__device__ __forceinline__ void each_target(const taylor_tiles::Targets& t, float v, Fn&& fn) {
  fn(t.sum, v);
  if (t.other >= 0) fn(t.other, t.other_zero ? 0.f : v);
}

}  // namespace linac::taylor_cuda
