// Helpers shared by the VQ CUDA kernels: block geometry, the workspace carve, the cache scan
// launcher, and the order-preserving list of the tokens of a tile whose code matches (so per-code
// sums run over them serially: fixed order, no atomics).
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"

namespace linac::vq_cuda {

__host__ __device__ inline int64_t n_blocks(const VqAttnLayout& L) { return (L.T + L.Lb - 1) / L.Lb; }
// First key of query t's window (the previous block's first token).
__host__ __device__ inline int64_t window_start(const VqAttnLayout& L, int64_t t) {
  return t < L.Lb ? 0 : (t / L.Lb - 1) * L.Lb;
}

// f32 scratch of one batch group of L.B sequences, carved from ctx.workspace in this order:
// counts [B,H,R,S], means [B,H,R,S,Dv] (the backward reuses it for the cache-mean gradients),
// and for the backward: delta [B,T,H] (dout . o), gqu, gqr [B,T,H,Dk] (the q+u and q+vr parts of
// dq), band [B,H,T,Lb+1] (score gradients by distance, for drho).
struct Scratch {
  float *counts, *means, *delta, *gqu, *gqr, *band;
};
inline int64_t pad64(int64_t n) { return (n + 63) / 64 * 64; }
inline int64_t cache_floats(const VqAttnLayout& L) {
  const int64_t R = n_blocks(L);
  return pad64(L.B * L.H * R * L.S) + pad64(L.B * L.H * R * L.S * L.Dv);
}
inline int64_t backward_floats(const VqAttnLayout& L) {
  const int64_t n = L.B * L.T * L.H;
  return cache_floats(L) + pad64(n) + 2 * pad64(n * L.Dk) + pad64(n * (L.Lb + 1));
}
inline Scratch carve(const VqAttnLayout& L, void* workspace) {
  const int64_t R = n_blocks(L), n = L.B * L.T * L.H;
  Scratch s;
  s.counts = static_cast<float*>(workspace);
  s.means = s.counts + pad64(L.B * L.H * R * L.S);
  s.delta = s.means + pad64(L.B * L.H * R * L.S * L.Dv);
  s.gqu = s.delta + pad64(n);
  s.gqr = s.gqu + pad64(n * L.Dk);
  s.band = s.gqr + pad64(n * L.Dk);
  return s;
}

// Scores of queries t0..t0+rows-1 (row r: its window keys j0..t, then the S cache entries, -inf
// where empty or past the row's entries; rows of 2 Lb + S floats) and the biased queries
// qu = q + u, qr = q + vr [rows, Dk], all in shared memory. Ends with a barrier.
template <class T, int kThreads>
__device__ void query_tile_scores(const VqAttnLayout& L, const T* __restrict__ q, const T* __restrict__ khat,
                                  const float* __restrict__ codebook, const float* __restrict__ u,
                                  const float* __restrict__ vr, const float* __restrict__ rho,
                                  const float* __restrict__ counts, int64_t bh, int64_t t0, int rows, float* scores,
                                  float* qu, float* qr) {
  const int64_t E = 2 * L.Lb + L.S, R = n_blocks(L), b = bh / L.H, h = bh % L.H;
  const float* cb = codebook + h * L.S * L.Dk;
  const float* rho_h = rho + h * (L.Lb + 1) * L.Dk;
  for (int64_t i = threadIdx.x; i < rows * L.Dk; i += kThreads) {
    const int64_t r = i / L.Dk, d = i % L.Dk;
    const float qv = cuda::to_float(q[b * L.q.b + (t0 + r) * L.q.t + h * L.Dk + d]);
    qu[i] = qv + u[h * L.Dk + d];
    qr[i] = qv + vr[h * L.Dk + d];
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rows * E; i += kThreads) {
    const int64_t r = i / E, e = i % E, t = t0 + r, j0 = window_start(L, t), nw = t - j0 + 1;
    const float* qur = qu + r * L.Dk;
    float sc = -INFINITY;
    if (e < nw) {
      const int64_t j = j0 + e;
      const T* kj = khat + b * L.khat.b + j * L.khat.t + h * L.Dk;
      sc = 0;
      for (int64_t d = 0; d < L.Dk; ++d) sc += qur[d] * cuda::to_float(kj[d]);
      if (t - j <= L.Lb) {
        const float* rd = rho_h + (t - j) * L.Dk;
        const float* qrr = qr + r * L.Dk;
        float pos = 0;
        for (int64_t d = 0; d < L.Dk; ++d) pos += qrr[d] * rd[d];
        sc += pos;
      }
    } else if (e < nw + L.S) {
      const int64_t c = e - nw;
      const float N = counts[(bh * R + t / L.Lb) * L.S + c];
      if (N > 0) {
        const float* cc = cb + c * L.Dk;
        sc = 0;
        for (int64_t d = 0; d < L.Dk; ++d) sc += qur[d] * cc[d];
        sc += logf(N);
      }
    }
    scores[i] = sc;
  }
  __syncthreads();
}

// Counts and means of the cache each block reads (blocks <= n-2), spec §2.6; vq_cache_scan.cu.
template <class T>
void launch_cache_scan(const Ctx& ctx, const VqAttnLayout& L, const T* v, const int32_t* z, float* counts,
                       float* means);

// Every thread of a CTA of kThreads (a multiple of 32) passes `hit` for its token of the tile;
// returns the number of hits and leaves their thread indices, in order, in hits[0..n).
// warp_hits is shared scratch of kThreads / 32 ints. Ends with a barrier.
template <int kThreads>
__device__ int compact_hits(bool hit, int* hits, int* warp_hits) {
  const unsigned mask = __ballot_sync(0xffffffffu, hit);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_hits[warp] = __popc(mask);
  __syncthreads();
  int offset = 0, total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) offset += warp_hits[w];
    total += warp_hits[w];
  }
  if (hit) hits[offset + __popc(mask & ((1u << lane) - 1))] = static_cast<int>(threadIdx.x);
  __syncthreads();
  return total;
}

}  // namespace linac::vq_cuda
