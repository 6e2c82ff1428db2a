// The gate's two functions, shared by the CPU loops and the CUDA kernels (loggate.h has the math):
// logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)) and sigmoid(-x) from exp(-|x|), forms that neither
// overflow nor lose the tail (never log(sigmoid(x)) or 1 - sigmoid(x)). In f32 on the GPU, exp,
// log1p(e) = log(1 + e) and the division use the hardware's approximate instructions: logsigmoid
// is then off by at most ~2e-7 absolutely (the rounding of 1 + e and lg2.approx), sigmoid(-x) by
// ~1e-7 relatively; the precise library calls took most of the gate kernels' instructions.
#pragma once

#include <cmath>
#include <type_traits>

#if defined(__CUDACC__)
#define LINAC_LOGGATE_FN __host__ __device__ __forceinline__
#else
#define LINAC_LOGGATE_FN inline
#endif

namespace linac::loggate {

template <class T>
LINAC_LOGGATE_FN T logsigmoid(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return fminf(x, 0.f) - __logf(1.f + __expf(-fabsf(x)));
#endif
  return (x < T(0) ? x : T(0)) - std::log1p(std::exp(-std::fabs(x)));
}

// sigmoid(-x)
template <class T>
LINAC_LOGGATE_FN T sigmoid_neg(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    const float e = __expf(-fabsf(x));
    return __fdividef(x >= 0.f ? e : 1.f, 1.f + e);
  }
#endif
  const T e = std::exp(-std::fabs(x));
  return x >= T(0) ? e / (T(1) + e) : T(1) / (T(1) + e);
}

}  // namespace linac::loggate

#undef LINAC_LOGGATE_FN
