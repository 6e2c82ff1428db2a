// Per-element gated linear unit on the device (math in swiglu.h), shared by the elementwise
// kernels (swiglu.cu) and the Hopper GEMMs that apply it in their epilogues
// (swiglu_linear_*_sm90.cu), so both give the same bits for the same inputs.
//
// The sigmoid here uses the hardware's approximate exp2 and division (relative error ~1e-7, far
// below the bf16 rounding of the results) instead of expf and an IEEE division, whose slow-path
// branch keeps the compiler from interleaving neighbouring elements: the GEMM epilogues run this
// on a few warps per SM, where the dependent latency of each element is what counts.
#pragma once

#include <cuda_runtime.h>

#include "swiglu/swiglu.h"

namespace linac::cuda {

__device__ __forceinline__ float glu_sigmoid(float x) {
  const float e = __expf(-fabsf(x));
  const float r = __fdividef(1.f, 1.f + e);
  return x >= 0.f ? r : e * r;
}

template <GluAct kAct>
__device__ __forceinline__ float swiglu(float g, float u) {
  if constexpr (kAct == GluAct::Silu) return g * glu_sigmoid(g) * u;
  return g * u;
}

template <GluAct kAct>
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  if constexpr (kAct == GluAct::Silu) {
    const float s = glu_sigmoid(g);
    dg = d * u * (s * (1.f + g * (1.f - s)));
    du = d * g * s;
  } else {
    dg = d * u;
    du = d * g;
  }
}

}  // namespace linac::cuda
