// CUDA vector quantizer and codebook statistics (math in vq_attn.h, docs/transformer_vq.md §1.2-§1.3).
//   quantize     f32 distances ||k||^2 - 2 k.C_s + ||C_s||^2 (clamped at 0): the keys of a chunk
//                of tokens as f32 rows [H, n, Dk] with their norms, k.C^T as f32 GEMMs per head
//                (cuBLASLt; scratch in ctx.workspace), then a warp per (token, head) takes the
//                argmin on (distance, code), so ties go to the lowest code (equal codewords give
//                equal distances). khat = C_z rounded to k's dtype. bf16 keys are exact TF32
//                numbers, so with C = C_hi + C_lo (both TF32, |C - C_hi - C_lo| <= 2^-22 |C|) the
//                product is one TF32 tensor-core GEMM with f32 accumulation over K = 2 Dk, [k | k]
//                against [C_hi | C_lo] (the keys' rows and the codewords' rows hold both parts
//                side by side); f32 keys take one true-fp32 GEMM.
//   code stats   per head, the tokens' one-hot code rows [tokens, S] (in ctx.workspace, chunks
//                of tokens if it is small) and sums = onehot^T k as GEMMs (bf16 operands are
//                exact, f32 accumulation, a fixed algorithm: bitwise reproducible); the counts
//                are integer atomics (exact in any order).
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


// x rounded to the nearest TF32 number (10 mantissa bits; finite x).
__device__ __forceinline__ float to_tf32(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// Warp per (head, code): cc = ||C_s||^2; with `split` (null otherwise), the codeword's TF32 split
// as a row [hi | lo] of split [HS, 2 Dk].
__global__ void vq_code_norms_kernel(int64_t HS, int64_t Dk, const float* __restrict__ codebook,
                                     float* __restrict__ cc, float* __restrict__ split) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= HS) return;
  float acc = 0;
  for (int64_t d = lane; d < Dk; d += 32) {
    const float c = codebook[i * Dk + d];
    acc += c * c;
    if (split) {
      const float h = to_tf32(c);
      split[i * 2 * Dk + d] = h;
      split[i * 2 * Dk + Dk + d] = to_tf32(c - h);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) cc[i] = acc;
}

// Warp per (head, token of the chunk): kf [H, n, kw] f32 (kw = 2 Dk: the key twice, [k | k]) and
// kk = ||k||^2.
template <class T>
__global__ void vq_pack_keys_kernel(VqQuantLayout L, int64_t tok0, int64_t n, const T* __restrict__ k, int64_t kw,
                                    float* __restrict__ kf, float* __restrict__ kk) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= L.H * n) return;
  const int64_t h = i / n, tok = tok0 + i % n, b = tok / L.T, t = tok % L.T;
  const T* kt = k + b * L.k.b + t * L.k.t + h * L.Dk;
  float acc = 0;
  for (int64_t d = lane; d < L.Dk; d += 32) {
    const float x = to_float(kt[d]);
    for (int64_t c = 0; c < kw; c += L.Dk) kf[i * kw + c + d] = x;
    acc += x * x;
  }
  acc = warp_sum(acc);
  if (lane == 0) kk[i] = acc;
}

// Warp per (head, token of the chunk): z = argmin_s max(kk - 2 k.C_s + cc_s, 0), ties to the
// lowest code; khat = C_z rounded; err = ||k - C_z||^2.
template <class T>
__global__ void vq_nearest_code_kernel(VqQuantLayout L, int64_t tok0, int64_t n, int64_t kw, const float* __restrict__ kf,
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
  const float* key = kf + i * kw;
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

// Thread per four columns of a one-hot row: rows r = tokens bt0 + r (bt = b T + t) of head h,
// a 1 at the token's code (columns padded to lds, a multiple of 4); the thread holding the 1
// counts the token.
template <class T>
__global__ void vq_onehot_kernel(const int32_t* __restrict__ z, int64_t H, int64_t h, int64_t bt0, int64_t n,
                                 int64_t lds, T* __restrict__ onehot, int* __restrict__ icount) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, groups = lds / 4;
  if (i >= n * groups) return;
  const int64_t r = i / groups, s0 = 4 * (i % groups);
  const int code = z[(bt0 + r) * H + h];
  auto one = [&](int k) { return code == s0 + k ? 1.f : 0.f; };
  cuda::store4(onehot + r * lds + s0, make_float4(one(0), one(1), one(2), one(3)));
  if (code >= s0 && code < s0 + 4) atomicAdd(&icount[h * lds + code], 1);
}

