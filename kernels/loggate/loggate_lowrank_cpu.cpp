// CPU reference for the low-rank forget gate (see loggate_lowrank.h); rows in parallel, the
// bias gradient's column sums over rows in order.
#include <algorithm>

#include "loggate/loggate_lowrank.h"
#include "loggate/loggate_math.h"

namespace linac {

namespace {
template <class T>
T projected(const T* u, const T* w, int64_t j, int64_t rank) {
  T z = 0;
  for (int64_t r = 0; r < rank; ++r) z += u[r] * w[j * rank + r];
  return z;
}
}  // namespace

template <class T>
void loggate_lowrank_fwd_cpu(const T* u, int64_t ldu, const T* w, const T* b, T* g, int64_t ldg, int64_t n, int64_t d,
                             int64_t rank, const LogGateOpts& o) {
  const T inv_tau = static_cast<T>(1.0 / o.tau), clamp = static_cast<T>(o.clamp);
#pragma omp parallel for schedule(static) if (n * d * rank > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      const T v = loggate::logsigmoid(projected(u + i * ldu, w, j, rank) + b[j]) * inv_tau;
      g[i * ldg + j] = o.clamped() ? std::max(v, clamp) : v;
    }
}

template <class T>
void loggate_lowrank_bwd_cpu(const T* u, int64_t ldu, const T* w, const T* b, const T* dg, int64_t lddg, T* dz,
                             int64_t lddz, T* db, int64_t n, int64_t d, int64_t rank, const LogGateOpts& o) {
  const T inv_tau = static_cast<T>(1.0 / o.tau), clamp = static_cast<T>(o.clamp);
#pragma omp parallel for schedule(static) if (n * d * rank > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      const T x = projected(u + i * ldu, w, j, rank) + b[j];
      const bool pass = !o.clamped() || loggate::logsigmoid(x) * inv_tau >= clamp;
      dz[i * lddz + j] = pass ? dg[i * lddg + j] * loggate::sigmoid_neg(x) * inv_tau : T(0);
    }
  for (int64_t j = 0; j < d; ++j) {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += dz[i * lddz + j];
    db[j] += s;
  }
}

template void loggate_lowrank_fwd_cpu<float>(const float*, int64_t, const float*, const float*, float*, int64_t,
                                             int64_t, int64_t, int64_t, const LogGateOpts&);
template void loggate_lowrank_fwd_cpu<double>(const double*, int64_t, const double*, const double*, double*, int64_t,
                                              int64_t, int64_t, int64_t, const LogGateOpts&);
template void loggate_lowrank_bwd_cpu<float>(const float*, int64_t, const float*, const float*, const float*, int64_t,
                                             float*, int64_t, float*, int64_t, int64_t, int64_t, const LogGateOpts&);
template void loggate_lowrank_bwd_cpu<double>(const double*, int64_t, const double*, const double*, const double*,
                                              int64_t, double*, int64_t, double*, int64_t, int64_t, int64_t,
                                              const LogGateOpts&);

}  // namespace linac
