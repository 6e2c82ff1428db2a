// Host sigmoid and SiLU shared by the CPU references of the gated activations (swiglu,
// activation). sigmoid is evaluated from exp(-|x|), which never overflows:
//   sigmoid(x) = 1 / (1 + e)  for x >= 0,   e / (1 + e)  for x < 0,   e = exp(-|x|)
//   silu(x)    = x * sigmoid(x),   silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))
// The device twins are in sigmoid.cuh.
#pragma once

#include <cmath>

namespace linac {

template <class T>
T sigmoid(T x) {
  const T e = std::exp(-std::fabs(x));
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}

template <class T>
T silu_grad(T x) {
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace linac
