// The dot product of the kernels' CPU twins and references: one loop in index order,
// accumulated in F, so that every CPU form that calls it sums the same way.
#pragma once

#include <cstdint>

namespace linac {

template <class F>
F dot(const F* a, const F* b, int64_t n) {
  F acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace linac
