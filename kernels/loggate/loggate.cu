// CUDA log-space forget gate (math in loggate.h): one thread per element, f32 math.
#include "common/cuda_common.cuh"
#include "loggate/loggate.h"

namespace linac {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float logsigmoid(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
__device__ __forceinline__ float sigmoid_neg(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.f ? e / (1.f + e) : 1.f / (1.f + e);
}

template <class TZ>
__global__ void loggate_fwd_kernel(const TZ* __restrict__ z, int64_t ldz, const float* __restrict__ b,
                                   float* __restrict__ g, int64_t ldg, int64_t n, int d, float inv_tau, float clamp,
                                   bool clamped) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * d) return;
  const int64_t r = idx / d;
  const int j = static_cast<int>(idx - r * d);
  const float v = logsigmoid(cuda::to_float(z[r * ldz + j]) + b[j]) * inv_tau;
  g[r * ldg + j] = clamped ? fmaxf(v, clamp) : v;
}

template <class TZ, class TD>
__global__ void loggate_bwd_kernel(const TZ* __restrict__ z, int64_t ldz, const float* __restrict__ b,
                                   const float* __restrict__ dg, int64_t lddg, TD* __restrict__ dz, int64_t lddz,
                                   int64_t n, int d, float inv_tau, float clamp, bool clamped) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * d) return;
  const int64_t r = idx / d;
  const int j = static_cast<int>(idx - r * d);
  const float x = cuda::to_float(z[r * ldz + j]) + b[j];
  const bool pass = !clamped || logsigmoid(x) * inv_tau >= clamp;
  dz[r * lddz + j] = cuda::from_float<TD>(pass ? dg[r * lddg + j] * sigmoid_neg(x) * inv_tau : 0.f);
}

int64_t ld(const Tensor& x) { return x.size(0) > 1 ? x.strides[0] : x.size(1); }

}  // namespace

void loggate_fwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& g, const LogGateOpts& o) {
  LINAC_CHECK(b.dtype == DType::F32 && g.dtype == DType::F32, "loggate (GPU): b and g must be f32");
  const int64_t n = z.size(0), d = z.size(1);
  if (n * d == 0) return;
  LINAC_GPU_DISPATCH(z.dtype, TZ, {
    loggate_fwd_kernel<TZ><<<cuda::grid_1d(n * d, kThreads), kThreads, 0, cuda::stream_of(ctx)>>>(
        z.data<TZ>(), ld(z), b.data<float>(), g.data<float>(), ld(g), n, static_cast<int>(d),
        static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void loggate_bwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& dg, const Tensor& dz,
                      const LogGateOpts& o) {
  LINAC_CHECK(b.dtype == DType::F32 && dg.dtype == DType::F32, "loggate (GPU): b and dg must be f32");
  const int64_t n = z.size(0), d = z.size(1);
  if (n * d == 0) return;
  LINAC_GPU_DISPATCH(z.dtype, TZ, LINAC_GPU_DISPATCH(dz.dtype, TD, {
    loggate_bwd_kernel<TZ, TD><<<cuda::grid_1d(n * d, kThreads), kThreads, 0, cuda::stream_of(ctx)>>>(
        z.data<TZ>(), ld(z), b.data<float>(), dg.data<float>(), ld(dg), dz.data<TD>(), ld(dz), n, static_cast<int>(d),
        static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped());
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
