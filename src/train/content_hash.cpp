#include "train/content_hash.h"

#include <cstring>

namespace linac {
namespace {

constexpr uint64_t kOdd1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, made odd
constexpr uint64_t kOdd2 = 0xD6E8FEB86659FD93ull;
constexpr uint64_t kOdd3 = 0xA0761D6478BD642Full;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Avalanche: every input bit affects every output bit.
uint64_t finalize(uint64_t h) {
  h ^= h >> 32;
  h *= kOdd2;
  h ^= h >> 29;
  h *= kOdd3;
  h ^= h >> 32;
  return h;
}

uint64_t word(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

uint64_t step(uint64_t lane, uint64_t w) { return rotl(lane + w * kOdd2, 31) * kOdd1; }

}  // namespace

uint64_t content_hash(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {seed + kOdd1, seed + kOdd2, seed + kOdd3, seed - kOdd1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) lane[k] = step(lane[k], word(p + i + 8 * static_cast<size_t>(k)));
  uint64_t h = static_cast<uint64_t>(n) * kOdd3;
  for (int k = 0; k < 4; ++k) h = rotl(h ^ finalize(lane[k]), 27) * kOdd1 + kOdd2;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ step(0, word(p + i)), 27) * kOdd1 + kOdd2;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kOdd3), 11) * kOdd1;
  return finalize(h);
}

}  // namespace linac
