// The state warps' chunk update, shared by the fused kernels (taylor_attn_fused.cuh) and the segment
// totals kernel (taylor_attn_totals.cu), so both sum a chunk's products in the same order and a
// segment's total carries the bits the fused pass would have reached:
//   S += phi(X^)^T Y   over the kC rows of one chunk, for the two feature blocks fb0, fb0 + 1 a warp
//                      holds (S: their 32 rows x DvP columns of the f32 state, mma accumulators).
// X is the chunk's [kC, kF] rows as stored (x^ = x / 2), Y its [kC, >= DvP] value rows (v~ or g~);
// phi(X^)^T is built straight into mma A fragments (feature order: taylor_attn_common.cuh).
#pragma once

#include <type_traits>

#include "taylor_attn/taylor_attn_common.cuh"

namespace linac::taylor_cuda {

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

// A k-step per 16 tokens: the lane holds tokens tb, tb + 1, tb + 8, tb + 9 of feature rows g and
// g + 8 of each of its two blocks. ntv = DvP / 8 value n-tiles are summed (those past it untouched
// but for the pair that straddles it, whose columns past DvP read Y's zero padding). kQuad: the
// warp's blocks are all quadratic (fb0 + NB <= kF): no selects, no scalings (NOTES.md: these
// instructions, not the tensor pipe, bound the state warps and the totals kernel). keep(token):
// whether the chunk's row enters; the others' phi is zero (AllRows folds away).
template <bool kQuad, int NB, int NT, class Keep>
__device__ __forceinline__ void state_add_chunk_as(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx, const bf16_t* Ys,
                                                   int ldy, int fb0, int ntv, Keep keep) {
  using linac::cuda::pack_bf16;
  using linac::cuda::to_float;
  const Frag f;
  const bool first = f.g == 0;
  constexpr bool kAll = std::is_same_v<Keep, AllRows>;
  auto phi = [&](int fb, float xf, float xj, bool first_row, bool in) {
    const float p = kQuad ? xf * xj * kQuadScale : phi_of(fb, xf, xj, first_row);
    if constexpr (kAll) return p;
    return in ? p : 0.f;
  };
  auto load = [](bf16_t x) { return kQuad ? to_float(x) : scaled(x); };
#pragma unroll
  for (int kstep = 0; kstep < kC / 16; ++kstep) {
    const int tb = 16 * kstep + 2 * f.q;
    float xg[4], xg8[4], xf[NB][4];
    bool in[4] = {true, true, true, true};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (!kAll) in[i] = keep(tb + (i & 1) + 8 * (i >> 1));
      const bf16_t* row = Xs + (tb + (i & 1) + 8 * (i >> 1)) * ldx;
      xg[i] = load(row[f.g]);
      xg8[i] = load(row[f.g + 8]);
#pragma unroll
      for (int bl = 0; bl < NB; ++bl) xf[bl][i] = kQuad || fb0 + bl < kF ? load(row[fb0 + bl]) : 0.f;
    }
    uint32_t A[NB][4];
#pragma unroll
    for (int bl = 0; bl < NB; ++bl) {
      const int fb = fb0 + bl;
      A[bl][0] = pack_bf16(phi(fb, xf[bl][0], xg[0], first, in[0]), phi(fb, xf[bl][1], xg[1], first, in[1]));
      A[bl][1] = pack_bf16(phi(fb, xf[bl][0], xg8[0], false, in[0]), phi(fb, xf[bl][1], xg8[1], false, in[1]));
      A[bl][2] = pack_bf16(phi(fb, xf[bl][2], xg[2], first, in[2]), phi(fb, xf[bl][3], xg[3], first, in[3]));
      A[bl][3] = pack_bf16(phi(fb, xf[bl][2], xg8[2], false, in[2]), phi(fb, xf[bl][3], xg8[3], false, in[3]));
    }
    state_kstep_mma(S, A, Ys, ldy, kstep, ntv);
  }
}

template <int NB, int NT, class Keep = AllRows>
__device__ __forceinline__ void state_add_chunk(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx, const bf16_t* Ys,
                                                int ldy, int fb0, int ntv, Keep keep = {}) {
  if (fb0 + NB <= kF)  // warp-uniform
    state_add_chunk_as<true>(S, Xs, ldx, Ys, ldy, fb0, ntv, keep);
  else
    state_add_chunk_as<false>(S, Xs, ldx, Ys, ldy, fb0, ntv, keep);
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
__device__ __forceinline__ void state_add_chunk_docs(float (&S)[NB][NT][4], const bf16_t* Xs, int ldx, const bf16_t* Ys,
                                                     int ldy, int fb0, int ntv, const int* starts, int t0, int rows) {
  chunk_update_docs<kRev>(S, starts, t0, rows,
                          [&](auto keep) { state_add_chunk(S, Xs, ldx, Ys, ldy, fb0, ntv, keep); });
}

// fn(element, state row, state column) over a state warp's accumulator elements within DvP.
template <int NB, int NT, class Fn>
__device__ __forceinline__ void each_state_element(float (&S)[NB][NT][4], int fb0, int ntv, Fn&& fn) {
  const Frag f;
#pragma unroll
  for (int bl = 0; bl < NB; ++bl)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (nt < ntv) fn(S[bl][nt][e], 16 * (fb0 + bl) + f.row(0, e), f.col(0, nt, e));
}

}  // namespace linac::taylor_cuda
