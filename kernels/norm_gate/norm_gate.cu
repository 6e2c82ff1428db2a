// CUDA per-head norm + swish gate (math in norm_gate.h): one warp per (row, head); the lanes
// stride over the head's D values, the statistics are warp sums in a fixed order (deterministic).
#include "common/cuda_common.cuh"
#include "norm_gate/norm_gate.h"

namespace linac {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float sigmoid(float x) {
  const float e = __expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps) norm_gate_fwd_kernel(NormGateLayout L, const T* __restrict__ x,
                                                                     const T* __restrict__ r, const float* __restrict__ br,
                                                                     T* __restrict__ y, float* __restrict__ mean,
                                                                     float* __restrict__ rstd) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t n = item / L.H, h = item % L.H, D = L.D;
  const T* xr = x + n * L.x + h * D;
  float s = 0.f;
  for (int64_t j = lane; j < D; j += 32) s += cuda::to_float(xr[j]);
  const float m = cuda::warp_sum(s) / static_cast<float>(D);
  float v = 0.f;
  for (int64_t j = lane; j < D; j += 32) {
    const float d = cuda::to_float(xr[j]) - m;
    v += d * d;
  }
  const float rs = rsqrtf(cuda::warp_sum(v) / static_cast<float>(D) + static_cast<float>(L.eps));
  if (lane == 0) {
    mean[item] = m;
    rstd[item] = rs;
  }
  for (int64_t j = lane; j < D; j += 32) {
    const int64_t c = h * D + j;
    const float p = cuda::to_float(r[n * L.r + c]) + br[c];
    y[n * L.y + c] = cuda::from_float<T>((cuda::to_float(xr[j]) - m) * rs * p * sigmoid(p));
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kWarps)
    norm_gate_bwd_kernel(NormGateLayout L, const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ br,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         T* __restrict__ dx, T* __restrict__ dr) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t n = item / L.H, h = item % L.H, D = L.D;
  const float m = mean[item], rs = rstd[item];
  float sdu = 0.f, sduu = 0.f;
  for (int64_t j = lane; j < D; j += 32) {
    const int64_t c = h * D + j;
    const float p = cuda::to_float(r[n * L.r + c]) + br[c], s = sigmoid(p);
    const float u = (cuda::to_float(x[n * L.x + c]) - m) * rs, d = cuda::to_float(dy[n * L.dy + c]);
    const float du = d * p * s;
    sdu += du;
    sduu += du * u;
    dr[n * L.dr + c] = cuda::from_float<T>(d * u * s * (1.f + p * (1.f - s)));
  }
  const float mdu = cuda::warp_sum(sdu) / static_cast<float>(D), mduu = cuda::warp_sum(sduu) / static_cast<float>(D);
  for (int64_t j = lane; j < D; j += 32) {
    const int64_t c = h * D + j;
    const float p = cuda::to_float(r[n * L.r + c]) + br[c];
    const float u = (cuda::to_float(x[n * L.x + c]) - m) * rs;
    dx[n * L.dx + c] = cuda::from_float<T>(rs * (cuda::to_float(dy[n * L.dy + c]) * p * sigmoid(p) - mdu - u * mduu));
  }
}

void check_dtypes(std::initializer_list<const Tensor*> act, std::initializer_list<const Tensor*> f32) {
  for (const Tensor* t : act)
    LINAC_CHECK(t->dtype == (*act.begin())->dtype, "norm_gate (GPU): activations must share a dtype");
  for (const Tensor* t : f32) LINAC_CHECK(t->dtype == DType::F32, "norm_gate (GPU): br, mean, rstd must be f32");
}

}  // namespace

void norm_gate_fwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_dtypes({&x, &r, &y}, {&br, &mean, &rstd});
  if (L.N * L.H == 0) return;
  const unsigned grid = static_cast<unsigned>((L.N * L.H + kWarps - 1) / kWarps);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    norm_gate_fwd_kernel<T><<<grid, 32 * kWarps, 0, cuda::stream_of(ctx)>>>(
        L, x.data<T>(), r.data<T>(), br.data<float>(), y.data<T>(), mean.data<float>(), rstd.data<float>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void norm_gate_bwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr) {
  check_dtypes({&x, &r, &dy, &dx, &dr}, {&br, &mean, &rstd});
  if (L.N * L.H == 0) return;
  const unsigned grid = static_cast<unsigned>((L.N * L.H + kWarps - 1) / kWarps);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    norm_gate_bwd_kernel<T><<<grid, 32 * kWarps, 0, cuda::stream_of(ctx)>>>(
        L, x.data<T>(), r.data<T>(), br.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<T>(),
        dx.data<T>(), dr.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
