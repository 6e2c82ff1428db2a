// CPU reference for the log-space forget gate (see loggate.h); rows in parallel.
#include <algorithm>

#include "loggate/loggate.h"
#include "loggate/loggate_math.h"

namespace linac {

using loggate::logsigmoid;
using loggate::sigmoid_neg;

template <class T>
void loggate_fwd_cpu(const T* z, int64_t ldz, const T* b, T* g, int64_t ldg, int64_t n, int64_t d,
                     const LogGateOpts& o) {
  const T inv_tau = static_cast<T>(1.0 / o.tau), clamp = static_cast<T>(o.clamp);
#pragma omp parallel for schedule(static) if (n * d > (1 << 16))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      const T v = logsigmoid(z[r * ldz + j] + b[j]) * inv_tau;
      g[r * ldg + j] = o.clamped() ? std::max(v, clamp) : v;
    }
}

template <class T>
void loggate_bwd_cpu(const T* z, int64_t ldz, const T* b, const T* dg, int64_t lddg, T* dz, int64_t lddz, int64_t n,
                     int64_t d, const LogGateOpts& o) {
  const T inv_tau = static_cast<T>(1.0 / o.tau), clamp = static_cast<T>(o.clamp);
#pragma omp parallel for schedule(static) if (n * d > (1 << 16))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) {
      const T x = z[r * ldz + j] + b[j];
      const bool pass = !o.clamped() || logsigmoid(x) * inv_tau >= clamp;
      dz[r * lddz + j] = pass ? dg[r * lddg + j] * sigmoid_neg(x) * inv_tau : T(0);
    }
}

template void loggate_fwd_cpu<float>(const float*, int64_t, const float*, float*, int64_t, int64_t, int64_t,
                                     const LogGateOpts&);
template void loggate_fwd_cpu<double>(const double*, int64_t, const double*, double*, int64_t, int64_t, int64_t,
                                      const LogGateOpts&);
template void loggate_bwd_cpu<float>(const float*, int64_t, const float*, const float*, int64_t, float*, int64_t,
                                     int64_t, int64_t, const LogGateOpts&);
template void loggate_bwd_cpu<double>(const double*, int64_t, const double*, const double*, int64_t, double*, int64_t,
                                      int64_t, int64_t, const LogGateOpts&);

}  // namespace linac
