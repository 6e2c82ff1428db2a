// CPU reference for the fused softmax cross-entropy (see cross_entropy.h). Rows in parallel;
// each row is read (max, sum, target logit) before it is written, so dlogits may alias logits.
#include <algorithm>
#include <cmath>
#include <string>

#include "cross_entropy/cross_entropy.h"

namespace linac {

template <class T>
void cross_entropy_fwd_bwd_cpu(const T* logits, const int32_t* targets, T* dlogits, T* losses, T* hits, int64_t n,
                               int64_t v, double grad_scale) {
  for (int64_t i = 0; i < n; ++i)
    LINAC_CHECK(targets[i] < v, "cross_entropy: target " + std::to_string(targets[i]) + " of row " +
                                    std::to_string(i) + " is outside the vocabulary of " + std::to_string(v));
  const T scale = static_cast<T>(grad_scale);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = logits + i * v;
    T* dx = dlogits + i * v;
    const int64_t t = targets[i];
    if (t < 0) {
      losses[i] = 0;
      if (hits) hits[i] = 0;
      for (int64_t j = 0; j < v; ++j) dx[j] = 0;
      continue;
    }
    T mx = x[0];
    int64_t argmax = 0;
    for (int64_t j = 1; j < v; ++j)
      if (x[j] > mx) mx = x[j], argmax = j;
    if (hits) hits[i] = argmax == t ? T(1) : T(0);
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] - mx);
    const T lse = mx + std::log(sum);
    losses[i] = lse - x[t];
    for (int64_t j = 0; j < v; ++j) dx[j] = (std::exp(x[j] - lse) - (j == t ? T(1) : T(0))) * scale;
  }
}

template void cross_entropy_fwd_bwd_cpu<float>(const float*, const int32_t*, float*, float*, float*, int64_t, int64_t,
                                               double);
template void cross_entropy_fwd_bwd_cpu<double>(const double*, const int32_t*, double*, double*, double*, int64_t,
                                                int64_t, double);

}  // namespace linac
