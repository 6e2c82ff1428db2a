// CPU reference for SwiGLU (see swiglu.h); rows in parallel.
#include <cmath>

#include "swiglu/swiglu.h"

namespace linac {

namespace {
template <class T>
T sigmoid(T x) {
  const T e = std::exp(-std::fabs(x));
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}
}  // namespace

template <class T>
void swiglu_fwd_cpu(const T* h, T* a, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    for (int64_t j = 0; j < f; ++j) a[r * f + j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

template <class T>
void swiglu_bwd_cpu(const T* h, const T* da, T* dh, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    T* dg = dh + r * 2 * f;
    T* du = dg + f;
    for (int64_t j = 0; j < f; ++j) {
      const T s = sigmoid(g[j]), d = da[r * f + j];
      dg[j] = d * u[j] * s * (T(1) + g[j] * (T(1) - s));
      du[j] = d * g[j] * s;
    }
  }
}

template void swiglu_fwd_cpu<float>(const float*, float*, int64_t, int64_t);
template void swiglu_fwd_cpu<double>(const double*, double*, int64_t, int64_t);
template void swiglu_bwd_cpu<float>(const float*, const float*, float*, int64_t, int64_t);
template void swiglu_bwd_cpu<double>(const double*, const double*, double*, int64_t, int64_t);

}  // namespace linac
