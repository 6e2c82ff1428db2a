// The rotation of one pair on the device (math in rope.h), shared by the rotation kernels (rope.cu)
// and the attention projection that rotates its products in its GEMM epilogue
// (rope_linear_sm90.cu), so both give the same bits for the same inputs: each product is rounded
// on its own (no contraction into an FMA, which the compiler may form differently in each kernel).
#pragma once

#include <cuda_runtime.h>

namespace linac::cuda {

// (x1, x2) rotated by the angle of (c, s): x1 c - x2 s, x2 c + x1 s.
__device__ __forceinline__ float2 rope_rotate(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace linac::cuda
