// Per-element gated linear unit on the device (math in swiglu.h), shared by the elementwise
// kernels (swiglu.cu) and the Hopper GEMMs that apply it in their epilogues
// (swiglu_linear_*_sm90.cu), so both give the same bits for the same inputs.
//
// The sigmoid is 1 / (1 + 2^(-x log2 e)) in the hardware's approximate exp2 and reciprocal,
// flushing subnormals (relative error ~1e-7, far below the bf16 rounding of the results): four
// instructions. expf and an IEEE division took a slow-path branch that kept the compiler from
// interleaving neighbouring elements, and the approximations without flushing add a range check
// around each; the GEMM epilogues run this on a few warps per SM, where each instruction and the
// dependent latency of each element count. For x < -88 the exp2 overflows to +inf and the
// reciprocal gives 0, the limit; results below 2^-126 are 0.
#pragma once

#include <cuda_runtime.h>

#include "swiglu/swiglu.h"

namespace linac::cuda {

__device__ __forceinline__ float glu_sigmoid(float x) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.44269504088896341f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.f + e));
  return s;
}

template <GluAct kAct>
__device__ __forceinline__ float swiglu(float g, float u) {
  if constexpr (kAct == GluAct::Silu) return g * glu_sigmoid(g) * u;
  return g * u;
}

// dg = d u s (1 + g (1 - s)), du = d g s, as u (d s + du (1 - s)) and (d s) g: five instructions.
template <GluAct kAct>
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  if constexpr (kAct == GluAct::Silu) {
    const float s = glu_sigmoid(g), ds = d * s;
    du = ds * g;
    dg = u * fmaf(du, 1.f - s, ds);
  } else {
    dg = d * u;
    du = d * g;
  }
}

}  // namespace linac::cuda
