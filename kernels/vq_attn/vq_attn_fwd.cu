// CUDA VQ-attention forward, block form (math in vq_attn.h, spec §3.2 and §2.6), on the packed
// layout of vq_common.cuh with tensor-core GEMMs (cuBLASLt, f32 accumulation):
//   prepare   pack q, khat, v; bias tables; the cache scan (counts, per-code means ubar)
//   per head, per chunk of blocks i (queries of block n, rows of Lb):
//     scores  swin_i = q_i [khat_{n-1}; khat_n]^T, scache = q C^T, pos = q rho^T
//     softmax warp per query row: scores plus the f32 bias terms, masks, lse (f32, saved),
//             weights p in the activation dtype
//     output  o_i = pwin_i [v_{n-1}; v_n] + pcache_i ubar_i (f32), then to o's dtype and layout
// Padded rows (t >= T) get zero weights and are not written out.
#include <algorithm>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_max;
using cuda::warp_sum;
using vq_cuda::Geo;
using vq_cuda::Row;
using vq_cuda::Ws;

constexpr int kThreads = 256;

// Warp per row of the chunk.
template <class T>
__global__ void __launch_bounds__(kThreads) vq_softmax_rows_kernel(Geo g, int64_t i0, int64_t rows, Ws w,
                                                                   float* __restrict__ lse) {
  const int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const Row row = vq_cuda::row_of(g, i0, r);
  T* pwin = static_cast<T*>(w.pwin) + r * g.ldw;
  T* pcache = static_cast<T*>(w.pcache) + r * g.lds;
  if (row.t >= g.T) {
    for (int64_t e = lane; e < 2 * g.Lb; e += 32) pwin[e] = from_float<T>(0.f);
    for (int64_t s = lane; s < g.S; s += 32) pcache[s] = from_float<T>(0.f);
    return;
  }
  const float* swin = w.swin + r * g.ldw;
  const float* pos = w.pos + r * g.ldp;
  const float* scache = w.scache + r * g.lds;
  const float* vrho = w.vrho + row.h * (g.Lb + 1);
  const float* ucb = w.ucb + row.h * g.S;
  const float* counts = w.counts + row.i * g.S;
  // Online max and sum per lane, then across the warp.
  float m = -INFINITY, sum = 0;
  auto add = [&](float s) {
    if (s == -INFINITY) return;
    if (s > m) {
      sum = sum * expf(m - s) + 1.f;
      m = s;
    } else {
      sum += expf(s - m);
    }
  };
  for (int64_t e = lane; e < 2 * g.Lb; e += 32) add(vq_cuda::window_score(g, row, e, swin, pos, w.ub, vrho));
  for (int64_t s = lane; s < g.S; s += 32) add(vq_cuda::cache_score(s, scache, ucb, counts));
  const float mw = warp_max(m);
  sum = warp_sum(m == -INFINITY ? 0.f : sum * expf(m - mw));
  const float l = mw + logf(sum);
  if (lane == 0) lse[(row.b * g.T + row.t) * g.H + row.h] = l;
  for (int64_t e = lane; e < 2 * g.Lb; e += 32) {
    const float s = vq_cuda::window_score(g, row, e, swin, pos, w.ub, vrho);
    pwin[e] = from_float<T>(s == -INFINITY ? 0.f : expf(s - l));
  }
  for (int64_t s = lane; s < g.S; s += 32) {
    const float sc = vq_cuda::cache_score(s, scache, ucb, counts);
    pcache[s] = from_float<T>(sc == -INFINITY ? 0.f : expf(sc - l));
  }
}

// CTA per row of the chunk (padded rows are skipped), threads over value dims.
template <class T>
__global__ void vq_store_o_kernel(Geo g, int64_t i0, const float* __restrict__ ochunk, T* __restrict__ o,
                                  VqAttnLayout::Strides os) {
  const int64_t r = blockIdx.x;
  const Row row = vq_cuda::row_of(g, i0, r);
  if (row.t >= g.T) return;
  T* out = o + row.b * os.b + row.t * os.t + row.h * g.Dv;
  for (int64_t d = threadIdx.x; d < g.Dv; d += blockDim.x) out[d] = from_float<T>(ochunk[r * g.Dv + d]);
}

}  // namespace

void vq_attn_fwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse) {
  if (L.B * L.T * L.H == 0) return;
  const Geo g = vq_cuda::geo_of(L);
  const Ws w = vq_cuda::carve(ctx, g, dtype_size(q.dtype), false, "vq_attn_fwd");
  cudaStream_t st = cuda::stream_of(ctx);
  const size_t es = dtype_size(q.dtype);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  LINAC_GPU_DISPATCH(q.dtype, T, {
    vq_cuda::prepare<T>(ctx, g, L, w, q.data<T>(), khat.data<T>(), z.data<int32_t>(), v.data<T>(),
                        codebook.data<float>(), u.data<float>(), vr.data<float>(), rho.data<float>());
    const int64_t Lb = g.Lb, Dv = g.Dv;
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i0 = h * g.B * g.R; i0 < (h + 1) * g.B * g.R; i0 += w.cap) {
        const int64_t c = std::min(w.cap, (h + 1) * g.B * g.R - i0), rows = c * Lb;
        vq_cuda::chunk_scores(g, w, q.dtype, h, i0, c);
        vq_softmax_rows_kernel<T><<<cuda::grid_1d(rows * 32, kThreads), kThreads, 0, st>>>(g, i0, rows, w,
                                                                                        lse.data<float>());
        LINAC_CUDA_LAUNCH_CHECK();
        // o_i = pwin_i [v_{n-1}; v_n] + pcache_i ubar_i
        vq_cuda::gemm(w.blas, q.dtype, Lb, Dv, 2 * Lb, c, {w.pwin, g.ldw, Lb * g.ldw, false},
                      {at(w.vp, (i0 - 1) * Lb * Dv), Dv, Lb * Dv, false}, w.ochunk, Dv, Lb * Dv, 0.f);
        vq_cuda::gemm(w.blas, q.dtype, Lb, Dv, g.S, c, {w.pcache, g.lds, Lb * g.lds, false},
                      {at(w.ubar, i0 * g.S * Dv), Dv, g.S * Dv, false}, w.ochunk, Dv, Lb * Dv, 1.f);
        vq_store_o_kernel<T><<<static_cast<unsigned>(rows), 128, 0, st>>>(g, i0, w.ochunk, o.data<T>(), L.o);
        LINAC_CUDA_LAUNCH_CHECK();
      }
  });
}

}  // namespace linac
