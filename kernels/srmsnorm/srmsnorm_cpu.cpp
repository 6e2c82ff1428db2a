// CPU reference for SimpleRMSNorm (see srmsnorm.h); rows in parallel.
#include <cmath>

#include "srmsnorm/srmsnorm.h"

namespace linac {

template <class T>
void srmsnorm_fwd_cpu(const SrmsnormLayout& L, const T* x, const T* add, const T* u, T* y, T* rstd, T* h, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.N; ++r) {
    const T* xr = x + r * L.x;
    if (add) {
      for (int64_t j = 0; j < L.C; ++j) h[r * L.h + j] = xr[j] + add[r * L.add + j];
      xr = h + r * L.h;
    }
    T ss = 0;
    for (int64_t j = 0; j < L.C; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(L.C) + T(eps));
    rstd[r] = rs;
    const T ry = rs * T(L.scale);
    for (int64_t j = 0; j < L.C; ++j) y[r * L.y + j] = xr[j] * ry * (u ? u[r * L.u + j] : T(1));
  }
}

template <class T>
void srmsnorm_bwd_cpu(const SrmsnormLayout& L, const T* x, const T* u, const T* t, const T* rstd, const T* dy, T* dx,
                      T* du, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.N; ++r) {
    const T* xr = x + r * L.x;
    const T* dyr = dy + r * L.dy;
    T* dxr = dx + r * L.dx;
    const T rs = rstd[r];
    // gy: the gradient of y (dy, plus the pull toward the target); dn: that of the normalised row
    // (gy * scale, times the gate where there is one).
    const T sc = T(L.scale), pull = T(L.pull);
    auto gy = [&](int64_t j) { return t ? dyr[j] + pull * (xr[j] * rs * sc - t[r * L.t + j]) : dyr[j]; };
    auto dn = [&](int64_t j) { return u ? gy(j) * sc * u[r * L.u + j] : gy(j) * sc; };
    T dot = 0;  // sum_j n_j dn_j
    for (int64_t j = 0; j < L.C; ++j) dot += xr[j] * rs * dn(j);
    const T m = dot / T(L.C);
    for (int64_t j = 0; j < L.C; ++j) {
      const T g = rs * (dn(j) - xr[j] * rs * m);
      dxr[j] = accumulate ? dxr[j] + g : g;
      if (du) du[r * L.du + j] = gy(j) * sc * xr[j] * rs;
    }
  }
}

template void srmsnorm_fwd_cpu<float>(const SrmsnormLayout&, const float*, const float*, const float*, float*, float*,
                                      float*, double);
template void srmsnorm_fwd_cpu<double>(const SrmsnormLayout&, const double*, const double*, const double*, double*,
                                       double*, double*, double);
template void srmsnorm_bwd_cpu<float>(const SrmsnormLayout&, const float*, const float*, const float*, const float*,
                                      const float*, float*, float*, bool);
template void srmsnorm_bwd_cpu<double>(const SrmsnormLayout&, const double*, const double*, const double*,
                                       const double*, const double*, double*, double*, bool);

}  // namespace linac
