// hash_words' math (reduce.h), shared by its CPU loop and its CUDA kernel: the term of word i and
// the final mix of the words' sum.
#pragma once

#include <cstdint>

#include "core/mix64.h"

namespace linac {

// Word i (0-based) of the data, keyed by its index: a bijection of w for each i.
LINAC_HD uint64_t hash_word_term(uint64_t w, uint64_t i, uint64_t seed) {
  return mix64(w ^ (seed + (i + 1) * kMixOdd1));
}

LINAC_HD uint64_t hash_words_total(uint64_t term_sum, uint64_t nbytes, uint64_t seed) {
  return mix64(term_sum + nbytes * kMixOdd3 + seed * kMixOdd2);
}

}  // namespace linac
