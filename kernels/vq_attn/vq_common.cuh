// Shared by the CUDA VQ-attention kernels: the carve of ctx.workspace, a GEMM on raw pointers,
// the score of one (query, entry) pair, and the order-preserving list of a tile's tokens whose
// code matches (per-code sums without atomics).
//
// Packed layout, workspace: vq_packed.h.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_common.cuh"
#include "matmul/matmul.h"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_packed.h"

namespace linac::vq_cuda {

// Carves ctx.workspace with the largest chunk that fits (at most one head's blocks); refuses a
// workspace below one block's chunk in one line naming `op` and the bytes needed.
Ws carve(const Ctx& ctx, const Geo& g, size_t act_bytes, bool backward, const char* op);

// C (f32) = A @ B (+ beta C) over `batch` matrices at the given element strides; A and B of dtype
// ab (bf16 or f32) on the GPU, stored row-major with transposes as in matmul.h.
struct Operand {
  const void* p;
  int64_t ld, stride;
  bool trans;
};
void gemm(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, int64_t batch, Operand a, Operand b, float* c,
          int64_t ldc, int64_t stride_c, float beta);
// The same GEMM with the f32 table t (codebook or rho, [rows, Dk] per head) as B: hi part, then
// the lo part accumulated when ab is bf16.
void gemm_table(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, Operand a, const void* hi,
                const void* lo, bool trans_b, float* c, int64_t ldc, float beta);

// Packs q, khat (+ u.khat), v, the cache (scan), the bias tables and the hi/lo parts, for the
// forward and the backward alike (vq_prepare.cu).
template <class T>
void prepare(const Ctx& ctx, const Geo& g, const VqAttnLayout& L, const Ws& w, const T* q, const T* khat,
             const int32_t* z, const T* v, const float* codebook, const float* u, const float* vr, const float* rho);
// The score GEMMs of blocks [i0, i0 + c) of head h: swin, scache, pos.
void chunk_scores(const Geo& g, const Ws& w, DType act, int64_t h, int64_t i0, int64_t c);
// Per (p, t, d): dst[p Tp + t, d] = src(b, t, h, d) + add[h, d] (add may be null), zero for t >= T.
template <class T>
void pack(const Ctx& ctx, const Geo& g, const T* src, VqAttnLayout::Strides s, int64_t D, const float* add, T* dst);
// Per packed row: out[p Tp + t] = x(b,t,h,:) . (vec[h,:] if y is null, else y(b,t,h,:)), 0 for t >= T.
template <class T>
void row_dots(const Ctx& ctx, const Geo& g, const T* x, VqAttnLayout::Strides xs, int64_t D, const float* vec,
              const T* y, VqAttnLayout::Strides ys, float* out);

// Counts and means of the cache each block reads (blocks <= n-2), vq_cache_scan.cu.
template <class T>
void cache_scan(const Ctx& ctx, const Geo& g, const T* v, VqAttnLayout::Strides vs, const int32_t* z, float* counts,
                T* ubar);
// gcache^(m) <- sum_{n >= m+2} gcache^(n) / N^(n) (0 where N = 0), in place; vq_cache_scan.cu.
void cache_grad_sweep(const Ctx& ctx, const Geo& g, const float* counts, float* gcache);

// Row r of a chunk starting at block i0, as block, pair, token and head.
struct Row {
  int64_t i, l, p, n, t, h, b;
};
__host__ __device__ inline Row row_of(const Geo& g, int64_t i0, int64_t r) {
  Row w;
  w.i = i0 + r / g.Lb;
  w.l = r % g.Lb;
  w.p = w.i / g.R;
  w.n = w.i % g.R;
  w.t = w.n * g.Lb + w.l;
  w.h = w.p / g.B;
  w.b = w.p % g.B;
  return w;
}

// Window entry e of row w: -inf where masked.
__device__ __forceinline__ float window_score(const Geo& g, const Row& w, int64_t e, const float* swin_row,
                                              const float* pos_row, const float* ub, const float* vrho_h) {
  const int64_t j = (w.n - 1) * g.Lb + e;
  if (j < 0 || j > w.t) return -INFINITY;
  float s = swin_row[e] + ub[w.p * g.Tp + j];
  const int64_t d = w.t - j;
  if (d <= g.Lb) s += pos_row[d] + vrho_h[d];
  return s;
}
// Cache entry s of row w (counts_i = the counts block i reads): -inf where empty.
__device__ __forceinline__ float cache_score(int64_t s, const float* scache_row, const float* ucb_h,
                                             const float* counts_i) {
  const float N = counts_i[s];
  return N > 0 ? scache_row[s] + ucb_h[s] + logf(N) : -INFINITY;
}

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
