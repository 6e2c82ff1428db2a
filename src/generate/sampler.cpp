#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace linac {

void SamplingOptions::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw UserError("--temperature must be a finite number >= 0 (0 is greedy)");
  if (top_k < 0) throw UserError("--top-k must be >= 0 (0 keeps every token)");
  if (!(top_p > 0 && top_p <= 1)) throw UserError("--top-p must be in (0, 1]");
}

Sampler::Sampler(const SamplingOptions& opt) : opt_(opt) { opt_.validate(); }

int32_t Sampler::sample(const float* logits, int64_t V, uint64_t sequence, uint64_t position) {
  LINAC_CHECK(V >= 1, "Sampler: empty logits");
  if (opt_.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  order_.resize(static_cast<size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  const auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t n = order_.size();
  if (opt_.top_k > 0 && static_cast<size_t>(opt_.top_k) < n) {
    n = static_cast<size_t>(opt_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n), order_.end(), higher);
  } else {
    std::sort(order_.begin(), order_.end(), higher);
  }
  probs_.resize(n);
  const double top = static_cast<double>(logits[order_[0]]);
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += probs_[i] = std::exp((static_cast<double>(logits[order_[i]]) - top) / opt_.temperature);
  size_t kept = n;
  if (opt_.top_p < 1) {
    double mass = 0;
    for (kept = 0; kept < n;) {
      mass += probs_[kept++] / z;
      if (mass >= opt_.top_p) break;
    }
  }
  double kept_mass = 0;
  for (size_t i = 0; i < kept; ++i) kept_mass += probs_[i];
  const double u = philox_uniform(opt_.seed, sequence, position) * kept_mass;
  double acc = 0;
  for (size_t i = 0; i + 1 < kept; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[kept - 1];
}

}  // namespace linac
