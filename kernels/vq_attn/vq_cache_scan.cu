// The compressive cache of VQ-attention (spec §2.6) in the packed layout of vq_common.cuh.
//   cache_scan        CTA per (pair p, code s) walks the blocks in order: block n reads the count
//                     N_s and the mean of the values with code s over blocks <= n-2, written to
//                     counts [NB, S] (f32) and ubar [NB, S, Dv] (activation dtype: a GEMM operand).
//                     Sums are f32 in shared memory, threads own value dims, and the block's
//                     tokens with code s are listed in order: every sum has a fixed order.
//   cache_grad_sweep  thread per (p, s, d): gcache^(m) <- sum_{n >= m+2} gcache^(n) / N^(n), the
//                     gradient a value of block m receives through the cache means of later
//                     blocks (reverse sweep with a two-block delay; 0 where N = 0).
#include <algorithm>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace vq_cuda {
namespace {

using cuda::from_float;
using cuda::to_float;

constexpr int kScanThreads = 128;

template <class T>
__global__ void __launch_bounds__(kScanThreads) cache_scan_kernel(Geo g, const T* __restrict__ v,
                                                                  VqAttnLayout::Strides vs,
                                                                  const int32_t* __restrict__ z,
                                                                  float* __restrict__ counts, T* __restrict__ ubar) {
  extern __shared__ float sum[];  // [Dv]
  __shared__ int hits[kScanThreads];
  __shared__ int warp_hits[kScanThreads / 32];
  const int64_t p = blockIdx.x, s = blockIdx.y, h = p / g.B, b = p % g.B;
  for (int64_t d = threadIdx.x; d < g.Dv; d += kScanThreads) sum[d] = 0;
  float N = 0;
  for (int64_t n = 0; n < g.R; ++n) {
    const int64_t i = p * g.R + n;
    if (threadIdx.x == 0) counts[i * g.S + s] = N;
    const float inv = N > 0 ? 1.f / N : 0.f;
    T* out = ubar + (i * g.S + s) * g.Dv;
    for (int64_t d = threadIdx.x; d < g.Dv; d += kScanThreads) out[d] = from_float<T>(sum[d] * inv);
    if (n == 0) continue;
    // Absorb block n-1 for block n+1.
    const int64_t j_begin = (n - 1) * g.Lb, j_end = j_begin + g.Lb;
    for (int64_t base = j_begin; base < j_end; base += kScanThreads) {
      const int64_t j = base + threadIdx.x;
      const int n_hit = compact_hits<kScanThreads>(j < j_end && z[(b * g.T + j) * g.H + h] == s, hits, warp_hits);
      for (int r = 0; r < n_hit; ++r) {
        const T* vj = v + b * vs.b + (base + hits[r]) * vs.t + h * g.Dv;
        for (int64_t d = threadIdx.x; d < g.Dv; d += kScanThreads) sum[d] += to_float(vj[d]);
      }
      N += static_cast<float>(n_hit);
      __syncthreads();  // hits is rewritten by the next tile
    }
  }
}

__global__ void cache_grad_sweep_kernel(Geo g, const float* __restrict__ counts, float* __restrict__ gcache) {
  const int64_t ps = blockIdx.x, d = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (d >= g.Dv) return;
  const int64_t p = ps / g.S, s = ps % g.S;
  float acc = 0, pending = 0;  // acc = sum_{n >= m+2}, pending = the term of block m+1
  for (int64_t m = g.R - 1; m >= 0; --m) {
    const int64_t i = p * g.R + m;
    float& cell = gcache[(i * g.S + s) * g.Dv + d];
    const float N = counts[i * g.S + s];
    const float term = N > 0 ? cell / N : 0.f;
    cell = acc;
    acc += pending;
    pending = term;
  }
}

}  // namespace

template <class T>
void cache_scan(const Ctx& ctx, const Geo& g, const T* v, VqAttnLayout::Strides vs, const int32_t* z, float* counts,
                T* ubar) {
  // Each block's tokens live in the unpadded input: a block past T is never absorbed (n-1 < R-1).
  const size_t smem = static_cast<size_t>(g.Dv) * sizeof(float);
  LINAC_CHECK(smem <= 200 * 1024, "vq_attn: Dv too large for the cache scan");
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(cache_scan_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  cache_scan_kernel<T><<<dim3(static_cast<unsigned>(g.P), static_cast<unsigned>(g.S)), kScanThreads, smem,
                         cuda::stream_of(ctx)>>>(g, v, vs, z, counts, ubar);
  LINAC_CUDA_LAUNCH_CHECK();
}
template void cache_scan<float>(const Ctx&, const Geo&, const float*, VqAttnLayout::Strides, const int32_t*, float*,
                                float*);
template void cache_scan<__nv_bfloat16>(const Ctx&, const Geo&, const __nv_bfloat16*, VqAttnLayout::Strides,
                                        const int32_t*, float*, __nv_bfloat16*);

void cache_grad_sweep(const Ctx& ctx, const Geo& g, const float* counts, float* gcache) {
  constexpr int kThreads = 128;
  cache_grad_sweep_kernel<<<dim3(static_cast<unsigned>(g.P * g.S), static_cast<unsigned>((g.Dv + kThreads - 1) / kThreads)),
                            kThreads, 0, cuda::stream_of(ctx)>>>(g, counts, gcache);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace vq_cuda
}  // namespace linac