__global__ void vq_counts_kernel(int64_t H, int64_t S, int64_t lds, const int* __restrict__ icount,
                                 float* __restrict__ counts) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < H * S) counts[i] = static_cast<float>(icount[(i / S) * lds + i % S]);
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
  // ctx.workspace: cc [H, S], the codebook's TF32 split [H, S, 2 Dk] (bf16 keys), then per token
  // and head kf [kw], kk, kc [S] (f32), and cuBLASLt's share.
  const bool split = k.dtype == DType::BF16;
  const int64_t kw = split ? 2 * L.Dk : L.Dk;
  auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t split_bytes = split ? align(static_cast<size_t>(2 * L.H * L.S * L.Dk) * sizeof(float)) : 0;
  const size_t fixed = static_cast<size_t>(L.H * L.S) * sizeof(float) + 2 * 256 + split_bytes + vq_cuda::kBlasBytes;
  const size_t per_tok = static_cast<size_t>(L.H * (kw + 1 + L.S)) * sizeof(float);
  LINAC_CHECK(ctx.workspace_bytes >= fixed + 3 * 256 + per_tok,
              "vq_quantize: ctx.workspace has " + std::to_string(ctx.workspace_bytes) + " bytes, need at least " +
                  std::to_string(fixed + 3 * 256 + per_tok));
  const int64_t chunk = std::min<int64_t>(n_tok, static_cast<int64_t>((ctx.workspace_bytes - fixed - 3 * 256) / per_tok));
  char* base = static_cast<char*>(ctx.workspace);
  float* cc = reinterpret_cast<float*>(base);
  float* csplit = split ? reinterpret_cast<float*>(base + align(static_cast<size_t>(L.H * L.S) * sizeof(float))) : nullptr;
  float* kf = reinterpret_cast<float*>(base + align(static_cast<size_t>(L.H * L.S) * sizeof(float)) + split_bytes);
  float* kk = kf + align(static_cast<size_t>(L.H * chunk * kw) * sizeof(float)) / sizeof(float);
  float* kc = kk + align(static_cast<size_t>(L.H * chunk) * sizeof(float)) / sizeof(float);
  const Ctx blas = vq_cuda::blas_tail(ctx);
  cudaStream_t st = cuda::stream_of(ctx);
  const float* cb = codebook.data<float>();
  vq_code_norms_kernel<<<cuda::grid_1d(L.H * L.S * 32, 256), 256, 0, st>>>(L.H * L.S, L.Dk, cb, cc, csplit);
  LINAC_CUDA_LAUNCH_CHECK();
  LINAC_GPU_DISPATCH(k.dtype, T, {
    for (int64_t tok0 = 0; tok0 < n_tok; tok0 += chunk) {
      const int64_t n = std::min(chunk, n_tok - tok0);
      vq_pack_keys_kernel<T><<<cuda::grid_1d(L.H * n * 32, 256), 256, 0, st>>>(L, tok0, n, k.data<T>(), kw, kf, kk);
      LINAC_CUDA_LAUNCH_CHECK();
      // kc[h] = kf[h] C[h]^T with f32 accumulation: the distances decide the codes
      const vq_cuda::Operand kfa{kf, kw, n * kw, false};
      if (split) {
        vq_cuda::gemm(blas, DType::F32, n, L.S, kw, L.H, kfa, {csplit, kw, L.S * kw, true}, kc, L.S, n * L.S, 0.f, true);
      } else {
        vq_cuda::gemm(blas, DType::F32, n, L.S, L.Dk, L.H, kfa, {cb, L.Dk, L.S * L.Dk, true}, kc, L.S, n * L.S, 0.f);
      }
      vq_nearest_code_kernel<T><<<cuda::grid_1d(L.H * n * 32, 256), 256, 0, st>>>(
          L, tok0, n, kw, kf, kk, kc, cc, cb, z.data<int32_t>(), khat.data<T>(), err.defined() ? err.data<float>() : nullptr);
      LINAC_CUDA_LAUNCH_CHECK();
    }
  });
}

