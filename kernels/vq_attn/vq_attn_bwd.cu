// CUDA VQ-attention backward, block form (math in vq_attn.h, spec §4.1-§4.4). f32 CUDA-core
// kernels, every sum in a fixed order (no atomics). Per batch group, in stream order:
//   cache scan    the forward's counts and means (recomputed, not saved)
//   query pass    CTA per (b, h, kRows queries): scores again, p = exp(s - lse), delta = dout.o,
//                 gs = p (dout.val - delta) for window and cache entries; dq = sum gs key (+ the
//                 position part), its two parts (q+u, q+vr) and the band gs[t, d = t-j] to scratch
//   cache grads   CTA per (b, h, block n, code s): G = sum_{t in n} p_ts dout_t / N_s^(n), written
//                 over the means (no longer needed)
//   cache sweep   CTA per (b, h, s): G^(m) <- sum_{n >= m+2} G^(n) (reverse, two-block delay)
//   key pass      CTA per (b, h, kRows keys): the queries of the key's own and next block,
//                 dkhat_j = sum gs (q+u), dv_j = sum p dout + G^(n(j))[z_j]
//   parameters    drho_d = sum_t gs[t, d] (q_t + vr) per (h, tile of distances); du, dvr from the
//                 two dq parts; groups after the first add to the result in group order.
#include <algorithm>
#include <string>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_sum;

constexpr int kThreads = 256;
constexpr int kRows = 4;      // queries (query pass) or keys (key pass) per CTA
constexpr int kDist = 32;     // distances per CTA of the drho pass
constexpr int kTok = 32;      // tokens staged per step of the parameter passes
constexpr int kMaxDk = 256;

