// CPU reference for RMSNorm (see rmsnorm.h for the math). Rows in parallel; dw is reduced
// over rows in a fixed order so results do not depend on the thread count.
#include <cmath>
#include <vector>

#include "rmsnorm/rmsnorm.h"

namespace linac {

template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* add, const T* w, T* y, T* rstd, T* h, int64_t rows, int64_t dim, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    if (add) {
      for (int64_t j = 0; j < dim; ++j) h[r * dim + j] = xr[j] + add[r * dim + j];
      xr = h + r * dim;
    }
    T ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(dim) + T(eps));
    rstd[r] = rs;
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = xr[j] * rs * w[j];
  }
}

template <class T>
void rmsnorm_bwd_cpu(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const T rs = rstd[r];
    T dot = 0;  // sum_j g_j x_j
    for (int64_t j = 0; j < dim; ++j) dot += dyr[j] * w[j] * xr[j];
    const T c = rs * rs * rs * dot / T(dim);
    for (int64_t j = 0; j < dim; ++j) dx[r * dim + j] += rs * dyr[j] * w[j] - xr[j] * c;
  }
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < dim; ++j) {
    T acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dy[r * dim + j] * x[r * dim + j] * rstd[r];
    dw[j] += acc;
  }
}

template void rmsnorm_fwd_cpu<float>(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_fwd_cpu<double>(const double*, const double*, const double*, double*, double*, double*, int64_t,
                                      int64_t, double);
template void rmsnorm_bwd_cpu<float>(const float*, const float*, const float*, const float*, float*, float*, int64_t,
                                     int64_t);
template void rmsnorm_bwd_cpu<double>(const double*, const double*, const double*, const double*, double*, double*,
                                      int64_t, int64_t);

}  // namespace linac
