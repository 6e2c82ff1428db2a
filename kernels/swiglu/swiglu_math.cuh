// Per-element gated linear unit on the device (math in swiglu.h), shared by the elementwise
// kernels (swiglu.cu) and the Hopper GEMMs that apply it in their epilogues
// (swiglu_linear_*_sm90.cu), so both give the same bits for the same inputs.
//
// The sigmoid is activation/sigmoid.cuh's (four instructions: the GEMM epilogues run this on a
// few warps per SM, where each instruction and the dependent latency of each element count).
#pragma once

#include <cuda_runtime.h>

#include "activation/sigmoid.cuh"
#include "swiglu/swiglu.h"

namespace linac::cuda {

template <GluAct kAct>
__device__ __forceinline__ float swiglu(float g, float u) {
  if constexpr (kAct == GluAct::Silu) return g * sigmoid(g) * u;
  return g * u;
}

// dg = d u s (1 + g (1 - s)), du = d g s, as u (d s + du (1 - s)) and (d s) g: five instructions.
template <GluAct kAct>
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  if constexpr (kAct == GluAct::Silu) {
    const float s = sigmoid(g), ds = d * s;
    du = ds * g;
    dg = u * fmaf(du, 1.f - s, ds);
  } else {
    dg = d * u;
    du = d * g;
  }
}

}  // namespace linac::cuda
