// CPU reference for the fused AdamW step (see adamw.h).
#include <cmath>

#include "adamw/adamw.h"

namespace linac {

template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, T* compute_copy, int64_t n, const AdamWArgs& a) {
  const T b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay, gs = a.grad_scale;
  const T bc1 = static_cast<T>(1 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  const T bc2 = static_cast<T>(1 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step)));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * gs;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const T mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= lr * (wd * param[i] + mhat / (std::sqrt(vhat) + eps));
    if (compute_copy) compute_copy[i] = param[i];
  }
}

template void adamw_step_cpu<float>(float*, const float*, float*, float*, float*, int64_t, const AdamWArgs&);
template void adamw_step_cpu<double>(double*, const double*, double*, double*, double*, int64_t, const AdamWArgs&);

}  // namespace linac
