// CUDA VQ-attention backward, block form (math in vq_attn.h, spec §4.1-§4.4), on the packed
// layout of vq_common.cuh with tensor-core GEMMs (cuBLASLt, f32 accumulation, fixed order: the
// result is deterministic). Nothing of the forward is saved but o and lse.
//   prepare    as the forward (packed q, khat, v; cache; tables), plus q+u, q+vr, dout packed and
//              delta_t = dout_t . o_t
//   per head, per chunk of blocks i (queries of block n):
//     scores   recomputed (swin, scache, pos)
//     dp       dpwin_i = dout_i [v_{n-1}; v_n]^T, dpcache_i = dout_i ubar_i^T
//     rows     warp per query: p = exp(s - lse), gs = p (dp - delta); p and gs in the activation
//              dtype, gs also by distance (gpos[t, d] for the key at t - d)
//     dq       dqu = gswin_i [khat_{n-1}; khat_n] + gscache C,  dqr = gpos rho   (f32)
//     dkhat    present keys of block n, then the previous block's (accumulated):
//              dk_n = gswin_i[:, Lb:]^T (q+u)_i,  dk_{n-1} += gswin_i[:, :Lb]^T (q+u)_i
//     dv       the same with pwin and dout; the cache part gcache_i = pcache_i^T dout_i
//     drho_h  += gpos^T (q+vr)  (chunks in order; distances padded to ldp, copied out at the end)
//   then       gcache swept in reverse (cache_grad_sweep), dv_j += gcache^(n(j))[z_j];
//              du_h = sum_t dqu_t, dvr_h = sum_t dqr_t (f32 GEMMs with a ones vector)
#include <algorithm>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using vq_cuda::Geo;
using vq_cuda::Row;
using vq_cuda::Ws;

constexpr int kThreads = 256;

// Warp per row of the chunk.
template <class T>
__global__ void __launch_bounds__(kThreads) vq_grad_rows_kernel(Geo g, int64_t i0, int64_t rows, Ws w,
                                                                const float* __restrict__ lse) {
  const int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const Row row = vq_cuda::row_of(g, i0, r);
  T* pwin = static_cast<T*>(w.pwin) + r * g.ldw;
  T* gswin = static_cast<T*>(w.gswin) + r * g.ldw;
  T* pcache = static_cast<T*>(w.pcache) + r * g.lds;
  T* gscache = static_cast<T*>(w.gscache) + r * g.lds;
  T* gpos = static_cast<T*>(w.gpos) + r * g.ldp;
  const T zero = from_float<T>(0.f);
  if (row.t >= g.T) {
    for (int64_t e = lane; e < 2 * g.Lb; e += 32) pwin[e] = zero, gswin[e] = zero;
    for (int64_t s = lane; s < g.S; s += 32) pcache[s] = zero, gscache[s] = zero;
    for (int64_t d = lane; d < g.ldp; d += 32) gpos[d] = zero;
    return;
  }
  for (int64_t d = g.Lb + 1 + lane; d < g.ldp; d += 32) gpos[d] = zero;  // padding: the dq GEMM reads it
  const float l = lse[(row.b * g.T + row.t) * g.H + row.h], delta = w.delta[row.p * g.Tp + row.t];
  const float* swin = w.swin + r * g.ldw;
  const float* pos = w.pos + r * g.ldp;
  const float* dpwin = w.dpwin + r * g.ldw;
  const float* vrho = w.vrho + row.h * (g.Lb + 1);
  for (int64_t e = lane; e < 2 * g.Lb; e += 32) {
    const float s = vq_cuda::window_score(g, row, e, swin, pos, w.ub, vrho);
    const float p = s == -INFINITY ? 0.f : expf(s - l);
    const float gs = s == -INFINITY ? 0.f : p * (dpwin[e] - delta);
    pwin[e] = from_float<T>(p);
    gswin[e] = from_float<T>(gs);
    if (e >= row.l && e <= g.Lb + row.l) gpos[g.Lb + row.l - e] = from_float<T>(gs);  // every distance 0..Lb once
  }
  const float* scache = w.scache + r * g.lds;
  const float* dpcache = w.dpcache + r * g.lds;
  const float* ucb = w.ucb + row.h * g.S;
  const float* counts = w.counts + row.i * g.S;
  for (int64_t s = lane; s < g.S; s += 32) {
    const float sc = vq_cuda::cache_score(s, scache, ucb, counts);
    const float p = sc == -INFINITY ? 0.f : expf(sc - l);
    pcache[s] = from_float<T>(p);
    gscache[s] = from_float<T>(sc == -INFINITY ? 0.f : p * (dpcache[s] - delta));
  }
}

