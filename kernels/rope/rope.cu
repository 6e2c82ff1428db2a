// CUDA RoPE (math in rope.h). A block takes kTokensPerBlock consecutive tokens: its threads
// first compute the D/2 (cos, sin) pairs of each token's position into shared memory, then
// rotate every (token, head, pair group) in place, four pairs per thread (8- or 16-byte accesses
// to both halves of a head) where D/2 is a multiple of 4 and the rows are aligned to that, one
// pair per thread otherwise. Several tokens per block: one token's heads (3 KB at 24 heads x 64)
// left each block a few hundred bytes per thread of work behind its sincosf and barrier.
// The inverse frequencies come from the host in a __grid_constant__ kernel parameter, which is
// indexed without a local copy. With document bounds a token's position counts from its
// document's first token (doc_start, [b, t] like x's first two dims); per-row positions (row_pos,
// [b]) are added as read on the device.
#include <algorithm>

#include "common/cuda_common.cuh"
#include "rope/rope.h"
#include "rope/rope_math.cuh"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kTokensPerBlock = 8;

template <int kPairs, class T>
__global__ void rope_kernel(T* __restrict__ x, int64_t n_tokens, int64_t t, int h, int half, int64_t stride_b,
                            int64_t stride_t, int64_t pos0, const int32_t* __restrict__ doc_start,
                            const int32_t* __restrict__ row_pos, float sign,
                            const __grid_constant__ cuda::RopeInvFreq freq) {
  extern __shared__ float cs[];  // per token of the block: cos [half], then sign * sin [half]
  const int64_t tok0 = int64_t{blockIdx.x} * kTokensPerBlock;
  const int n_tok = static_cast<int>(min(int64_t{kTokensPerBlock}, n_tokens - tok0));
  for (int k = threadIdx.x; k < n_tok * half; k += blockDim.x) {
    const int j = k / half, i = k - j * half;
    const int64_t tok = tok0 + j;
    const float pos =
        static_cast<float>(pos0 + tok % t - (doc_start ? doc_start[tok] : 0) + (row_pos ? row_pos[tok / t] : 0));
    float s, c;
    sincosf(pos * freq.v[i], &s, &c);
    cs[2 * half * j + i] = c;
    cs[2 * half * j + half + i] = sign * s;
  }
  __syncthreads();
  const int groups = half / kPairs, per_token = h * groups;  // pair groups of a token
  for (int k = threadIdx.x; k < n_tok * per_token; k += blockDim.x) {
    const int j = k / per_token, r = k - j * per_token, hi = r / groups, i = (r - hi * groups) * kPairs;
    const int64_t tok = tok0 + j;
    T* p = x + tok / t * stride_b + tok % t * stride_t + static_cast<int64_t>(hi) * 2 * half;
    const float* cj = cs + 2 * half * j;
    if constexpr (kPairs == 4) {
      const float4 x1 = cuda::load4(p + i), x2 = cuda::load4(p + i + half);
      const float4 c = *reinterpret_cast<const float4*>(cj + i), s = *reinterpret_cast<const float4*>(cj + half + i);
      const float2 r0 = cuda::rope_rotate(x1.x, x2.x, c.x, s.x), r1 = cuda::rope_rotate(x1.y, x2.y, c.y, s.y);
      const float2 r2 = cuda::rope_rotate(x1.z, x2.z, c.z, s.z), r3 = cuda::rope_rotate(x1.w, x2.w, c.w, s.w);
      cuda::store4(p + i, make_float4(r0.x, r1.x, r2.x, r3.x));
      cuda::store4(p + i + half, make_float4(r0.y, r1.y, r2.y, r3.y));
    } else {
      const float2 r = cuda::rope_rotate(cuda::to_float(p[i]), cuda::to_float(p[i + half]), cj[i], cj[half + i]);
      p[i] = cuda::from_float<T>(r.x);
      p[i + half] = cuda::from_float<T>(r.y);
    }
  }
}

__global__ void rope_table_kernel(float2* __restrict__ cos_sin, int64_t n, int half,
                                  const __grid_constant__ cuda::RopeInvFreq freq) {
  const int64_t k = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t p = k / half;
  float s, c;
  sincosf(static_cast<float>(p) * freq.v[k - p * half], &s, &c);
  cos_sin[k] = make_float2(c, s);
}

}  // namespace

void rope_table_cuda(const Ctx& ctx, const RopeFreqs& freqs, int64_t d, int64_t t, float* cos_sin) {
  LINAC_CHECK(d % 2 == 0 && d <= kRopeMaxDim && t <= (int64_t(1) << 24), "rope table (GPU): bad head dim or length");
  const int64_t n = t * (d / 2);
  if (n == 0) return;
  rope_table_kernel<<<cuda::grid_1d(n, 256), 256, 0, cuda::stream_of(ctx)>>>(
      reinterpret_cast<float2*>(cos_sin), n, static_cast<int>(d / 2), cuda::rope_inv_freq_table(freqs, d));
  LINAC_CUDA_LAUNCH_CHECK();
}

void rope_apply_cuda(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, bool inverse,
                     const int32_t* doc_start, const int32_t* row_pos) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3);
  if (b * t == 0 || h * d == 0) return;
  LINAC_CHECK(pos0 + t <= (int64_t(1) << 24), "rope (GPU): positions must be exact in f32 (< 2^24)");
  const int half = static_cast<int>(d / 2);
  const cuda::RopeInvFreq freq = cuda::rope_inv_freq_table(freqs, d);
  // Four pairs per thread: both halves of every head start 4-aligned (cs too: half % 4 == 0).
  const bool quads = half % 4 == 0 && cuda::vec4_aligned(x) && x.strides[0] % 4 == 0 && x.strides[1] % 4 == 0;
  const int64_t items = kTokensPerBlock * h * half / (quads ? 4 : 1);
  const int threads = static_cast<int>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kMaxThreads));
  const size_t smem = kTokensPerBlock * 2 * static_cast<size_t>(half) * sizeof(float);
  const int64_t n_tokens = b * t;
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = quads ? rope_kernel<4, T> : rope_kernel<1, T>;
    kernel<<<static_cast<unsigned>((n_tokens + kTokensPerBlock - 1) / kTokensPerBlock), threads, smem,
             cuda::stream_of(ctx)>>>(x.data<T>(), n_tokens, t, static_cast<int>(h), half, x.strides[0], x.strides[1],
                                     pos0, doc_start, row_pos, inverse ? -1.f : 1.f, freq);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
