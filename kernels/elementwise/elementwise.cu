// CUDA elementwise ops (math in elementwise.h). Grid-stride loops: groups of four elements
// with one vector access each while both operands are aligned, then a scalar tail (the whole
// range when a pointer is not aligned).
#include <algorithm>

#include "common/cuda_common.cuh"
#include "elementwise/elementwise.h"

namespace linac {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

template <class TD, class TS>
__global__ void add_kernel(TD* __restrict__ dst, const TS* __restrict__ src, float alpha, int64_t n, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = t; i < n4; i += stride) {
    float4 d = cuda::load4(dst + 4 * i);
    const float4 s = cuda::load4(src + 4 * i);
    d.x += alpha * s.x;
    d.y += alpha * s.y;
    d.z += alpha * s.z;
    d.w += alpha * s.w;
    cuda::store4(dst + 4 * i, d);
  }
  for (int64_t i = 4 * n4 + t; i < n; i += stride)
    dst[i] = cuda::from_float<TD>(cuda::to_float(dst[i]) + alpha * cuda::to_float(src[i]));
}

template <class TD, class TS>
__global__ void cast_kernel(TD* __restrict__ dst, const TS* __restrict__ src, int64_t n, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = t; i < n4; i += stride) cuda::store4(dst + 4 * i, cuda::load4(src + 4 * i));
  for (int64_t i = 4 * n4 + t; i < n; i += stride) dst[i] = cuda::from_float<TD>(cuda::to_float(src[i]));
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, float s, int64_t n, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = t; i < n4; i += stride) {
    float4 v = cuda::load4(x + 4 * i);
    v.x *= s;
    v.y *= s;
    v.z *= s;
    v.w *= s;
    cuda::store4(x + 4 * i, v);
  }
  for (int64_t i = 4 * n4 + t; i < n; i += stride) x[i] = cuda::from_float<T>(cuda::to_float(x[i]) * s);
}

// Number of vector groups (0 when a pointer is misaligned) and the grid for the loops above.
int64_t vec_groups(int64_t n, const Tensor& a, const Tensor& b) {
  return cuda::vec4_aligned(a) && cuda::vec4_aligned(b) ? n / 4 : 0;
}
unsigned grid_for(int64_t n, int64_t n4) { return std::min(cuda::grid_1d(n4 > 0 ? n4 : n, kThreads), kMaxBlocks); }

__global__ void increment_i32_kernel(int32_t* __restrict__ x, int64_t n) {
  cuda::dependent_wait();
  cuda::dependent_release();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) ++x[i];
}

}  // namespace

void add_inplace_cuda(const Ctx& ctx, const Tensor& dst, const Tensor& src, float alpha) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int64_t n4 = vec_groups(n, dst, src);
  LINAC_GPU_DISPATCH(dst.dtype, TD, LINAC_GPU_DISPATCH(src.dtype, TS, {
    add_kernel<TD, TS><<<grid_for(n, n4), kThreads, 0, cuda::stream_of(ctx)>>>(dst.data<TD>(), src.data<TS>(), alpha,
                                                                               n, n4);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void cast_cuda(const Ctx& ctx, const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    LINAC_CHECK(dst.dtype == DType::F32 || dst.dtype == DType::BF16, "cast (GPU): f32 or bf16 only");
    LINAC_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, dst.nbytes(), cudaMemcpyDeviceToDevice, cuda::stream_of(ctx)));
    return;
  }
  const int64_t n4 = vec_groups(n, dst, src);
  LINAC_GPU_DISPATCH(dst.dtype, TD, LINAC_GPU_DISPATCH(src.dtype, TS, {
    cast_kernel<TD, TS><<<grid_for(n, n4), kThreads, 0, cuda::stream_of(ctx)>>>(dst.data<TD>(), src.data<TS>(), n, n4);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void scale_inplace_cuda(const Ctx& ctx, const Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t n4 = vec_groups(n, x, x);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    scale_kernel<T><<<grid_for(n, n4), kThreads, 0, cuda::stream_of(ctx)>>>(x.data<T>(), s, n, n4);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void increment_i32_cuda(const Ctx& ctx, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cuda::launch_dependent(ctx, increment_i32_kernel, dim3(grid_for(n, 0)), dim3(kThreads), 0, x.data<int32_t>(), n);
}

}  // namespace linac
