// Helpers shared by the Latte CPU references (math in latte.h): row access in the [B, T, H, X]
// layouts, the mixture weights and the -inf-safe logaddexp (docs/latte.md §8.3).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/cpu_dot.h"
#include "latte/latte.h"

namespace linac::latte_cpu {

// Row (b, t, h) of a [B, T, H, X] tensor with free batch/token strides.
template <class P>
P* row(P* p, const LatteLayout::Strides& s, int64_t b, int64_t t, int64_t h, int64_t X) {
  return p + b * s.b + t * s.t + h * X;
}
// Row (b, t, h) of the contiguous lse [B, T, H, L].
template <class P>
P* lse_row(P* p, const LatteLayout& L, int64_t b, int64_t t, int64_t h) {
  return p + ((b * L.T + t) * L.H + h) * L.L;
}

template <class F>
F neg_inf() {
  return -std::numeric_limits<F>::infinity();
}

// log(exp(x) + exp(y)); logaddexp(-inf, y) = y without a NaN.
template <class F>
F logaddexp(F x, F y) {
  const F m = std::max(x, y);
  if (m == neg_inf<F>()) return m;
  return m + std::log(std::exp(x - m) + std::exp(y - m));
}

// pi = softmax(a[0..La)) into pi (size La).
template <class F>
void softmax_row(const F* a, int64_t La, F* pi) {
  F m = a[0];
  for (int64_t j = 1; j < La; ++j) m = std::max(m, a[j]);
  F sum = 0;
  for (int64_t j = 0; j < La; ++j) sum += pi[j] = std::exp(a[j] - m);
  for (int64_t j = 0; j < La; ++j) pi[j] /= sum;
}

// da = pi * (gP - pi . gP) over the La columns.
template <class F>
void softmax_bwd_row(const F* pi, const F* gP, int64_t La, F* da) {
  F dot = 0;
  for (int64_t j = 0; j < La; ++j) dot += pi[j] * gP[j];
  for (int64_t j = 0; j < La; ++j) da[j] = pi[j] * (gP[j] - dot);
}

}  // namespace linac::latte_cpu
