// CUDA SiLU (math in activation.h). A flat grid-stride loop over the N x C elements, so narrow
// column ranges (C = a head's width) keep every thread busy; row and column come from the flat
// index, and each row is read and written through its own stride.
#include <algorithm>

#include "activation/activation.h"
#include "activation/sigmoid.cuh"
#include "common/cuda_common.cuh"

namespace linac {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 65536;

template <class T>
__global__ void silu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t c, int64_t ldx,
                                int64_t ldy) {
  const int64_t total = n * c;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const float v = cuda::to_float(x[r * ldx + j]);
    y[r * ldy + j] = cuda::from_float<T>(v * cuda::sigmoid(v));
  }
}

template <class T>
__global__ void silu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t n,
                                int64_t c, int64_t ldx, int64_t lddy, int64_t lddx) {
  const int64_t total = n * c;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const float g = cuda::to_float(dy[r * lddy + j]) * cuda::silu_grad(cuda::to_float(x[r * ldx + j]));
    dx[r * lddx + j] = cuda::from_float<T>(g);
  }
}

unsigned blocks_for(int64_t total) { return std::min(cuda::grid_1d(total, kThreads), kMaxBlocks); }

}  // namespace

void silu_fwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& y) {
  LINAC_CHECK(x.dtype == y.dtype, "silu (GPU): x and y must share a dtype");
  if (L.N * L.C == 0) return;
  LINAC_GPU_DISPATCH(x.dtype, T, {
    silu_fwd_kernel<T><<<blocks_for(L.N * L.C), kThreads, 0, cuda::stream_of(ctx)>>>(x.data<T>(), y.data<T>(), L.N,
                                                                                     L.C, L.x, L.y);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void silu_bwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  LINAC_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "silu (GPU): x, dy and dx must share a dtype");
  if (L.N * L.C == 0) return;
  LINAC_GPU_DISPATCH(x.dtype, T, {
    silu_bwd_kernel<T><<<blocks_for(L.N * L.C), kThreads, 0, cuda::stream_of(ctx)>>>(
        x.data<T>(), dy.data<T>(), dx.data<T>(), L.N, L.C, L.x, L.dy, L.dx);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