// CTA per packed row (p, t < T): dq = dqu + dqr, dkhat; dv = dvp + gcache^(n(t))[z_t].
template <class T>
__global__ void vq_store_grads_kernel(Geo g, Ws w, const int32_t* __restrict__ z, T* __restrict__ dq,
                                      VqAttnLayout::Strides dqs, T* __restrict__ dkhat, VqAttnLayout::Strides dks,
                                      T* __restrict__ dv, VqAttnLayout::Strides dvs) {
  const int64_t pt = blockIdx.x, p = pt / g.T, t = pt % g.T, h = p / g.B, b = p % g.B, row = p * g.Tp + t;
  for (int64_t d = threadIdx.x; d < g.Dk; d += blockDim.x) {
    const int64_t src = row * g.Dk + d;
    dq[b * dqs.b + t * dqs.t + h * g.Dk + d] = from_float<T>(w.dqu[src] + w.dqr[src]);
    dkhat[b * dks.b + t * dks.t + h * g.Dk + d] = from_float<T>(w.dk[src]);
  }
  const float* cache = w.gcache + ((p * g.R + t / g.Lb) * g.S + z[(b * g.T + t) * g.H + h]) * g.Dv;
  const float* dvr = w.dvp + row * g.Dv;
  T* out = dv + b * dvs.b + t * dvs.t + h * g.Dv;
  for (int64_t d = threadIdx.x; d < g.Dv; d += blockDim.x) out[d] = from_float<T>(dvr[d] + cache[d]);
}

}  // namespace

