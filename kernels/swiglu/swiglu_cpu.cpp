// CPU reference for the gated linear unit (see swiglu.h); rows in parallel.
#include <cmath>

#include "activation/sigmoid.h"
#include "swiglu/swiglu.h"

namespace linac {

template <class T>
void swiglu_fwd_cpu(const T* h, T* a, int64_t n, int64_t f, GluAct act) {
  const bool silu = act == GluAct::Silu;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    for (int64_t j = 0; j < f; ++j) a[r * f + j] = (silu ? g[j] * sigmoid(g[j]) : g[j]) * u[j];
  }
}

template <class T>
void swiglu_bwd_cpu(const T* h, const T* da, T* dh, int64_t n, int64_t f, GluAct act) {
  const bool silu = act == GluAct::Silu;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    T* dg = dh + r * 2 * f;
    T* du = dg + f;
    for (int64_t j = 0; j < f; ++j) {
      const T d = da[r * f + j];
      dg[j] = d * u[j] * (silu ? silu_grad(g[j]) : T(1));
      du[j] = d * (silu ? g[j] * sigmoid(g[j]) : g[j]);
    }
  }
}

template <class T>
void swiglu_value_dots_cpu(const T* h, const T* dh, float* dots, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* u = h + r * 2 * f + f;
    const T* du = dh + r * 2 * f + f;
    for (int64_t j = 0; j < f / 8; ++j) {
      float acc = 0;
      for (int64_t c = 8 * j; c < 8 * j + 8; ++c)
        acc = std::fma(static_cast<float>(du[c]), static_cast<float>(u[c]), acc);
      dots[r * (f / 8) + j] = acc;
    }
  }
}

template void swiglu_fwd_cpu<float>(const float*, float*, int64_t, int64_t, GluAct);
template void swiglu_fwd_cpu<double>(const double*, double*, int64_t, int64_t, GluAct);
template void swiglu_bwd_cpu<float>(const float*, const float*, float*, int64_t, int64_t, GluAct);
template void swiglu_bwd_cpu<double>(const double*, const double*, double*, int64_t, int64_t, GluAct);
template void swiglu_value_dots_cpu<float>(const float*, const float*, float*, int64_t, int64_t);
template void swiglu_value_dots_cpu<double>(const double*, const double*, float*, int64_t, int64_t);

}  // namespace linac
