// CPU reference for the embedding (see embedding.h). The backward splits the columns among
// threads; each walks the tokens in position order, so repeated tokens add up the same way
// whatever the thread count.
#include <algorithm>
#include <string>

#include "embedding/embedding.h"

namespace linac {

namespace {
void check_tokens(const int32_t* tokens, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; ++i)
    LINAC_CHECK(tokens[i] >= 0 && tokens[i] < v, "embedding: token id " + std::to_string(tokens[i]) + " at " +
                                                     std::to_string(i) + " is outside [0, " + std::to_string(v) + ")");
}
constexpr int64_t kColumnChunk = 64;
}  // namespace

template <class T>
void embedding_fwd_cpu(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t v, int64_t d) {
  check_tokens(tokens, n, v);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy_n(table + tokens[i] * d, d, out + i * d);
}

template <class T>
void embedding_bwd_cpu(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t v, int64_t d) {
  check_tokens(tokens, n, v);
  const int64_t chunks = (d + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j0 = c * kColumnChunk, j1 = std::min(d, j0 + kColumnChunk);
    for (int64_t i = 0; i < n; ++i) {
      T* row = dtable + tokens[i] * d;
      for (int64_t j = j0; j < j1; ++j) row[j] += dout[i * d + j];
    }
  }
}

template void embedding_fwd_cpu<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t);
template void embedding_fwd_cpu<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t);
template void embedding_bwd_cpu<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t);
template void embedding_bwd_cpu<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t);

}  // namespace linac
