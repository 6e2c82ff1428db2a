// CPU reference for LRPE-d (see lrpe.h). The forward and dx run over (b, t) rows in parallel;
// dtheta over columns (h, j) in parallel, each summing slab partials in the order the GPU does.
// Row bt = b T + t is token t of sequence b, also in the document bounds.
#include <cmath>

#include "lrpe/lrpe.h"

namespace linac {

template <class T>
void lrpe_fwd_cpu(const LrpeLayout& L, const T* x, const T* theta, T* y) {
  const int64_t hd = L.H * L.D;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < L.B * L.T; ++bt) {
    const int64_t bi = bt / L.T, ti = bt % L.T;
    const int64_t p0 = L.pos0 + (L.row_pos ? L.row_pos[bi] : 0);
    const T pos = static_cast<T>(p0 + ti - (L.doc_start ? L.doc_start[bt] : 0));
    const T* xt = x + bi * L.x.b + ti * L.x.t;
    T* yt = y + bi * L.y.b + ti * L.y.t;
    for (int64_t c = 0; c < hd; ++c) {
      const int64_t hi = c / L.D, j = c - hi * L.D;
      const T a = pos * theta[c];
      yt[hi * 2 * L.D + j] = xt[c] * std::cos(a);
      yt[hi * 2 * L.D + L.D + j] = xt[c] * std::sin(a);
    }
  }
}

template <class T>
void lrpe_bwd_cpu(const LrpeLayout& L, const T* x, const T* theta, const T* dy, T* dx, T* dtheta) {
  const int64_t hd = L.H * L.D, rows = L.B * L.T;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int64_t bi = bt / L.T, ti = bt % L.T;
    const T pos = static_cast<T>(L.pos0 + ti - (L.doc_start ? L.doc_start[bt] : 0));
    const T* dyt = dy + bi * L.dy.b + ti * L.dy.t;
    T* dxt = dx + bi * L.dx.b + ti * L.dx.t;
    for (int64_t c = 0; c < hd; ++c) {
      const int64_t hi = c / L.D, j = c - hi * L.D;
      const T a = pos * theta[c];
      dxt[c] = dyt[hi * 2 * L.D + j] * std::cos(a) + dyt[hi * 2 * L.D + L.D + j] * std::sin(a);
    }
  }
  const int64_t slabs = lrpe_slabs(rows), per_slab = lrpe_rows_per_slab(rows);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < hd; ++c) {
    const int64_t hi = c / L.D, j = c - hi * L.D;
    T total = 0;
    for (int64_t s = 0; s < slabs; ++s) {
      T acc = 0;
      for (int64_t bt = s * per_slab; bt < std::min(rows, (s + 1) * per_slab); ++bt) {
        const int64_t bi = bt / L.T, ti = bt % L.T;
        const T pos = static_cast<T>(L.pos0 + ti - (L.doc_start ? L.doc_start[bt] : 0));
        const T a = pos * theta[c];
        const T* dyt = dy + bi * L.dy.b + ti * L.dy.t + hi * 2 * L.D;
        acc += pos * x[bi * L.x.b + ti * L.x.t + c] * (-std::sin(a) * dyt[j] + std::cos(a) * dyt[L.D + j]);
      }
      total += acc;
    }
    dtheta[c] += total;
  }
}

template void lrpe_fwd_cpu<float>(const LrpeLayout&, const float*, const float*, float*);
template void lrpe_fwd_cpu<double>(const LrpeLayout&, const double*, const double*, double*);
template void lrpe_bwd_cpu<float>(const LrpeLayout&, const float*, const float*, const float*, float*, float*);
template void lrpe_bwd_cpu<double>(const LrpeLayout&, const double*, const double*, const double*, double*, double*);

}  // namespace linac
