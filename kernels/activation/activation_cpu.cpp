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

template <class T>
void silu_grad_inplace_cpu(int64_t B, int64_t rows, int64_t C, const T* pre, int64_t pre_b, int64_t pre_t, T* g,
                           int64_t g_b, int64_t g_t) {
  SiluLayout L;
  L.N = rows, L.C = C, L.x = pre_t, L.dy = g_t, L.dx = g_t;
  for (int64_t b = 0; b < B; ++b) silu_bwd_cpu<T>(L, pre + b * pre_b, g + b * g_b, g + b * g_b);
}

template void silu_fwd_cpu<float>(const SiluLayout&, const float*, float*);
template void silu_fwd_cpu<double>(const SiluLayout&, const double*, double*);
template void silu_bwd_cpu<float>(const SiluLayout&, const float*, const float*, float*);
template void silu_bwd_cpu<double>(const SiluLayout&, const double*, const double*, double*);
template void silu_grad_inplace_cpu<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                                           int64_t);
template void silu_grad_inplace_cpu<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, double*,
                                            int64_t, int64_t);

}  // namespace linac
