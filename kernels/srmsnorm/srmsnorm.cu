// CUDA SimpleRMSNorm, with the optional residual add or output gate (math in srmsnorm.h). Rows of
// at most kWarpRowMax columns: a warp per row (kMaxThreads / 32 rows per block, a warp reduction,
// no block barrier); wider rows: a block per row with a fixed-order block reduction. Either
// reduces (sum of squares forward, sum of y * dy backward) and then makes a second pass over the
// row, which comes from L1/L2 (rows are at most kSrmsnormMaxDim wide).
#include <algorithm>

#include "common/cuda_common.cuh"
#include "srmsnorm/srmsnorm.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kWarpRowMax = 1024;

// The row's first pass: x (or h = x + add, written here) and its sum of squares. The second
// pass reads back what this thread wrote: the same columns.
template <class TX, class TY>
__device__ __forceinline__ float sum_squares(const TX* __restrict__ xr, const TY* __restrict__ ar, TX* __restrict__ hr,
                                             int64_t j0, int64_t c, int64_t step) {
  float ss = 0.f;
  for (int64_t j = j0; j < c; j += step) {
    float v = cuda::to_float(xr[j]);
    if (ar) {
      v = cuda::rounded<TX>(v + cuda::to_float(ar[j]));
      hr[j] = cuda::from_float<TX>(v);
    }
    ss += v * v;
  }
  return ss;
}

// y[j] = x[j] * rs, times the gate's u[j] where there is one.
template <class TY>
__device__ __forceinline__ float gated(float n, const TY* __restrict__ ur, int64_t j) {
  return ur ? n * cuda::to_float(ur[j]) : n;
}

// Warp per row.
template <class TX, class TY>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_fwd_rows_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const TY* __restrict__ u,
                             TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, SrmsnormLayout L,
                             float eps) {
  const int64_t r = (blockIdx.x * int64_t{kMaxThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= L.N) return;
  const TX* xr = x + r * L.x;
  TX* hr = add ? h + r * L.h : nullptr;
  const TY* ur = u ? u + r * L.u : nullptr;
  const float ss = sum_squares(xr, add ? add + r * L.add : nullptr, hr, lane, L.C, 32);
  const float rs = rsqrtf(cuda::warp_sum(ss) / static_cast<float>(L.C) + eps);
  if (lane == 0) rstd[r] = rs;
  if (hr) xr = hr;
  for (int64_t j = lane; j < L.C; j += 32)
    y[r * L.y + j] = cuda::from_float<TY>(gated(cuda::to_float(xr[j]) * rs, ur, j));
}

// The backward's second pass over a row, after the reduction m = mean_j(n_j * dn_j).
template <class TX, class TDY, class TDX>
__device__ __forceinline__ void srmsnorm_bwd_row(const TX* __restrict__ xr, const TDY* __restrict__ ur,
                                                 const TDY* __restrict__ dyr, TDX* __restrict__ dxr,
                                                 TDX* __restrict__ dur, float rs, float m, int64_t j0, int64_t c,
                                                 int64_t step, bool accumulate) {
  for (int64_t j = j0; j < c; j += step) {
    const float n = cuda::to_float(xr[j]) * rs, dy = cuda::to_float(dyr[j]);
    const float g = rs * (gated(dy, ur, j) - n * m);
    dxr[j] = cuda::from_float<TDX>(accumulate ? cuda::to_float(dxr[j]) + g : g);
    if (dur) dur[j] = cuda::from_float<TDX>(dy * n);
  }
}

// sum_j n_j * dn_j over this thread's columns (dn = dy, times the gate where there is one).
template <class TX, class TDY>
__device__ __forceinline__ float bwd_dot(const TX* __restrict__ xr, const TDY* __restrict__ ur,
                                         const TDY* __restrict__ dyr, float rs, int64_t j0, int64_t c, int64_t step) {
  float dot = 0.f;
  for (int64_t j = j0; j < c; j += step) dot += cuda::to_float(xr[j]) * rs * gated(cuda::to_float(dyr[j]), ur, j);
  return dot;
}

template <class TX, class TDY, class TDX>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_bwd_rows_kernel(const TX* __restrict__ x, const TDY* __restrict__ u, const float* __restrict__ rstd,
                             const TDY* __restrict__ dy, TDX* __restrict__ dx, TDX* __restrict__ du, SrmsnormLayout L,
                             bool accumulate) {
  const int64_t r = (blockIdx.x * int64_t{kMaxThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= L.N) return;
  const TX* xr = x + r * L.x;
  const TDY* ur = u ? u + r * L.u : nullptr;
  const TDY* dyr = dy + r * L.dy;
  const float rs = rstd[r];
  const float m = cuda::warp_sum(bwd_dot(xr, ur, dyr, rs, lane, L.C, 32)) / static_cast<float>(L.C);
  srmsnorm_bwd_row(xr, ur, dyr, dx + r * L.dx, du ? du + r * L.du : nullptr, rs, m, lane, L.C, 32, accumulate);
}

template <class TX, class TY>
__global__ void srmsnorm_fwd_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const TY* __restrict__ u,
                                    TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, SrmsnormLayout L,
                                    float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * L.x;
  TX* hr = add ? h + r * L.h : nullptr;
  const TY* ur = u ? u + r * L.u : nullptr;
  const float ss = sum_squares(xr, add ? add + r * L.add : nullptr, hr, threadIdx.x, L.C, blockDim.x);
  const float rs = rsqrtf(cuda::block_sum(ss, scratch) / static_cast<float>(L.C) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  if (hr) xr = hr;
  for (int64_t j = threadIdx.x; j < L.C; j += blockDim.x)
    y[r * L.y + j] = cuda::from_float<TY>(gated(cuda::to_float(xr[j]) * rs, ur, j));
}

template <class TX, class TDY, class TDX>
__global__ void srmsnorm_bwd_kernel(const TX* __restrict__ x, const TDY* __restrict__ u, const float* __restrict__ rstd,
                                    const TDY* __restrict__ dy, TDX* __restrict__ dx, TDX* __restrict__ du,
                                    SrmsnormLayout L, bool accumulate) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * L.x;
  const TDY* ur = u ? u + r * L.u : nullptr;
  const TDY* dyr = dy + r * L.dy;
  const float rs = rstd[r];
  const float m =
      cuda::block_sum(bwd_dot(xr, ur, dyr, rs, threadIdx.x, L.C, blockDim.x), scratch) / static_cast<float>(L.C);
  srmsnorm_bwd_row(xr, ur, dyr, dx + r * L.dx, du ? du + r * L.du : nullptr, rs, m, threadIdx.x, L.C, blockDim.x,
                   accumulate);
}

// Threads per row: enough for one pass over the row, up to kMaxThreads.
int threads_for(int64_t c) { return static_cast<int>(std::clamp<int64_t>((c + 31) / 32 * 32, 32, kMaxThreads)); }

}  // namespace

