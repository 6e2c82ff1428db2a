// Device sigmoid and SiLU shared by the gated-activation kernels (swiglu, activation); the
// math and the overflow-free form are described in sigmoid.h, whose host versions the CPU
// references use.
#pragma once

#include <cuda_runtime.h>

namespace linac::cuda {

__device__ __forceinline__ float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float r = 1.f / (1.f + e);
  return x >= 0.f ? r : e * r;
}

__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}

}  // namespace linac::cuda
