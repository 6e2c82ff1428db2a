// CPU reference for RoPE (see rope.h); tokens in parallel.
#include <cmath>
#include <vector>

#include "rope/rope.h"

namespace linac {

template <class T>
void rope_apply_cpu(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t stride_b, int64_t stride_t,
                    const RopeFreqs& freqs, int64_t pos0, bool inverse, const int32_t* doc_start,
                    const int32_t* row_pos) {
  const int64_t half = d / 2;
  std::vector<T> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = static_cast<T>(freqs.inv_freq(d, i));
  const T sign = inverse ? T(-1) : T(1);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < b * t; ++bt) {
    const int64_t bi = bt / t, ti = bt % t;
    const T pos = static_cast<T>(pos0 + ti - (doc_start ? doc_start[bt] : 0) + (row_pos ? row_pos[bi] : 0));
    T* xt = x + bi * stride_b + ti * stride_t;
    for (int64_t i = 0; i < half; ++i) {
      const T angle = pos * inv_freq[static_cast<size_t>(i)];
      const T c = std::cos(angle), s = sign * std::sin(angle);
      for (int64_t hi = 0; hi < h; ++hi) {
        T* p = xt + hi * d;
        const T x1 = p[i], x2 = p[i + half];
        p[i] = x1 * c - x2 * s;
        p[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

template void rope_apply_cpu<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeFreqs&,
                                    int64_t, bool, const int32_t*, const int32_t*);
template void rope_apply_cpu<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeFreqs&,
                                     int64_t, bool, const int32_t*, const int32_t*);

}  // namespace linac