void srmsnorm_fwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& y, const Tensor& rstd,
                       float eps, const Tensor& add, const Tensor& h, const Tensor& u) {
  LINAC_CHECK(rstd.dtype == DType::F32, "srmsnorm (GPU): rstd must be f32");
  if (L.N == 0) return;
  cudaStream_t st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(y.dtype, TY, {
                       const TY* a = ptr_or_null<TY>(add);
                       const TY* g = ptr_or_null<TY>(u);
                       TX* hp = ptr_or_null<TX>(h);
                       if (L.C <= kWarpRowMax)
                         srmsnorm_fwd_rows_kernel<TX, TY><<<cuda::grid_1d(L.N * 32, kMaxThreads), kMaxThreads, 0, st>>>(
                             x.data<TX>(), a, g, y.data<TY>(), rstd.data<float>(), hp, L, eps);
                       else
                         srmsnorm_fwd_kernel<TX, TY><<<static_cast<unsigned>(L.N), threads_for(L.C), 0, st>>>(
                             x.data<TX>(), a, g, y.data<TY>(), rstd.data<float>(), hp, L, eps);
                     }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void srmsnorm_bwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& rstd, const Tensor& dy,
                       const Tensor& dx, bool accumulate, const Tensor& u, const Tensor& du) {
  LINAC_CHECK(rstd.dtype == DType::F32, "srmsnorm (GPU): rstd must be f32");
  if (L.N == 0) return;
  cudaStream_t st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(dy.dtype, TDY, LINAC_GPU_DISPATCH(dx.dtype, TDX, {
    const TDY* g = ptr_or_null<TDY>(u);
    TDX* dg = ptr_or_null<TDX>(du);
    if (L.C <= kWarpRowMax)
      srmsnorm_bwd_rows_kernel<TX, TDY, TDX><<<cuda::grid_1d(L.N * 32, kMaxThreads), kMaxThreads, 0, st>>>(
          x.data<TX>(), g, rstd.data<float>(), dy.data<TDY>(), dx.data<TDX>(), dg, L, accumulate);
    else
      srmsnorm_bwd_kernel<TX, TDY, TDX><<<static_cast<unsigned>(L.N), threads_for(L.C), 0, st>>>(
          x.data<TX>(), g, rstd.data<float>(), dy.data<TDY>(), dx.data<TDX>(), dg, L, accumulate);
  })));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
