#include "train/content_hash.h"

#include <cstring>

#include "core/mix64.h"

namespace linac {
namespace {

uint64_t word(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

uint64_t step(uint64_t lane, uint64_t w) { return rotl64(lane + w * kMixOdd2, 31) * kMixOdd1; }

}  // namespace

uint64_t content_hash(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {seed + kMixOdd1, seed + kMixOdd2, seed + kMixOdd3, seed - kMixOdd1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) lane[k] = step(lane[k], word(p + i + 8 * static_cast<size_t>(k)));
  uint64_t h = static_cast<uint64_t>(n) * kMixOdd3;
  for (int k = 0; k < 4; ++k) h = rotl64(h ^ mix64(lane[k]), 27) * kMixOdd1 + kMixOdd2;
  for (; i + 8 <= n; i += 8) h = rotl64(h ^ step(0, word(p + i)), 27) * kMixOdd1 + kMixOdd2;
  for (; i < n; ++i) h = rotl64(h ^ (p[i] * kMixOdd3), 11) * kMixOdd1;
  return mix64(h);
}

}  // namespace linac
