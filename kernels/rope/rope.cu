// CUDA RoPE (math in rope.h). One block per token: the block's threads first compute the D/2
// (cos, sin) pairs of that position into shared memory, then rotate every (head, pair) of
// the token in place, four pairs per thread (8- or 16-byte accesses to both halves of a head)
// where D/2 is a multiple of 4 and the rows are aligned to that, one pair per thread otherwise.
// The inverse frequencies come from the host in a __grid_constant__ kernel parameter, which is
// indexed without a local copy.
#include <algorithm>
#include <cmath>

#include "common/cuda_common.cuh"
#include "rope/rope.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;

struct InvFreq {
  float v[kRopeMaxDim / 2];
};

template <int kPairs, class T>
__global__ void rope_kernel(T* __restrict__ x, int64_t t, int h, int half, int64_t stride_b, int64_t stride_t,
                            int64_t pos0, float sign, const __grid_constant__ InvFreq freq) {
  extern __shared__ float cs[];  // cos [half], then sign * sin [half]
  const int64_t bi = blockIdx.x / t, ti = blockIdx.x % t;
  const float pos = static_cast<float>(pos0 + ti);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * freq.v[i], &s, &c);
    cs[i] = c;
    cs[half + i] = sign * s;
  }
  __syncthreads();
  T* xt = x + bi * stride_b + ti * stride_t;
  const int groups = half / kPairs;  // per head
  for (int k = threadIdx.x; k < h * groups; k += blockDim.x) {
    const int hi = k / groups, i = (k - hi * groups) * kPairs;
    T* p = xt + static_cast<int64_t>(hi) * 2 * half;
    if constexpr (kPairs == 4) {
      const float4 x1 = cuda::load4(p + i), x2 = cuda::load4(p + i + half);
      const float4 c = *reinterpret_cast<const float4*>(cs + i), s = *reinterpret_cast<const float4*>(cs + half + i);
      cuda::store4(p + i, make_float4(x1.x * c.x - x2.x * s.x, x1.y * c.y - x2.y * s.y, x1.z * c.z - x2.z * s.z,
                                      x1.w * c.w - x2.w * s.w));
      cuda::store4(p + i + half, make_float4(x2.x * c.x + x1.x * s.x, x2.y * c.y + x1.y * s.y,
                                             x2.z * c.z + x1.z * s.z, x2.w * c.w + x1.w * s.w));
    } else {
      const float x1 = cuda::to_float(p[i]), x2 = cuda::to_float(p[i + half]);
      const float c = cs[i], s = cs[half + i];
      p[i] = cuda::from_float<T>(x1 * c - x2 * s);
      p[i + half] = cuda::from_float<T>(x2 * c + x1 * s);
    }
  }
}

}  // namespace

void rope_apply_cuda(const Ctx& ctx, const Tensor& x, double base, int64_t pos0, bool inverse) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3);
  if (b * t == 0 || h * d == 0) return;
  LINAC_CHECK(pos0 + t <= (int64_t(1) << 24), "rope (GPU): positions must be exact in f32 (< 2^24)");
  const int half = static_cast<int>(d / 2);
  InvFreq freq{};
  for (int i = 0; i < half; ++i)
    freq.v[i] = static_cast<float>(std::pow(base, -2.0 * i / static_cast<double>(d)));
  // Four pairs per thread: both halves of every head start 4-aligned (cs too: half % 4 == 0).
  const bool quads = half % 4 == 0 && cuda::vec4_aligned(x) && x.strides[0] % 4 == 0 && x.strides[1] % 4 == 0;
  const int64_t per_token = h * half / (quads ? 4 : 1);
  const int threads = static_cast<int>(std::clamp<int64_t>((per_token + 31) / 32 * 32, 32, kMaxThreads));
  const size_t smem = 2 * static_cast<size_t>(half) * sizeof(float);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = quads ? rope_kernel<4, T> : rope_kernel<1, T>;
    kernel<<<static_cast<unsigned>(b * t), threads, smem, cuda::stream_of(ctx)>>>(
        x.data<T>(), t, static_cast<int>(h), half, x.strides[0], x.strides[1], pos0, inverse ? -1.f : 1.f, freq);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
