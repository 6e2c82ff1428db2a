// CPU reference for SiLU (see activation.h); rows in parallel.
#include "activation/activation.h"
#include "activation/sigmoid.h"

namespace linac {

template <class T>
void silu_fwd_cpu(const SiluLayout& L, const T* x, T* y) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.N; ++r)
    for (int64_t j = 0; j < L.C; ++j) {
      const T v = x[r * L.x + j];
      y[r * L.y + j] = v * sigmoid(v);
    }
}

template <class T>
void silu_bwd_cpu(const SiluLayout& L, const T* x, const T* dy, T* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < L.N; ++r)
    for (int64_t j = 0; j < L.C; ++j) dx[r * L.dx + j] = dy[r * L.dy + j] * silu_grad(x[r * L.x + j]);
}

template void silu_fwd_cpu<float>(const SiluLayout&, const float*, float*);
template void silu_fwd_cpu<double>(const SiluLayout&, const double*, double*);
template void silu_bwd_cpu<float>(const SiluLayout&, const float*, const float*, float*);
template void silu_bwd_cpu<double>(const SiluLayout&, const double*, const double*, double*);

}  // namespace linac