template <class T>
__global__ void __launch_bounds__(kThreads) vq_bwd_query_kernel(
    VqAttnLayout L, const T* __restrict__ q, const T* __restrict__ khat, const T* __restrict__ v,
    const float* __restrict__ codebook, const float* __restrict__ u, const float* __restrict__ vr,
    const float* __restrict__ rho, const T* __restrict__ o, const float* __restrict__ lse, const T* __restrict__ dout,
    vq_cuda::Scratch ws, T* __restrict__ dq) {
  extern __shared__ float smem[];
  const int64_t E = 2 * L.Lb + L.S;
  float* scores = smem;                // [kRows, E]: scores, then gs
  float* qu = scores + kRows * E;      // [kRows, Dk]
  float* qr = qu + kRows * L.Dk;       // [kRows, Dk]
  float* dout_s = qr + kRows * L.Dk;   // [kRows, Dv]
  float* delta = dout_s + kRows * L.Dv;  // [kRows]
  const int64_t R = vq_cuda::n_blocks(L), bh = blockIdx.y, b = bh / L.H, h = bh % L.H;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows = static_cast<int>(L.T - t0 < kRows ? L.T - t0 : kRows);
  for (int64_t i = threadIdx.x; i < rows * L.Dv; i += kThreads) {
    const int64_t r = i / L.Dv, d = i % L.Dv;
    dout_s[i] = to_float(dout[b * L.dout.b + (t0 + r) * L.dout.t + h * L.Dv + d]);
  }
  vq_cuda::query_tile_scores<T, kThreads>(L, q, khat, codebook, u, vr, rho, ws.counts, bh, t0, rows, scores, qu, qr);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < rows) {
    const int64_t t = t0 + warp;
    const T* ot = o + b * L.o.b + t * L.o.t + h * L.Dv;
    float acc = 0;
    for (int64_t d = lane; d < L.Dv; d += 32) acc += dout_s[warp * L.Dv + d] * to_float(ot[d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[warp] = acc, ws.delta[(b * L.T + t) * L.H + h] = acc;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rows * E; i += kThreads) {
    const int64_t r = i / E, e = i % E, t = t0 + r, j0 = vq_cuda::window_start(L, t), nw = t - j0 + 1;
    const float sc = scores[i];
    float gs = 0;
    if (sc != -INFINITY) {
      const float p = expf(sc - lse[(b * L.T + t) * L.H + h]);
      const float* dor = dout_s + r * L.Dv;
      float dp = 0;
      if (e < nw) {
        const T* vj = v + b * L.v.b + (j0 + e) * L.v.t + h * L.Dv;
        for (int64_t d = 0; d < L.Dv; ++d) dp += dor[d] * to_float(vj[d]);
      } else {
        const float* m = ws.means + ((bh * R + t / L.Lb) * L.S + (e - nw)) * L.Dv;
        for (int64_t d = 0; d < L.Dv; ++d) dp += dor[d] * m[d];
      }
      gs = p * (dp - delta[r]);
    }
    scores[i] = gs;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rows * (L.Lb + 1); i += kThreads) {
    const int64_t r = i / (L.Lb + 1), d = i % (L.Lb + 1), t = t0 + r, j0 = vq_cuda::window_start(L, t);
    ws.band[(bh * L.T + t) * (L.Lb + 1) + d] = t - d >= 0 ? scores[r * E + (t - d - j0)] : 0.f;
  }
  const float* cb = codebook + h * L.S * L.Dk;
  const float* rho_h = rho + h * (L.Lb + 1) * L.Dk;
  for (int64_t i = threadIdx.x; i < rows * L.Dk; i += kThreads) {
    const int64_t r = i / L.Dk, k = i % L.Dk, t = t0 + r, j0 = vq_cuda::window_start(L, t), nw = t - j0 + 1;
    const float* g = scores + r * E;
    float gu = 0, gr = 0;
    for (int64_t e = 0; e < nw; ++e) {
      const int64_t j = j0 + e;
      gu += g[e] * to_float(khat[b * L.khat.b + j * L.khat.t + h * L.Dk + k]);
      if (t - j <= L.Lb) gr += g[e] * rho_h[(t - j) * L.Dk + k];
    }
    for (int64_t c = 0; c < L.S; ++c) gu += g[nw + c] * cb[c * L.Dk + k];
    const int64_t row = (b * L.T + t) * L.H + h;
    ws.gqu[row * L.Dk + k] = gu;
    ws.gqr[row * L.Dk + k] = gr;
    dq[b * L.dq.b + t * L.dq.t + h * L.Dk + k] = from_float<T>(gu + gr);
  }
}

template <class T>
__global__ void __launch_bounds__(128) vq_bwd_cache_grad_kernel(VqAttnLayout L, const T* __restrict__ q,
                                                                const float* __restrict__ codebook,
                                                                const float* __restrict__ u,
                                                                const float* __restrict__ lse,
                                                                const T* __restrict__ dout, vq_cuda::Scratch ws) {
  extern __shared__ float p[];  // [Lb]
  const int64_t s = blockIdx.x, n = blockIdx.y, bh = blockIdx.z, b = bh / L.H, h = bh % L.H;
  const int64_t R = vq_cuda::n_blocks(L);
  const float N = ws.counts[(bh * R + n) * L.S + s];
  float* g = ws.means + ((bh * R + n) * L.S + s) * L.Dv;
  if (!(N > 0)) {
    for (int64_t d = threadIdx.x; d < L.Dv; d += 128) g[d] = 0;
    return;
  }
  const int64_t t_begin = n * L.Lb, len = std::min(L.Lb, L.T - t_begin);
  const float* c = codebook + (h * L.S + s) * L.Dk;
  const float log_n = logf(N);
  for (int64_t r = threadIdx.x; r < len; r += 128) {
    const int64_t t = t_begin + r;
    const T* qt = q + b * L.q.b + t * L.q.t + h * L.Dk;
    float sc = 0;
    for (int64_t k = 0; k < L.Dk; ++k) sc += (to_float(qt[k]) + u[h * L.Dk + k]) * c[k];
    p[r] = expf(sc + log_n - lse[(b * L.T + t) * L.H + h]);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < L.Dv; d += 128) {
    float acc = 0;
    for (int64_t r = 0; r < len; ++r) acc += p[r] * to_float(dout[b * L.dout.b + (t_begin + r) * L.dout.t + h * L.Dv + d]);
    g[d] = acc / N;
  }
}

__global__ void __launch_bounds__(128) vq_bwd_cache_sweep_kernel(VqAttnLayout L, float* __restrict__ g) {
  const int64_t s = blockIdx.x, bh = blockIdx.y, R = vq_cuda::n_blocks(L);
  for (int64_t d = threadIdx.x; d < L.Dv; d += 128) {
    float acc = 0, pending = 0;  // acc = sum_{n >= m+2} G^(n); pending = G^(m+1)
    for (int64_t m = R - 1; m >= 0; --m) {
      float& cell = g[((bh * R + m) * L.S + s) * L.Dv + d];
      const float orig = cell;
      cell = acc;
      acc += pending;
      pending = orig;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) vq_bwd_key_kernel(
    VqAttnLayout L, const T* __restrict__ q, const T* __restrict__ khat, const int32_t* __restrict__ z,
    const T* __restrict__ v, const float* __restrict__ u, const float* __restrict__ vr, const float* __restrict__ rho,
    const float* __restrict__ lse, const T* __restrict__ dout, vq_cuda::Scratch ws, T* __restrict__ dkhat,
    T* __restrict__ dv) {
  extern __shared__ float smem[];
  const int64_t Q = 2 * L.Lb;  // queries per key: t = j .. j + Q - 1, within the next block
  float* p = smem;             // [kRows, Q]
  float* gs = p + kRows * Q;   // [kRows, Q]
  float* kj_s = gs + kRows * Q;        // [kRows, Dk]
  float* vj_s = kj_s + kRows * L.Dk;   // [kRows, Dv]
  const int64_t R = vq_cuda::n_blocks(L), bh = blockIdx.y, b = bh / L.H, h = bh % L.H;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows = static_cast<int>(L.T - j0 < kRows ? L.T - j0 : kRows);
  auto q_end = [&](int64_t j) { return std::min(L.T, (j / L.Lb + 2) * L.Lb); };
  for (int64_t i = threadIdx.x; i < rows * L.Dk; i += kThreads)
    kj_s[i] = to_float(khat[b * L.khat.b + (j0 + i / L.Dk) * L.khat.t + h * L.Dk + i % L.Dk]);
  for (int64_t i = threadIdx.x; i < rows * L.Dv; i += kThreads)
    vj_s[i] = to_float(v[b * L.v.b + (j0 + i / L.Dv) * L.v.t + h * L.Dv + i % L.Dv]);
  __syncthreads();
  const float* rho_h = rho + h * (L.Lb + 1) * L.Dk;
  for (int64_t i = threadIdx.x; i < rows * Q; i += kThreads) {
    const int64_t r = i / Q, e = i % Q, j = j0 + r, t = j + e;
    float pv = 0, g = 0;
    if (t < q_end(j)) {
      const T* qt = q + b * L.q.b + t * L.q.t + h * L.Dk;
      float sc = 0;
      for (int64_t k = 0; k < L.Dk; ++k) sc += (to_float(qt[k]) + u[h * L.Dk + k]) * kj_s[r * L.Dk + k];
      if (e <= L.Lb) {
        float pos = 0;
        for (int64_t k = 0; k < L.Dk; ++k) pos += (to_float(qt[k]) + vr[h * L.Dk + k]) * rho_h[e * L.Dk + k];
        sc += pos;
      }
      const int64_t row = (b * L.T + t) * L.H + h;
      pv = expf(sc - lse[row]);
      const T* dot_ = dout + b * L.dout.b + t * L.dout.t + h * L.Dv;
      float dp = 0;
      for (int64_t d = 0; d < L.Dv; ++d) dp += to_float(dot_[d]) * vj_s[r * L.Dv + d];
      g = pv * (dp - ws.delta[row]);
    }
    p[i] = pv;
    gs[i] = g;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rows * L.Dk; i += kThreads) {
    const int64_t r = i / L.Dk, k = i % L.Dk, j = j0 + r, ne = q_end(j) - j;
    float acc = 0;
    for (int64_t e = 0; e < ne; ++e)
      acc += gs[r * Q + e] * (to_float(q[b * L.q.b + (j + e) * L.q.t + h * L.Dk + k]) + u[h * L.Dk + k]);
    dkhat[b * L.dkhat.b + j * L.dkhat.t + h * L.Dk + k] = from_float<T>(acc);
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t j = j0 + r, ne = q_end(j) - j;
    const float* g_cache = ws.means + ((bh * R + j / L.Lb) * L.S + z[(b * L.T + j) * L.H + h]) * L.Dv;
    for (int64_t d = threadIdx.x; d < L.Dv; d += kThreads) {
      float acc = 0;
      for (int64_t e = 0; e < ne; ++e)
        acc += p[r * Q + e] * to_float(dout[b * L.dout.b + (j + e) * L.dout.t + h * L.Dv + d]);
      dv[b * L.dv.b + j * L.dv.t + h * L.Dv + d] = from_float<T>(acc + g_cache[d]);
    }
  }
}

// blockIdx.x < n_dist_tiles: drho for distances [x*kDist, ...); the last x: du and dvr.
template <class T>
__global__ void __launch_bounds__(kThreads) vq_bwd_param_kernel(VqAttnLayout L, const T* __restrict__ q,
                                                                const float* __restrict__ vr, vq_cuda::Scratch ws,
                                                                float* __restrict__ du, float* __restrict__ dvr,
                                                                float* __restrict__ drho, bool accumulate) {
  __shared__ float rows_s[kTok][kMaxDk];
  __shared__ float band_s[kTok][kDist];
  const int64_t h = blockIdx.y, n_tok = L.B * L.T;
  const int64_t n_dist_tiles = (L.Lb + 1 + kDist - 1) / kDist;
  if (blockIdx.x == n_dist_tiles) {
    float acc_u = 0, acc_r = 0;
    for (int64_t base = 0; base < n_tok; base += kTok) {
      const int len = static_cast<int>(std::min<int64_t>(kTok, n_tok - base));
      for (int64_t i = threadIdx.x; i < len * L.Dk; i += kThreads) {
        const int64_t row = ((base + i / L.Dk) * L.H + h) * L.Dk + i % L.Dk;
        rows_s[i / L.Dk][i % L.Dk] = ws.gqu[row];
      }
      __syncthreads();
      if (threadIdx.x < L.Dk)
        for (int r = 0; r < len; ++r) acc_u += rows_s[r][threadIdx.x];
      __syncthreads();
      for (int64_t i = threadIdx.x; i < len * L.Dk; i += kThreads)
        rows_s[i / L.Dk][i % L.Dk] = ws.gqr[((base + i / L.Dk) * L.H + h) * L.Dk + i % L.Dk];
      __syncthreads();
      if (threadIdx.x < L.Dk)
        for (int r = 0; r < len; ++r) acc_r += rows_s[r][threadIdx.x];
      __syncthreads();
    }
    if (threadIdx.x < L.Dk) {
      const int64_t i = h * L.Dk + threadIdx.x;
      du[i] = accumulate ? du[i] + acc_u : acc_u;
      dvr[i] = accumulate ? dvr[i] + acc_r : acc_r;
    }
    return;
  }
  const int64_t d0 = static_cast<int64_t>(blockIdx.x) * kDist;
  const int groups = static_cast<int>(kThreads / L.Dk);  // distance groups of Dk threads
  const int k = static_cast<int>(threadIdx.x % L.Dk), grp = static_cast<int>(threadIdx.x / L.Dk);
  float acc[kDist] = {};
  for (int64_t base = 0; base < n_tok; base += kTok) {
    const int len = static_cast<int>(std::min<int64_t>(kTok, n_tok - base));
    for (int64_t i = threadIdx.x; i < len * L.Dk; i += kThreads) {
      const int64_t tok = base + i / L.Dk, b = tok / L.T, t = tok % L.T;
      rows_s[i / L.Dk][i % L.Dk] = to_float(q[b * L.q.b + t * L.q.t + h * L.Dk + i % L.Dk]) + vr[h * L.Dk + i % L.Dk];
    }
    for (int64_t i = threadIdx.x; i < len * kDist; i += kThreads) {
      const int64_t tok = base + i / kDist, b = tok / L.T, t = tok % L.T, d = d0 + i % kDist;
      band_s[i / kDist][i % kDist] = d <= L.Lb ? ws.band[((b * L.H + h) * L.T + t) * (L.Lb + 1) + d] : 0.f;
    }
    __syncthreads();
    if (grp < groups)
      for (int r = 0; r < len; ++r) {
        const float x = rows_s[r][k];
#pragma unroll
        for (int dd = 0; dd < kDist; ++dd)
          if (dd % groups == grp) acc[dd] += band_s[r][dd] * x;
      }
    __syncthreads();
  }
  if (grp < groups)
#pragma unroll
    for (int dd = 0; dd < kDist; ++dd)
      if (dd % groups == grp && d0 + dd <= L.Lb) {
        float& out = drho[(h * (L.Lb + 1) + d0 + dd) * L.Dk + k];
        out = accumulate ? out + acc[dd] : acc[dd];
      }
}

}  // namespace

void vq_attn_bwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat,
                      const Tensor& dv, const Tensor& du, const Tensor& dvr, const Tensor& drho) {
  LINAC_CHECK(L.Dk <= kMaxDk, "vq_attn_bwd: the GPU takes Dk <= 256");
  if (L.B * L.T * L.H == 0) return;
  const size_t per_seq = vq_attn_workspace_bytes_per_seq(L.T, L.H, L.Dk, L.Dv, L.S, L.Lb);
  const int64_t group = std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per_seq));
  LINAC_CHECK(group >= 1, "vq_attn_bwd: ctx.workspace holds less than one sequence's scratch (" +
                              std::to_string(per_seq) + " bytes)");
  const int64_t R = vq_cuda::n_blocks(L);
  const size_t smem_q = static_cast<size_t>(kRows * (2 * L.Lb + L.S + 2 * L.Dk + L.Dv) + kRows) * sizeof(float);
  const size_t smem_k = static_cast<size_t>(kRows * (4 * L.Lb + L.Dk + L.Dv)) * sizeof(float);
  const size_t smem_c = static_cast<size_t>(L.Lb) * sizeof(float);
  LINAC_CHECK(std::max(smem_q, smem_k) <= 200 * 1024, "vq_attn_bwd: block length, codebook or Dv too large for shared memory");
  const unsigned tiles = static_cast<unsigned>((L.T + kRows - 1) / kRows);
  const unsigned n_dist_tiles = static_cast<unsigned>((L.Lb + 1 + kDist - 1) / kDist);
  cudaStream_t stream = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(q.dtype, T, {
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_bwd_query_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_q)));
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_bwd_key_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_k)));
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_bwd_cache_grad_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_c)));
    for (int64_t b0 = 0; b0 < L.B; b0 += group) {
      VqAttnLayout G = L;
      G.B = std::min(group, L.B - b0);
      const vq_cuda::Scratch ws = vq_cuda::carve(G, ctx.workspace);
      const int64_t tok0 = b0 * L.T * L.H;
      const T* qg = q.data<T>() + b0 * L.q.b;
      const T* vg = v.data<T>() + b0 * L.v.b;
      const T* dg = dout.data<T>() + b0 * L.dout.b;
      const int32_t* zg = z.data<int32_t>() + tok0;
      const float* lg = lse.data<float>() + tok0;
      const unsigned bh = static_cast<unsigned>(G.B * L.H);
      vq_cuda::launch_cache_scan(ctx, G, vg, zg, ws.counts, ws.means);
      vq_bwd_query_kernel<T><<<dim3(tiles, bh), kThreads, smem_q, stream>>>(
          G, qg, khat.data<T>() + b0 * L.khat.b, vg, codebook.data<float>(), u.data<float>(), vr.data<float>(),
          rho.data<float>(), o.data<T>() + b0 * L.o.b, lg, dg, ws, dq.data<T>() + b0 * L.dq.b);
      LINAC_CUDA_LAUNCH_CHECK();
      vq_bwd_cache_grad_kernel<T><<<dim3(static_cast<unsigned>(L.S), static_cast<unsigned>(R), bh), 128, smem_c,
                                    stream>>>(G, qg, codebook.data<float>(), u.data<float>(), lg, dg, ws);
      LINAC_CUDA_LAUNCH_CHECK();
      vq_bwd_cache_sweep_kernel<<<dim3(static_cast<unsigned>(L.S), bh), 128, 0, stream>>>(G, ws.means);
      LINAC_CUDA_LAUNCH_CHECK();
      vq_bwd_key_kernel<T><<<dim3(tiles, bh), kThreads, smem_k, stream>>>(
          G, qg, khat.data<T>() + b0 * L.khat.b, zg, vg, u.data<float>(), vr.data<float>(), rho.data<float>(), lg, dg,
          ws, dkhat.data<T>() + b0 * L.dkhat.b, dv.data<T>() + b0 * L.dv.b);
      LINAC_CUDA_LAUNCH_CHECK();
      vq_bwd_param_kernel<T><<<dim3(n_dist_tiles + 1, static_cast<unsigned>(L.H)), kThreads, 0, stream>>>(
          G, qg, vr.data<float>(), ws, du.data<float>(), dvr.data<float>(), drho.data<float>(), b0 > 0);
      LINAC_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace linac
