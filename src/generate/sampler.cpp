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

namespace {
// top_p alone first sorts this many candidates, then all of them if its prefix needs more.
constexpr size_t kTopPFirstSort = 1024;
}  // namespace

int32_t Sampler::sample(const float* logits, int64_t V, uint64_t sequence, uint64_t position) {
  LINAC_CHECK(V >= 1, "Sampler: empty logits");
  if (opt_.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  const size_t n_ids = static_cast<size_t>(V);
  const double top = static_cast<double>(*std::max_element(logits, logits + V));
  probs_.resize(n_ids);  // unnormalised, by id
  for (size_t i = 0; i < n_ids; ++i) probs_[i] = std::exp((static_cast<double>(logits[i]) - top) / opt_.temperature);
  const double u01 = philox_uniform(opt_.seed, sequence, position);
  const bool cut_k = opt_.top_k > 0 && opt_.top_k < V;
  if (!cut_k && opt_.top_p >= 1) {
    // No cut: every id is a candidate and the draw walks them in id order, with no sort.
    double z = 0;
    for (double p : probs_) z += p;
    const double u = u01 * z;
    double acc = 0;
    size_t last = 0;
    for (size_t i = 0; i < n_ids; ++i) {
      if (probs_[i] == 0) continue;
      acc += probs_[i];
      last = i;
      if (u < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);  // u rounded up to the total: the last id that can be drawn
  }
  // A cut: the candidates in order of logit (ties by id), sorted only as far as the cut needs.
  order_.resize(n_ids);
  std::iota(order_.begin(), order_.end(), 0);
  const auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const size_t n = cut_k ? static_cast<size_t>(opt_.top_k) : n_ids;
  size_t sorted = std::min(n, cut_k ? n : kTopPFirstSort);
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(sorted), order_.end(), higher);
  double z = 0;  // the candidates' total: the top k in order, or every id by id
  if (cut_k)
    for (size_t i = 0; i < n; ++i) z += probs_[static_cast<size_t>(order_[i])];
  else
    for (double p : probs_) z += p;
  size_t kept = n;
  if (opt_.top_p < 1) {
    double mass = 0;
    for (kept = 0; kept < n;) {
      if (kept == sorted) {
        // The prefix outgrew the sorted part; the rest all rank below it (partial_sort).
        std::sort(order_.begin() + static_cast<std::ptrdiff_t>(sorted), order_.end(), higher);
        sorted = n;
      }
      mass += probs_[static_cast<size_t>(order_[kept++])] / z;
      if (mass >= opt_.top_p) break;
    }
  }
  double kept_mass = 0;
  for (size_t i = 0; i < kept; ++i) kept_mass += probs_[static_cast<size_t>(order_[i])];
  const double u = u01 * kept_mass;
  double acc = 0;
  for (size_t i = 0; i + 1 < kept; ++i) {
    acc += probs_[static_cast<size_t>(order_[i])];
    if (u < acc) return order_[i];
  }
  return order_[kept - 1];
}

}  // namespace linac