void vq_code_stats_cuda(const Ctx& ctx, const VqQuantLayout& L, const Tensor& k, const Tensor& z, const Tensor& sums,
                        const Tensor& counts) {
  if (L.H * L.S == 0) return;
  const int64_t n_tok = L.B * L.T, lds = vq_cuda::round8(L.S), Tn = L.T;  // Tn: `L.T <` would parse as a template
  const size_t es = dtype_size(k.dtype);
  // ctx.workspace: icount [H, lds] int, one-hot rows [chunk, lds], cuBLASLt's share.
  const size_t fixed = (static_cast<size_t>(L.H * lds) * sizeof(int) + 255) / 256 * 256 + 256 + vq_cuda::kBlasBytes;
  const size_t per_tok = static_cast<size_t>(lds) * es;
  LINAC_CHECK(ctx.workspace_bytes >= fixed + per_tok,
              "vq_code_stats: ctx.workspace has " + std::to_string(ctx.workspace_bytes) + " bytes, need at least " +
                  std::to_string(fixed + per_tok));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n_tok, static_cast<int64_t>((ctx.workspace_bytes - fixed) / per_tok)));
  char* base = static_cast<char*>(ctx.workspace);
  int* icount = reinterpret_cast<int*>(base);
  void* onehot = base + (fixed - 256 - vq_cuda::kBlasBytes);
  const Ctx blas = vq_cuda::blas_tail(ctx);
  cudaStream_t st = cuda::stream_of(ctx);
  gpu_memset_zero_async(ctx, icount, static_cast<size_t>(L.H * lds) * sizeof(int));
  float* out = sums.data<float>();
  LINAC_GPU_DISPATCH(k.dtype, T, {
    for (int64_t h = 0; h < L.H; ++h) {
      if (n_tok == 0) gpu_memset_zero_async(ctx, out + h * L.S * L.Dk, static_cast<size_t>(L.S * L.Dk) * sizeof(float));
      for (int64_t bt0 = 0; bt0 < n_tok; bt0 += chunk) {
        const int64_t n = std::min(chunk, n_tok - bt0);
        vq_onehot_kernel<T><<<cuda::grid_1d(n * lds / 4, 256), 256, 0, st>>>(z.data<int32_t>(), L.H, h, bt0, n, lds,
                                                                            static_cast<T*>(onehot), icount);
        LINAC_CUDA_LAUNCH_CHECK();
        // sums[h] (+)= onehot^T k over the chunk's tokens: one GEMM where the sequences follow
        // each other in k, else one per sequence part
        if (L.k.b == Tn * L.k.t) {
          vq_cuda::gemm(blas, k.dtype, L.S, L.Dk, n, 1, {onehot, lds, 0, true},
                        {k.data<T>() + bt0 * L.k.t + h * L.Dk, L.k.t, 0, false}, out + h * L.S * L.Dk, L.Dk, 0,
                        bt0 == 0 ? 0.f : 1.f);
          continue;
        }
        for (int64_t b = bt0 / Tn; b * Tn < bt0 + n; ++b) {
          const int64_t ta = std::max(bt0, b * Tn) - b * Tn, tb = std::min(bt0 + n, (b + 1) * Tn) - b * Tn;
          const T* kb = k.data<T>() + b * L.k.b + ta * L.k.t + h * L.Dk;
          vq_cuda::gemm(blas, k.dtype, L.S, L.Dk, tb - ta, 1,
                        {static_cast<const T*>(onehot) + (b * Tn + ta - bt0) * lds, lds, 0, true}, {kb, L.k.t, 0, false},
                        out + h * L.S * L.Dk, L.Dk, 0, bt0 == 0 && b == 0 ? 0.f : 1.f);
        }
      }
    }
  });
  vq_counts_kernel<<<cuda::grid_1d(L.H * L.S, 256), 256, 0, st>>>(L.H, L.S, lds, icount, counts.data<float>());
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
