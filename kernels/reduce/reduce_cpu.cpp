// CPU reference for the full reductions (see reduce.h): fixed pieces summed in parallel into
// double partials, then the partials in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "reduce/reduce.h"

namespace linac {

namespace {
constexpr int64_t kPieces = 256;

enum class Reduction { Sum, SumSquares, CountNonFinite };

template <Reduction R, class T>
double reduce_double(const T* x, int64_t n) {
  const int64_t len = (n + kPieces - 1) / kPieces;
  std::vector<double> partial(kPieces, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < kPieces; ++p) {
    const int64_t i1 = std::min(n, (p + 1) * len);
    double acc = 0;
    for (int64_t i = p * len; i < i1; ++i) {
      const double v = x[i];
      if constexpr (R == Reduction::SumSquares) acc += v * v;
      else if constexpr (R == Reduction::CountNonFinite) acc += std::isfinite(v) ? 0.0 : 1.0;
      else acc += v;
    }
    partial[static_cast<size_t>(p)] = acc;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}
}  // namespace

template <class T>
void sum_squares_cpu(const T* x, T* out, int64_t n) {
  out[0] = static_cast<T>(reduce_double<Reduction::SumSquares>(x, n));
}

template <class T>
void sum_cpu(const T* x, T* out, int64_t n) {
  out[0] = static_cast<T>(reduce_double<Reduction::Sum>(x, n));
}

template <class T>
void count_nonfinite_cpu(const T* x, T* out, int64_t n) {
  out[0] = static_cast<T>(reduce_double<Reduction::CountNonFinite>(x, n));
}

template void sum_squares_cpu<float>(const float*, float*, int64_t);
template void sum_squares_cpu<double>(const double*, double*, int64_t);
template void sum_cpu<float>(const float*, float*, int64_t);
template void sum_cpu<double>(const double*, double*, int64_t);
template void count_nonfinite_cpu<float>(const float*, float*, int64_t);
template void count_nonfinite_cpu<double>(const double*, double*, int64_t);

}  // namespace linac
