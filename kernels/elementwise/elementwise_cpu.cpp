// CPU reference for the flat elementwise ops (see elementwise.h).
#include "elementwise/elementwise.h"

namespace linac {

template <class T>
void add_inplace_cpu(T* dst, const T* src, double alpha, int64_t n) {
  const T a = static_cast<T>(alpha);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += a * src[i];
}

template <class TD, class TS>
void cast_cpu(TD* dst, const TS* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<TD>(src[i]);
}

template <class T>
void scale_inplace_cpu(T* x, double s, int64_t n) {
  const T c = static_cast<T>(s);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= c;
}

void increment_i32_cpu(int32_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) ++x[i];
}

template void add_inplace_cpu<float>(float*, const float*, double, int64_t);
template void add_inplace_cpu<double>(double*, const double*, double, int64_t);
template void cast_cpu<float, float>(float*, const float*, int64_t);
template void cast_cpu<float, double>(float*, const double*, int64_t);
template void cast_cpu<double, float>(double*, const float*, int64_t);
template void cast_cpu<double, double>(double*, const double*, int64_t);
template void scale_inplace_cpu<float>(float*, double, int64_t);
template void scale_inplace_cpu<double>(double*, double, int64_t);

}  // namespace linac
