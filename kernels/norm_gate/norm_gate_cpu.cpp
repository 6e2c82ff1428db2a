// CPU reference for the per-head norm + swish gate (see norm_gate.h); rows in parallel.
#include <cmath>

#include "norm_gate/norm_gate.h"

namespace linac {

namespace {
template <class T>
T sigmoid(T x) {
  const T e = std::exp(-std::fabs(x));
  return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}
}  // namespace

template <class T>
void norm_gate_fwd_cpu(const NormGateLayout& L, const T* x, const T* r, const T* br, T* y, T* mean, T* rstd) {
  const int64_t D = L.D;
#pragma omp parallel for schedule(static) if (L.N * L.H * D > (1 << 16))
  for (int64_t n = 0; n < L.N; ++n)
    for (int64_t h = 0; h < L.H; ++h) {
      const T* xr = x + n * L.x + h * D;
      T m = 0, v = 0;
      for (int64_t j = 0; j < D; ++j) m += xr[j];
      m /= static_cast<T>(D);
      for (int64_t j = 0; j < D; ++j) v += (xr[j] - m) * (xr[j] - m);
      const T rs = T(1) / std::sqrt(v / static_cast<T>(D) + static_cast<T>(L.eps));
      mean[n * L.H + h] = m;
      rstd[n * L.H + h] = rs;
      for (int64_t j = 0; j < D; ++j) {
        const int64_t c = h * D + j;
        const T p = r[n * L.r + c] + br[c];
        y[n * L.y + c] = (xr[j] - m) * rs * p * sigmoid(p);
      }
    }
}

template <class T>
void norm_gate_bwd_cpu(const NormGateLayout& L, const T* x, const T* r, const T* br, const T* mean, const T* rstd,
                       const T* dy, T* dx, T* dr) {
  const int64_t D = L.D;
#pragma omp parallel for schedule(static) if (L.N * L.H * D > (1 << 16))
  for (int64_t n = 0; n < L.N; ++n)
    for (int64_t h = 0; h < L.H; ++h) {
      const T m = mean[n * L.H + h], rs = rstd[n * L.H + h];
      T sum_du = 0, sum_duu = 0;
      for (int64_t j = 0; j < D; ++j) {
        const int64_t c = h * D + j;
        const T p = r[n * L.r + c] + br[c], s = sigmoid(p), u = (x[n * L.x + c] - m) * rs, d = dy[n * L.dy + c];
        const T du = d * p * s;
        sum_du += du;
        sum_duu += du * u;
        dr[n * L.dr + c] = d * u * s * (T(1) + p * (T(1) - s));
      }
      const T mdu = sum_du / static_cast<T>(D), mduu = sum_duu / static_cast<T>(D);
      for (int64_t j = 0; j < D; ++j) {
        const int64_t c = h * D + j;
        const T p = r[n * L.r + c] + br[c], u = (x[n * L.x + c] - m) * rs;
        dx[n * L.dx + c] = rs * (dy[n * L.dy + c] * p * sigmoid(p) - mdu - u * mduu);
      }
    }
}

template void norm_gate_fwd_cpu<float>(const NormGateLayout&, const float*, const float*, const float*, float*, float*,
                                       float*);
template void norm_gate_fwd_cpu<double>(const NormGateLayout&, const double*, const double*, const double*, double*,
                                        double*, double*);
template void norm_gate_bwd_cpu<float>(const NormGateLayout&, const float*, const float*, const float*, const float*,
                                       const float*, const float*, float*, float*);
template void norm_gate_bwd_cpu<double>(const NormGateLayout&, const double*, const double*, const double*,
                                        const double*, const double*, const double*, double*, double*);

}  // namespace linac
