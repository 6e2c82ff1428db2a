// CUDA vector quantizer and codebook statistics (math in vq_attn.h, spec §2.1-§2.2).
//   quantize     one warp per (token, head): the key row goes to shared memory, lane l scores
//                codes l, l+32, ... with f32 distances ||k||^2 - 2 k.C_s + ||C_s||^2 (clamped at
//                0; each dot a sequential f32 sum over Dk), then a warp argmin on (distance,
//                code) so ties go to the lowest code. khat = C_z rounded to k's dtype.
//   code stats   one CTA per (head, code): the CTA walks all B*T tokens in order in tiles of
//                kThreads, each thread owning key dims; a fixed-order serial sum per dim, no
//                atomics, so the result is bitwise reproducible.
//   EMA update and codebook from statistics: elementwise.
// Layouts: k, khat [B,T,H,Dk] (free batch/token strides); z, err [B,T,H]; codebook, sums, c_sum
// [H,S,Dk]; counts, c_count [H,S].
#include <cfloat>
#include <climits>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_sum;

constexpr int kWarps = 4;
constexpr int kThreads = 128;
constexpr int kMaxDk = 256;

template <class T>
__global__ void __launch_bounds__(kWarps * 32) vq_quantize_kernel(VqQuantLayout L, const T* __restrict__ k,
                                                                  const float* __restrict__ codebook,
                                                                  int32_t* __restrict__ z, T* __restrict__ khat,
                                                                  float* __restrict__ err) {
  __shared__ float key_rows[kWarps][kMaxDk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // (b*T + t)*H + h
  if (i >= L.B * L.T * L.H) return;
  const int64_t h = i % L.H, bt = i / L.H, b = bt / L.T, t = bt % L.T;
  const T* kt = k + b * L.k.b + t * L.k.t + h * L.Dk;
  float* key = key_rows[warp];
  for (int64_t d = lane; d < L.Dk; d += 32) key[d] = to_float(kt[d]);
  __syncwarp();
  float kk = 0;
  for (int64_t d = 0; d < L.Dk; ++d) kk += key[d] * key[d];
  const float* cb = codebook + h * L.S * L.Dk;
  float best_d = FLT_MAX;
  int best = INT_MAX;
  for (int64_t s = lane; s < L.S; s += 32) {
    const float* c = cb + s * L.Dk;
    float kc = 0, cc = 0;
    for (int64_t d = 0; d < L.Dk; ++d) kc += key[d] * c[d], cc += c[d] * c[d];
    const float dist = fmaxf(kk - 2 * kc + cc, 0.f);
    if (dist < best_d) best_d = dist, best = static_cast<int>(s);
  }
  for (int off = 16; off > 0; off /= 2) {
    const float od = __shfl_xor_sync(0xffffffffu, best_d, off);
    const int os = __shfl_xor_sync(0xffffffffu, best, off);
    if (od < best_d || (od == best_d && os < best)) best_d = od, best = os;
  }
  const float* c = cb + static_cast<int64_t>(best) * L.Dk;
  T* out = khat + b * L.khat.b + t * L.khat.t + h * L.Dk;
  float e = 0;
  for (int64_t d = lane; d < L.Dk; d += 32) {
    out[d] = from_float<T>(c[d]);
    e += (key[d] - c[d]) * (key[d] - c[d]);
  }
  e = warp_sum(e);
  if (lane == 0) {
    z[i] = best;
    if (err) err[i] = e;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) vq_code_stats_kernel(VqQuantLayout L, const T* __restrict__ k,
                                                                 const int32_t* __restrict__ z,
                                                                 float* __restrict__ sums, float* __restrict__ counts) {
  __shared__ int tile_tokens[kThreads];
  __shared__ int warp_hits[kThreads / 32];
  const int64_t h = blockIdx.x / L.S, s = blockIdx.x % L.S;
  float acc[kMaxDk / kThreads] = {};
  float count = 0;
  const int64_t n_tok = L.B * L.T;
  for (int64_t base = 0; base < n_tok; base += kThreads) {
    const int64_t bt = base + threadIdx.x;
    const int tile_len =
        vq_cuda::compact_hits<kThreads>(bt < n_tok && z[bt * L.H + h] == s, tile_tokens, warp_hits);
    for (int r = 0; r < tile_len; ++r) {
      const int64_t tok = base + tile_tokens[r], b = tok / L.T, t = tok % L.T;
      const T* kt = k + b * L.k.b + t * L.k.t + h * L.Dk;
      for (int64_t d = threadIdx.x, j = 0; d < L.Dk; d += kThreads, ++j) acc[j] += to_float(kt[d]);
    }
    count += tile_len;
    __syncthreads();
  }
  float* out = sums + (h * L.S + s) * L.Dk;
  for (int64_t d = threadIdx.x, j = 0; d < L.Dk; d += kThreads, ++j) out[d] = acc[j];
  if (threadIdx.x == 0) counts[h * L.S + s] = count;
}

__global__ void vq_ema_kernel(int64_t n, int64_t n_counts, const float* __restrict__ sums,
                              const float* __restrict__ counts, float* __restrict__ c_sum,
                              float* __restrict__ c_count, float gamma) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) c_sum[i] = gamma * c_sum[i] + (1 - gamma) * sums[i];
  if (i < n_counts) c_count[i] = gamma * c_count[i] + (1 - gamma) * counts[i];
}

