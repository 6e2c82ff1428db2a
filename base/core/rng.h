// Philox-4x32-10 counter-based RNG (Salmon et al., SC'11), callable from host and device.
// A random number is a pure function of (seed, stream, index), so any element can be drawn
// independently and in any order: initial weights do not depend on the device, the thread
// count or the order in which parameters are created.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace linac {

struct Philox4 {
  uint32_t v[4];
};

LINAC_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(M1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Four 32-bit words for block `index` of `stream` under `seed`.
LINAC_HD Philox4 philox_block(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(stream >> 32), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in (0, 1], 53-bit resolution, from two words.
LINAC_HD double philox_uniform01(uint32_t a, uint32_t b) {
  const uint64_t bits = ((static_cast<uint64_t>(a) << 32) | b) >> 11;
  return (static_cast<double>(bits) + 1.0) * (1.0 / 9007199254740992.0);
}

// Element `index` of a standard normal sequence (Box-Muller in double).
LINAC_HD double philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const Philox4 r = philox_block(seed, stream, index);
  const double u1 = philox_uniform01(r.v[0], r.v[1]);
  const double u2 = philox_uniform01(r.v[2], r.v[3]);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Element `index` of a uniform [0,1) sequence.
LINAC_HD double philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const Philox4 r = philox_block(seed, stream, index);
  return philox_uniform01(r.v[0], r.v[1]) - 1.0 / 9007199254740992.0;
}

// A stream id from a name (FNV-1a), so each parameter has its own reproducible sequence.
inline uint64_t stream_id(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
  return h;
}

// Sequential generator over one stream: what host code (data sampling, tests) uses.
// Its whole state is (seed, stream, counter), so it checkpoints as three integers.
struct Rng {
  uint64_t seed = 0, stream = 0, counter = 0;
  double uniform() { return philox_uniform(seed, stream, counter++); }
  double normal() { return philox_normal(seed, stream, counter++); }
  uint64_t next_u64() {
    const Philox4 r = philox_block(seed, stream, counter++);
    return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  }
  // Uniform integer in [0, n) without modulo bias worth caring about (n << 2^64).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)) % n; }
};

}  // namespace linac
