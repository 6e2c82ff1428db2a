// CPU reference for the gated linear unit (see swiglu.h); rows in parallel.
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

template void swiglu_fwd_cpu<float>(const float*, float*, int64_t, int64_t, GluAct);
template void swiglu_fwd_cpu<double>(const double*, double*, int64_t, int64_t, GluAct);
template void swiglu_bwd_cpu<float>(const float*, const float*, float*, int64_t, int64_t, GluAct);
template void swiglu_bwd_cpu<double>(const double*, const double*, double*, int64_t, int64_t, GluAct);

}  // namespace linac
