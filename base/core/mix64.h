// The 64-bit mixing of the repository's hashes (train/content_hash.h, hash_words in
// reduce/reduce.h): odd multipliers and an avalanche finalizer, on the host and the device.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace linac {

inline constexpr uint64_t kMixOdd1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, made odd
inline constexpr uint64_t kMixOdd2 = 0xD6E8FEB86659FD93ull;
inline constexpr uint64_t kMixOdd3 = 0xA0761D6478BD642Full;

LINAC_HD uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Every input bit affects every output bit, and it is a bijection (xor-shifts and odd
// multiplications are invertible), so distinct inputs never collide.
LINAC_HD uint64_t mix64(uint64_t h) {
  h ^= h >> 32;
  h *= kMixOdd2;
  h ^= h >> 29;
  h *= kMixOdd3;
  h ^= h >> 32;
  return h;
}

}  // namespace linac
