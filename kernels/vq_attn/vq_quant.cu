// CUDA vector quantizer and codebook statistics (math in vq_attn.h, spec §2.1-§2.2).
//   quantize     f32 distances ||k||^2 - 2 k.C_s + ||C_s||^2 (clamped at 0): the keys of a chunk
//                of tokens as f32 rows [H, n, Dk] with their norms, k.C^T as one f32 GEMM per
//                head (cuBLASLt, true fp32; scratch in ctx.workspace), then a warp per (token,
//                head) takes the argmin on (distance, code), so ties go to the lowest code
//                (equal codewords give equal distances). khat = C_z rounded to k's dtype.
//   code stats   one CTA per (head, code): the CTA walks all B*T tokens in order in tiles of
//                kThreads, each thread owning key dims; a fixed-order serial sum per dim, no
//                atomics, so the result is bitwise reproducible.
//   EMA update and codebook from statistics: elementwise.
// Layouts: k, khat [B,T,H,Dk] (free batch/token strides); z, err [B,T,H]; codebook, sums, c_sum
// [H,S,Dk]; counts, c_count [H,S].
#include <algorithm>
#include <cfloat>
#include <climits>
#include <string>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_sum;

constexpr int kThreads = 128;
constexpr int kMaxDk = 256;

// Warp per (head, code): cc = ||C_s||^2.
__global__ void vq_code_norms_kernel(int64_t HS, int64_t Dk, const float* __restrict__ codebook,
                                     float* __restrict__ cc) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= HS) return;
  float acc = 0;
  for (int64_t d = lane; d < Dk; d += 32) acc += codebook[i * Dk + d] * codebook[i * Dk + d];
  acc = warp_sum(acc);
  if (lane == 0) cc[i] = acc;
}

// Warp per (head, token of the chunk): kf [H, n, Dk] f32 and kk = ||k||^2.
template <class T>
__global__ void vq_pack_keys_kernel(VqQuantLayout L, int64_t tok0, int64_t n, const T* __restrict__ k,
                                    float* __restrict__ kf, float* __restrict__ kk) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= L.H * n) return;
  const int64_t h = i / n, tok = tok0 + i % n, b = tok / L.T, t = tok % L.T;
  const T* kt = k + b * L.k.b + t * L.k.t + h * L.Dk;
  float acc = 0;
  for (int64_t d = lane; d < L.Dk; d += 32) {
    const float x = to_float(kt[d]);
    kf[i * L.Dk + d] = x;
    acc += x * x;
  }
  acc = warp_sum(acc);
  if (lane == 0) kk[i] = acc;
}

