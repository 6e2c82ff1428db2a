// Device helpers shared by the CUDA kernels: dtype conversion, warp/block reductions, the
// stream of a Ctx, and a dispatch over the activation dtype (bf16 or f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac::cuda {

inline cudaStream_t stream_of(const Ctx& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds >= 32 floats.
// Fixed reduction order, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

inline unsigned grid_1d(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace linac::cuda

// Binds T to float or __nv_bfloat16 for a GPU activation dtype.
#define LINAC_GPU_DISPATCH(dtype_, T, ...)                                         \
  do {                                                                             \
    switch (dtype_) {                                                              \
      case ::linac::DType::F32: {                                                  \
        using T = float;                                                           \
        __VA_ARGS__;                                                               \
        break;                                                                     \
      }                                                                            \
      case ::linac::DType::BF16: {                                                 \
        using T = __nv_bfloat16;                                                   \
        __VA_ARGS__;                                                               \
        break;                                                                     \
      }                                                                            \
      default:                                                                     \
        LINAC_FAIL(std::string("GPU kernels take f32 or bf16, got ") + ::linac::dtype_name(dtype_)); \
    }                                                                              \
  } while (0)
