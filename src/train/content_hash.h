// A 64-bit hash of a byte string for detecting corruption (checkpoints): not cryptographic.
// Four independent lanes consume 8-byte words (multiply by an odd constant, rotate, multiply),
// so it runs near memory speed; each step is a bijection of the lane for a fixed word, hence a
// change in any one word always changes its lane. The lanes, the tail and the length are then
// folded and mixed (each fold step a bijection, so collisions are ~2^-64 for random damage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace linac {

uint64_t content_hash(const void* data, size_t n, uint64_t seed = 0);
inline uint64_t content_hash(const std::string& s, uint64_t seed = 0) { return content_hash(s.data(), s.size(), seed); }

}  // namespace linac
