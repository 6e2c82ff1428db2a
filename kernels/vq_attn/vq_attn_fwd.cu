// CUDA VQ-attention forward, block form (math in vq_attn.h, spec §3.2 and §2.6).
//   cache scan   vq_cache_scan.cu: per-block counts [B,H,R,S] and means [B,H,R,S,Dv] f32 in ctx.workspace.
//   attention    one CTA per (batch, head, tile of kRows queries): scores of each query against
//                its window (previous and present block, j <= t; position term for t - j <= Lb)
//                and the S cache entries ((q+u).C_s + log N_s, -inf where empty) go to shared
//                memory; one warp per query takes the row max and sum (lse); threads then own
//                output dims and walk the entries in order. f32 throughout (CUDA cores, not
//                tensor cores: this revision is the correctness baseline).
// Layouts as in vq_attn.h; the batch is processed in groups whose cache fits ctx.workspace.
#include <algorithm>
#include <string>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_max;
using cuda::warp_sum;

constexpr int kThreads = 256;
constexpr int kRows = 4;  // queries per CTA (<= kThreads / 32 warps)

template <class T>
__global__ void __launch_bounds__(kThreads) vq_attn_fwd_kernel(VqAttnLayout L, const T* __restrict__ q,
                                                               const T* __restrict__ khat, const int32_t* __restrict__ z,
                                                               const T* __restrict__ v, const float* __restrict__ codebook,
                                                               const float* __restrict__ u, const float* __restrict__ vr,
                                                               const float* __restrict__ rho,
                                                               const float* __restrict__ counts,
                                                               const float* __restrict__ means, T* __restrict__ o,
                                                               float* __restrict__ lse) {
  extern __shared__ float smem[];
  const int64_t E = 2 * L.Lb + L.S;  // entries per query row (window <= 2 Lb, then the cache)
  float* scores = smem;               // [kRows, E]
  float* qu = scores + kRows * E;     // [kRows, Dk]
  float* qr = qu + kRows * L.Dk;      // [kRows, Dk]
  const int64_t R = vq_cuda::n_blocks(L), bh = blockIdx.y, b = bh / L.H, h = bh % L.H;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows = static_cast<int>(L.T - t0 < kRows ? L.T - t0 : kRows);
  vq_cuda::query_tile_scores<T, kThreads>(L, q, khat, codebook, u, vr, rho, counts, bh, t0, rows, scores, qu, qr);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < rows) {
    float* row = scores + warp * E;
    float m = -INFINITY;
    for (int64_t e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
    m = warp_max(m);
    float sum = 0;
    for (int64_t e = lane; e < E; e += 32) sum += row[e] == -INFINITY ? 0.f : expf(row[e] - m);
    sum = warp_sum(sum);
    const float l = m + logf(sum);
    __syncwarp();
    for (int64_t e = lane; e < E; e += 32) row[e] = row[e] == -INFINITY ? 0.f : expf(row[e] - l);
    if (lane == 0) lse[(b * L.T + t0 + warp) * L.H + h] = l;
  }
  __syncthreads();
  for (int r = 0; r < rows; ++r) {
    const int64_t t = t0 + r, j0 = vq_cuda::window_start(L, t), nw = t - j0 + 1;
    const float* p = scores + r * E;
    const float* mean_n = means + (bh * R + t / L.Lb) * L.S * L.Dv;
    for (int64_t d = threadIdx.x; d < L.Dv; d += kThreads) {
      float acc = 0;
      for (int64_t e = 0; e < nw; ++e) acc += p[e] * to_float(v[b * L.v.b + (j0 + e) * L.v.t + h * L.Dv + d]);
      for (int64_t c = 0; c < L.S; ++c)
        if (p[nw + c] != 0.f) acc += p[nw + c] * mean_n[c * L.Dv + d];
      o[b * L.o.b + t * L.o.t + h * L.Dv + d] = from_float<T>(acc);
    }
  }
}

}  // namespace

size_t vq_attn_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t S, int64_t Lb) {
  VqAttnLayout one;
  one.B = 1, one.T = T, one.H = H, one.Dk = Dk, one.Dv = Dv, one.S = S, one.Lb = Lb;
  return static_cast<size_t>(vq_cuda::backward_floats(one)) * sizeof(float);
}

void vq_attn_fwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse) {
  if (L.B * L.T * L.H == 0) return;
  VqAttnLayout one = L;
  one.B = 1;
  const size_t per_seq = static_cast<size_t>(vq_cuda::cache_floats(one)) * sizeof(float);
  const int64_t group = std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per_seq));
  LINAC_CHECK(group >= 1, "vq_attn_fwd: ctx.workspace holds less than one sequence's cache (" +
                              std::to_string(per_seq) + " bytes)");
  const size_t smem = static_cast<size_t>(kRows * (2 * L.Lb + L.S + 2 * L.Dk)) * sizeof(float);
  LINAC_CHECK(smem <= 200 * 1024, "vq_attn_fwd: block length and codebook too large for shared memory");
  LINAC_GPU_DISPATCH(q.dtype, T, {
    auto kernel = vq_attn_fwd_kernel<T>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    for (int64_t b0 = 0; b0 < L.B; b0 += group) {
      VqAttnLayout G = L;
      G.B = std::min(group, L.B - b0);
      const vq_cuda::Scratch ws = vq_cuda::carve(G, ctx.workspace);
      float* counts = ws.counts;
      float* means = ws.means;
      const int64_t tok0 = b0 * L.T * L.H;
      vq_cuda::launch_cache_scan(ctx, G, v.data<T>() + b0 * L.v.b, z.data<int32_t>() + tok0, counts, means);
      kernel<<<dim3(static_cast<unsigned>((L.T + kRows - 1) / kRows), static_cast<unsigned>(G.B * L.H)), kThreads, smem,
               cuda::stream_of(ctx)>>>(G, q.data<T>() + b0 * L.q.b, khat.data<T>() + b0 * L.khat.b,
                                       z.data<int32_t>() + tok0, v.data<T>() + b0 * L.v.b, codebook.data<float>(),
                                       u.data<float>(), vr.data<float>(), rho.data<float>(), counts, means,
                                       o.data<T>() + b0 * L.o.b, lse.data<float>() + tok0);
      LINAC_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace linac