__global__ void vq_codebook_kernel(int64_t n, int64_t Dk, const float* __restrict__ c_sum,
                                   const float* __restrict__ c_count, float* __restrict__ codebook) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) codebook[i] = c_sum[i] / fmaxf(c_count[i / Dk], 0.01f);
}

}  // namespace

void vq_quantize_cuda(const Ctx& ctx, const VqQuantLayout& L, const Tensor& k, const Tensor& codebook,
                      const Tensor& z, const Tensor& khat, const Tensor& err) {
  LINAC_CHECK(L.Dk <= kMaxDk, "vq_quantize: the GPU takes Dk <= 256");
  const int64_t n = L.B * L.T * L.H;
  if (n == 0) return;
  LINAC_GPU_DISPATCH(k.dtype, T, {
    vq_quantize_kernel<T><<<cuda::grid_1d(n, kWarps), kWarps * 32, 0, cuda::stream_of(ctx)>>>(
        L, k.data<T>(), codebook.data<float>(), z.data<int32_t>(), khat.data<T>(),
        err.defined() ? err.data<float>() : nullptr);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void vq_code_stats_cuda(const Ctx& ctx, const VqQuantLayout& L, const Tensor& k, const Tensor& z, const Tensor& sums,
                        const Tensor& counts) {
  LINAC_CHECK(L.Dk <= kMaxDk, "vq_code_stats: the GPU takes Dk <= 256");
  if (L.H * L.S == 0) return;
  LINAC_GPU_DISPATCH(k.dtype, T, {
    vq_code_stats_kernel<T><<<static_cast<unsigned>(L.H * L.S), kThreads, 0, cuda::stream_of(ctx)>>>(
        L, k.data<T>(), z.data<int32_t>(), sums.data<float>(), counts.data<float>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void vq_ema_update_cuda(const Ctx& ctx, const Tensor& sums, const Tensor& counts, const Tensor& c_sum,
                        const Tensor& c_count, double gamma) {
  const int64_t n = sums.numel();
  if (n == 0) return;
  vq_ema_kernel<<<cuda::grid_1d(n, 256), 256, 0, cuda::stream_of(ctx)>>>(
      n, counts.numel(), sums.data<float>(), counts.data<float>(), c_sum.data<float>(), c_count.data<float>(),
      static_cast<float>(gamma));
  LINAC_CUDA_LAUNCH_CHECK();
}

void vq_codebook_from_stats_cuda(const Ctx& ctx, const Tensor& c_sum, const Tensor& c_count, const Tensor& codebook) {
  const int64_t n = c_sum.numel();
  if (n == 0) return;
  vq_codebook_kernel<<<cuda::grid_1d(n, 256), 256, 0, cuda::stream_of(ctx)>>>(n, c_sum.size(2), c_sum.data<float>(),
                                                                              c_count.data<float>(),
                                                                              codebook.data<float>());
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
