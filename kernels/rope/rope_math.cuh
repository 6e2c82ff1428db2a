// The rotation of one pair on the device (math in rope.h), shared by the rotation kernels (rope.cu)
// and the attention projection that rotates its products in its GEMM epilogue
// (rope_linear_sm90.cu), so both give the same bits for the same inputs: each product is rounded
// on its own (no contraction into an FMA, which the compiler may form differently in each kernel).
#pragma once

#include <cuda_runtime.h>

#include "rope/rope.h"

namespace linac::cuda {

// The D/2 inverse frequencies of a head dim D in f32 (rope_inv_freq_f32), for a
// __grid_constant__ kernel parameter that kernels index without a local copy.
struct RopeInvFreq {
  float v[kRopeMaxDim / 2];
};

inline RopeInvFreq rope_inv_freq_table(const RopeFreqs& freqs, int64_t d) {
  RopeInvFreq t{};
  for (int64_t i = 0; i < d / 2; ++i) t.v[i] = rope_inv_freq_f32(freqs, d, i);
  return t;
}

// (x1, x2) rotated by the angle of (c, s): x1 c - x2 s, x2 c + x1 s.
__device__ __forceinline__ float2 rope_rotate(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace linac::cuda