// Warp per (head, token of the chunk): z = argmin_s max(kk - 2 k.C_s + cc_s, 0), ties to the
// lowest code; khat = C_z rounded; err = ||k - C_z||^2.
template <class T>
__global__ void vq_nearest_code_kernel(VqQuantLayout L, int64_t tok0, int64_t n, const float* __restrict__ kf,
                                       const float* __restrict__ kk, const float* __restrict__ kc,
                                       const float* __restrict__ cc, const float* __restrict__ codebook,
                                       int32_t* __restrict__ z, T* __restrict__ khat, float* __restrict__ err) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= L.H * n) return;
  const int64_t h = i / n, tok = tok0 + i % n, b = tok / L.T, t = tok % L.T;
  const float* row = kc + i * L.S;
  const float* cch = cc + h * L.S;
  float best_d = FLT_MAX;
  int best = INT_MAX;
  for (int64_t s = lane; s < L.S; s += 32) {
    const float dist = fmaxf(kk[i] - 2 * row[s] + cch[s], 0.f);
    if (dist < best_d) best_d = dist, best = static_cast<int>(s);
  }
  for (int off = 16; off > 0; off /= 2) {
    const float od = __shfl_xor_sync(0xffffffffu, best_d, off);
    const int os = __shfl_xor_sync(0xffffffffu, best, off);
    if (od < best_d || (od == best_d && os < best)) best_d = od, best = os;
  }
  const float* c = codebook + (h * L.S + best) * L.Dk;
  const float* key = kf + i * L.Dk;
  T* out = khat + b * L.khat.b + t * L.khat.t + h * L.Dk;
  float e = 0;
  for (int64_t d = lane; d < L.Dk; d += 32) {
    out[d] = from_float<T>(c[d]);
    e += (key[d] - c[d]) * (key[d] - c[d]);
  }
  e = warp_sum(e);
  if (lane == 0) {
    z[tok * L.H + h] = best;
    if (err) err[tok * L.H + h] = e;
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
  const int64_t n_tok = L.B * L.T;
  if (n_tok * L.H == 0) return;
  // ctx.workspace: cc [H, S], then per token and head kf [Dk], kk, kc [S] (f32), and cuBLASLt's share.
  const size_t fixed = static_cast<size_t>(L.H * L.S) * sizeof(float) + 256 + vq_cuda::kBlasBytes;
  const size_t per_tok = static_cast<size_t>(L.H * (L.Dk + 1 + L.S)) * sizeof(float);
  LINAC_CHECK(ctx.workspace_bytes >= fixed + 3 * 256 + per_tok,
              "vq_quantize: ctx.workspace has " + std::to_string(ctx.workspace_bytes) + " bytes, need at least " +
                  std::to_string(fixed + 3 * 256 + per_tok));
  const int64_t chunk = std::min<int64_t>(n_tok, static_cast<int64_t>((ctx.workspace_bytes - fixed - 3 * 256) / per_tok));
  auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  char* base = static_cast<char*>(ctx.workspace);
  float* cc = reinterpret_cast<float*>(base);
  float* kf = reinterpret_cast<float*>(base + align(static_cast<size_t>(L.H * L.S) * sizeof(float)));
  float* kk = kf + align(static_cast<size_t>(L.H * chunk * L.Dk) * sizeof(float)) / sizeof(float);
  float* kc = kk + align(static_cast<size_t>(L.H * chunk) * sizeof(float)) / sizeof(float);
  Ctx blas = ctx;
  blas.workspace = base + ctx.workspace_bytes - vq_cuda::kBlasBytes;
  blas.workspace_bytes = vq_cuda::kBlasBytes;
  cudaStream_t st = cuda::stream_of(ctx);
  const float* cb = codebook.data<float>();
  vq_code_norms_kernel<<<cuda::grid_1d(L.H * L.S * 32, 256), 256, 0, st>>>(L.H * L.S, L.Dk, cb, cc);
  LINAC_CUDA_LAUNCH_CHECK();
  LINAC_GPU_DISPATCH(k.dtype, T, {
    for (int64_t tok0 = 0; tok0 < n_tok; tok0 += chunk) {
      const int64_t n = std::min(chunk, n_tok - tok0);
      vq_pack_keys_kernel<T><<<cuda::grid_1d(L.H * n * 32, 256), 256, 0, st>>>(L, tok0, n, k.data<T>(), kf, kk);
      LINAC_CUDA_LAUNCH_CHECK();
      // kc[h] = kf[h] C[h]^T in f32 (true fp32, no TF32: the distances decide the codes)
      vq_cuda::gemm(blas, DType::F32, n, L.S, L.Dk, L.H, {kf, L.Dk, n * L.Dk, false}, {cb, L.Dk, L.S * L.Dk, true}, kc,
                    L.S, n * L.S, 0.f);
      vq_nearest_code_kernel<T><<<cuda::grid_1d(L.H * n * 32, 256), 256, 0, st>>>(
          L, tok0, n, kf, kk, kc, cc, cb, z.data<int32_t>(), khat.data<T>(), err.defined() ? err.data<float>() : nullptr);
      LINAC_CUDA_LAUNCH_CHECK();
    }
  });
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
