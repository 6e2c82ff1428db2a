// CPU reference for the full reductions (see reduce.h): fixed pieces summed in parallel into
// double partials, then the partials in order.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "reduce/hash_words_math.h"
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

static_assert(std::endian::native == std::endian::little, "hash_words reads words little-endian, as the GPU does");

uint64_t hash_words_cpu(const void* x, int64_t nbytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(x);
  const int64_t full = nbytes / 8;
  uint64_t sum = 0;  // wraps mod 2^64: exact in any order
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < full; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    sum += hash_word_term(w, static_cast<uint64_t>(i), seed);
  }
  if (nbytes % 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + 8 * full, static_cast<size_t>(nbytes % 8));  // little-endian: zeros on top
    sum += hash_word_term(w, static_cast<uint64_t>(full), seed);
  }
  return hash_words_total(sum, static_cast<uint64_t>(nbytes), seed);
}

template void sum_squares_cpu<float>(const float*, float*, int64_t);
template void sum_squares_cpu<double>(const double*, double*, int64_t);
template void sum_cpu<float>(const float*, float*, int64_t);
template void sum_cpu<double>(const double*, double*, int64_t);
template void count_nonfinite_cpu<float>(const float*, float*, int64_t);
template void count_nonfinite_cpu<double>(const double*, double*, int64_t);

}  // namespace linac
