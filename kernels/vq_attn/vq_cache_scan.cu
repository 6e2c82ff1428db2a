// CUDA cache scan of VQ-attention (spec §2.6): one CTA per (batch, head, code s) walks the
// blocks in order, keeping the count N_s and the mean Ubar_s of the values with code s, merged
// block by block as means (Ubar <- (N Ubar + sum_block v) / (N + cnt); a running sum of v would
// lose precision), and writes the state block n reads (blocks <= n-2): counts [B,H,R,S],
// means [B,H,R,S,Dv] f32. Threads own value dims; the block's tokens with code s are listed in
// order, so every sum has a fixed order. A serial scan costs O(T S Dv) per (batch, head), the
// same as reading the values S times; the matmul and associative forms were not measured.
#include "common/cuda_common.cuh"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::to_float;

constexpr int kScanThreads = 128;

template <class T>
__global__ void __launch_bounds__(kScanThreads) vq_cache_scan_kernel(VqAttnLayout L, const T* __restrict__ v,
                                                                     const int32_t* __restrict__ z,
                                                                     float* __restrict__ counts,
                                                                     float* __restrict__ means) {
  __shared__ int hits[kScanThreads];
  __shared__ int warp_hits[kScanThreads / 32];
  const int64_t R = vq_cuda::n_blocks(L), s = blockIdx.y, bh = blockIdx.x, b = bh / L.H, h = bh % L.H;
  auto cnt_at = [&](int64_t n) -> float& { return counts[(bh * R + n) * L.S + s]; };
  auto mean_at = [&](int64_t n) { return means + ((bh * R + n) * L.S + s) * L.Dv; };
  for (int64_t n = 0; n < R && n < 2; ++n) {
    for (int64_t d = threadIdx.x; d < L.Dv; d += kScanThreads) mean_at(n)[d] = 0;
    if (threadIdx.x == 0) cnt_at(n) = 0;
  }
  float N = 0;
  for (int64_t n = 2; n < R; ++n) {
    // Absorb block n-2: each thread keeps its dims' running mean in the output row of block n.
    const int64_t j_begin = (n - 2) * L.Lb, j_end = j_begin + L.Lb;
    float* prev = mean_at(n - 1);
    float* cur = mean_at(n);
    for (int64_t d = threadIdx.x; d < L.Dv; d += kScanThreads) cur[d] = prev[d] * N;
    float cnt = 0;
    for (int64_t base = j_begin; base < j_end; base += kScanThreads) {
      const int64_t j = base + threadIdx.x;
      const int n_hit = vq_cuda::compact_hits<kScanThreads>(j < j_end && z[(b * L.T + j) * L.H + h] == s, hits,
                                                            warp_hits);
      for (int r = 0; r < n_hit; ++r) {
        const T* vj = v + b * L.v.b + (base + hits[r]) * L.v.t + h * L.Dv;
        for (int64_t d = threadIdx.x; d < L.Dv; d += kScanThreads) cur[d] += to_float(vj[d]);
      }
      cnt += n_hit;
      __syncthreads();
    }
    const float n_new = N + cnt;
    for (int64_t d = threadIdx.x; d < L.Dv; d += kScanThreads) cur[d] = n_new > 0 ? cur[d] / n_new : 0.f;
    N = n_new;
    if (threadIdx.x == 0) cnt_at(n) = N;
  }
}

}  // namespace

namespace vq_cuda {

template <class T>
void launch_cache_scan(const Ctx& ctx, const VqAttnLayout& L, const T* v, const int32_t* z, float* counts,
                       float* means) {
  vq_cache_scan_kernel<T><<<dim3(static_cast<unsigned>(L.B * L.H), static_cast<unsigned>(L.S)), kScanThreads, 0,
                            cuda::stream_of(ctx)>>>(L, v, z, counts, means);
  LINAC_CUDA_LAUNCH_CHECK();
}
template void launch_cache_scan<float>(const Ctx&, const VqAttnLayout&, const float*, const int32_t*, float*, float*);
template void launch_cache_scan<__nv_bfloat16>(const Ctx&, const VqAttnLayout&, const __nv_bfloat16*, const int32_t*,
                                               float*, float*);

}  // namespace vq_cuda
}  // namespace linac
