// CUDA RMSNorm (math in rmsnorm.h). One block per row for the forward and dx; the weight
// gradient is reduced deterministically: per-slab partial sums into the context's
// workspace, then a fixed-order sum over slabs.
#include "common/cuda_common.cuh"
#include "rmsnorm/rmsnorm.h"

namespace linac {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSlabs = 256;

template <class TX, class TY>
__global__ void rmsnorm_fwd_kernel(const TX* __restrict__ x, const float* __restrict__ w, TY* __restrict__ y,
                                   float* __restrict__ rstd, int64_t dim, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = cuda::to_float(xr[j]);
    ss += v * v;
  }
  const float rs = rsqrtf(cuda::block_sum(ss, scratch) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    y[r * dim + j] = cuda::from_float<TY>(cuda::to_float(xr[j]) * rs * w[j]);
}

template <class TX, class TY>
__global__ void rmsnorm_bwd_dx_kernel(const TX* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ rstd, const TY* __restrict__ dy, TX* __restrict__ dx,
                                      int64_t dim) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float rs = rstd[r];
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    dot += cuda::to_float(dy[r * dim + j]) * w[j] * cuda::to_float(x[r * dim + j]);
  const float c = rs * rs * rs * cuda::block_sum(dot, scratch) / static_cast<float>(dim);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const int64_t i = r * dim + j;
    const float g = rs * cuda::to_float(dy[i]) * w[j] - cuda::to_float(x[i]) * c;
    dx[i] = cuda::from_float<TX>(cuda::to_float(dx[i]) + g);
  }
}

// partial[s, j] = sum over rows of slab s of dy * x * rstd.
template <class TX, class TY>
__global__ void rmsnorm_bwd_dw_partial_kernel(const TX* __restrict__ x, const float* __restrict__ rstd,
                                              const TY* __restrict__ dy, float* __restrict__ partial, int64_t rows,
                                              int64_t dim, int64_t rows_per_slab) {
  const int64_t s = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = s * rows_per_slab, r1 = min(rows, r0 + rows_per_slab);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += cuda::to_float(dy[r * dim + j]) * cuda::to_float(x[r * dim + j]) * rstd[r];
  partial[s * dim + j] = acc;
}

__global__ void sum_slabs_kernel(const float* __restrict__ partial, float* __restrict__ out, int64_t slabs,
                                 int64_t dim) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  float acc = 0.f;
  for (int64_t s = 0; s < slabs; ++s) acc += partial[s * dim + j];
  out[j] += acc;
}

}  // namespace

void rmsnorm_fwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd,
                      float eps) {
  LINAC_CHECK(w.dtype == DType::F32 && rstd.dtype == DType::F32, "rmsnorm (GPU): w and rstd must be f32");
  const int64_t rows = x.size(0), dim = x.size(1);
  if (rows == 0) return;
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(y.dtype, TY, {
    rmsnorm_fwd_kernel<TX, TY><<<static_cast<unsigned>(rows), kThreads, 0, cuda::stream_of(ctx)>>>(
        x.data<TX>(), w.data<float>(), y.data<TY>(), rstd.data<float>(), dim, eps);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void rmsnorm_bwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx, const Tensor& dw) {
  LINAC_CHECK(w.dtype == DType::F32 && rstd.dtype == DType::F32 && dw.dtype == DType::F32,
              "rmsnorm (GPU): w, rstd and dw must be f32");
  LINAC_CHECK(dx.dtype == x.dtype && dy.dtype != DType::F64, "rmsnorm (GPU): dx must have x's dtype");
  const int64_t rows = x.size(0), dim = x.size(1);
  if (rows == 0) return;
  const int64_t slabs = std::min<int64_t>(rows, kMaxSlabs);
  const int64_t rows_per_slab = (rows + slabs - 1) / slabs;
  LINAC_CHECK(static_cast<size_t>(slabs * dim) * sizeof(float) <= ctx.workspace_bytes,
              "rmsnorm (GPU): workspace too small");
  float* partial = static_cast<float*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(dy.dtype, TY, {
    rmsnorm_bwd_dx_kernel<TX, TY><<<static_cast<unsigned>(rows), kThreads, 0, st>>>(
        x.data<TX>(), w.data<float>(), rstd.data<float>(), dy.data<TY>(), dx.data<TX>(), dim);
    LINAC_CUDA_LAUNCH_CHECK();
    dim3 grid(cuda::grid_1d(dim, kThreads), static_cast<unsigned>(slabs));
    rmsnorm_bwd_dw_partial_kernel<TX, TY><<<grid, kThreads, 0, st>>>(x.data<TX>(), rstd.data<float>(), dy.data<TY>(),
                                                                      partial, rows, dim, rows_per_slab);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
  sum_slabs_kernel<<<cuda::grid_1d(dim, kThreads), kThreads, 0, st>>>(partial, dw.data<float>(), slabs, dim);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