void vq_attn_bwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat,
                      const Tensor& dv, const Tensor& du, const Tensor& dvr, const Tensor& drho) {
  if (L.B * L.T * L.H == 0) return;
  const Geo g = vq_cuda::geo_of(L);
  const Ws w = vq_cuda::carve(ctx, g, dtype_size(q.dtype), true, "vq_attn_bwd");
  cudaStream_t st = cuda::stream_of(ctx);
  const DType act = q.dtype;
  const size_t es = dtype_size(act);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  LINAC_GPU_DISPATCH(act, T, {
    vq_cuda::prepare<T>(ctx, g, L, w, q.data<T>(), khat.data<T>(), z.data<int32_t>(), v.data<T>(),
                        codebook.data<float>(), u.data<float>(), vr.data<float>(), rho.data<float>());
    vq_cuda::pack<T>(ctx, g, q.data<T>(), L.q, g.Dk, u.data<float>(), static_cast<T*>(w.qu));
    vq_cuda::pack<T>(ctx, g, q.data<T>(), L.q, g.Dk, vr.data<float>(), static_cast<T*>(w.qr));
    vq_cuda::pack<T>(ctx, g, dout.data<T>(), L.dout, g.Dv, nullptr, static_cast<T*>(w.dop));
    vq_cuda::row_dots<T>(ctx, g, dout.data<T>(), L.dout, g.Dv, nullptr, o.data<T>(), L.o, w.delta);
    const int64_t Lb = g.Lb, Dk = g.Dk, Dv = g.Dv, S = g.S, ldw = g.ldw, lds = g.lds;
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i0 = h * g.B * g.R; i0 < (h + 1) * g.B * g.R; i0 += w.cap) {
        const int64_t c = std::min(w.cap, (h + 1) * g.B * g.R - i0), rows = c * Lb;
        const void* dop_i = at(w.dop, i0 * Lb * Dv);
        const void* qu_i = at(w.qu, i0 * Lb * Dk);
        vq_cuda::chunk_scores(g, w, act, h, i0, c);
        vq_cuda::gemm(w.blas, act, Lb, 2 * Lb, Dv, c, {dop_i, Dv, Lb * Dv, false},
                      {at(w.vp, (i0 - 1) * Lb * Dv), Dv, Lb * Dv, true}, w.dpwin, ldw, Lb * ldw, 0.f);
        vq_cuda::gemm(w.blas, act, Lb, S, Dv, c, {dop_i, Dv, Lb * Dv, false}, {at(w.ubar, i0 * S * Dv), Dv, S * Dv, true},
                      w.dpcache, lds, Lb * lds, 0.f);
        vq_grad_rows_kernel<T><<<cuda::grid_1d(rows * 32, kThreads), kThreads, 0, st>>>(g, i0, rows, w, lse.data<float>());
        LINAC_CUDA_LAUNCH_CHECK();
        // dq: the window and cache keys (the u part), the distances (the vr part).
        float* dqu = w.dqu + i0 * Lb * Dk;
        vq_cuda::gemm(w.blas, act, Lb, Dk, 2 * Lb, c, {w.gswin, ldw, Lb * ldw, false},
                      {at(w.kp, (i0 - 1) * Lb * Dk), Dk, Lb * Dk, false}, dqu, Dk, Lb * Dk, 0.f);
        vq_cuda::gemm_table(w.blas, act, rows, Dk, S, {w.gscache, lds, 0, false}, at(w.c_hi, h * S * Dk),
                            at(w.c_lo, h * S * Dk), false, dqu, Dk, 1.f);
        vq_cuda::gemm_table(w.blas, act, rows, Dk, g.ldp, {w.gpos, g.ldp, 0, false}, at(w.rho_hi, h * g.ldp * Dk),
                            at(w.rho_lo, h * g.ldp * Dk), false, w.dqr + i0 * Lb * Dk, Dk, 0.f);
        // dkhat and dv of the present block, then of the previous one (into the block before; the
        // chunk's first block adds to the previous chunk's last, already written).
        vq_cuda::gemm(w.blas, act, Lb, Dk, Lb, c, {at(w.gswin, Lb), ldw, Lb * ldw, true}, {qu_i, Dk, Lb * Dk, false},
                      w.dk + i0 * Lb * Dk, Dk, Lb * Dk, 0.f);
        vq_cuda::gemm(w.blas, act, Lb, Dv, Lb, c, {at(w.pwin, Lb), ldw, Lb * ldw, true}, {dop_i, Dv, Lb * Dv, false},
                      w.dvp + i0 * Lb * Dv, Dv, Lb * Dv, 0.f);
        const int64_t j0 = std::max<int64_t>(i0, 1), cp = i0 + c - j0;  // blocks with a block before them
        vq_cuda::gemm(w.blas, act, Lb, Dk, Lb, cp, {at(w.gswin, (j0 - i0) * Lb * ldw), ldw, Lb * ldw, true},
                      {at(w.qu, j0 * Lb * Dk), Dk, Lb * Dk, false}, w.dk + (j0 - 1) * Lb * Dk, Dk, Lb * Dk, 1.f);
        vq_cuda::gemm(w.blas, act, Lb, Dv, Lb, cp, {at(w.pwin, (j0 - i0) * Lb * ldw), ldw, Lb * ldw, true},
                      {at(w.dop, j0 * Lb * Dv), Dv, Lb * Dv, false}, w.dvp + (j0 - 1) * Lb * Dv, Dv, Lb * Dv, 1.f);
        // The cache means' gradients of each block (swept below), and drho.
        vq_cuda::gemm(w.blas, act, S, Dv, Lb, c, {w.pcache, lds, Lb * lds, true}, {dop_i, Dv, Lb * Dv, false},
                      w.gcache + i0 * S * Dv, Dv, S * Dv, 0.f);
        vq_cuda::gemm(w.blas, act, g.ldp, Dk, rows, 1, {w.gpos, g.ldp, 0, true}, {at(w.qr, i0 * Lb * Dk), Dk, 0, false},
                      w.drho + h * g.ldp * Dk, Dk, 0, i0 == h * g.B * g.R ? 0.f : 1.f);
      }
    vq_cuda::cache_grad_sweep(ctx, g, w.counts, w.gcache);
    vq_store_grads_kernel<T><<<static_cast<unsigned>(g.P * g.T), 128, 0, st>>>(
        g, w, z.data<int32_t>(), dq.data<T>(), L.dq, dkhat.data<T>(), L.dkhat, dv.data<T>(), L.dv);
    LINAC_CUDA_LAUNCH_CHECK();
    for (int64_t h = 0; h < g.H; ++h)
      gpu_memcpy_async(ctx, drho.data<float>() + h * (Lb + 1) * Dk, w.drho + h * g.ldp * Dk,
                       static_cast<size_t>((Lb + 1) * Dk) * sizeof(float));
    // du_h, dvr_h: column sums over the head's rows (padded rows are zero).
    const int64_t K = g.B * g.Tp;
    for (int64_t h = 0; h < g.H; ++h) {
      vq_cuda::gemm(w.blas, DType::F32, 1, Dk, K, 1, {w.ones, K, 0, false}, {w.dqu + h * K * Dk, Dk, 0, false},
                    du.data<float>() + h * Dk, Dk, 0, 0.f);
      vq_cuda::gemm(w.blas, DType::F32, 1, Dk, K, 1, {w.ones, K, 0, false}, {w.dqr + h * K * Dk, Dk, 0, false},
                    dvr.data<float>() + h * Dk, Dk, 0, 0.f);
    }
  });
}

}  // namespace linac
