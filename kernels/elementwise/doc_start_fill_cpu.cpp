// CPU twin of doc_start_fill (doc_start_fill.h).
#include <algorithm>

#include "elementwise/doc_start_fill.h"

namespace linac {

template <class T>
void doc_start_fill_cpu(T* x, const int32_t* doc_start, int64_t B, int64_t T_len, int64_t C, double value) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T_len; ++t)
      if (doc_start[b * T_len + t] == t) std::fill_n(x + (b * T_len + t) * C, C, static_cast<T>(value));
}

template void doc_start_fill_cpu<float>(float*, const int32_t*, int64_t, int64_t, int64_t, double);
template void doc_start_fill_cpu<double>(double*, const int32_t*, int64_t, int64_t, int64_t, double);

}  // namespace linac
