// Device sigmoid and SiLU' shared by the gated-activation kernels (activation, swiglu, norm_gate,
// short_conv, the lightning passes, the VQ-attention gradient store); the math is in sigmoid.h,
// whose host versions (exact, from exp(-|x|)) the CPU references use.
//
// The sigmoid is 1 / (1 + 2^(-x log2 e)) in the hardware's approximate exp2 and reciprocal,
// flushing subnormals (relative error ~1e-7, far below the bf16 rounding of the results): four
// instructions, where expf and an IEEE division take ~20 with a slow-path branch that keeps the
// compiler from interleaving neighbouring elements. That counts where a few epilogue threads
// evaluate it per element (the GEMM epilogues, the lightning passes) and in the elementwise
// passes, which it otherwise kept from streaming at the memory's pace. For x < -88 the exp2
// overflows to +inf and the reciprocal gives 0, the limit; results below 2^-126 are 0. Every GPU
// kernel uses this one, so a fused kernel gives the bits of the separate ones it replaces.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_common.cuh"

namespace linac::cuda {

__device__ __forceinline__ float sigmoid(float x) {
  const float e = fast_exp2(x * -kLog2e);
  float s;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.f + e));
  return s;
}

// d silu(x) / dx = s (1 + x (1 - s)), s = sigmoid(x).
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}

}  // namespace linac::cuda
