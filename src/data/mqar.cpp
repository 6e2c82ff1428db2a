#include "data/mqar.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace linac {
namespace {

const uint64_t kExampleStream = stream_id("mqar.example");
const uint64_t kOrderStream = stream_id("mqar.order");

// k distinct integers of [lo, hi), in random order (a partial Fisher-Yates shuffle).
std::vector<int32_t> distinct(Rng& rng, int64_t lo, int64_t hi, int64_t k) {
  std::vector<int32_t> pool(static_cast<size_t>(hi - lo));
  std::iota(pool.begin(), pool.end(), static_cast<int32_t>(lo));
  for (int64_t i = 0; i < k; ++i) {
    const uint64_t j = static_cast<uint64_t>(i) + rng.below(static_cast<uint64_t>(hi - lo - i));
    std::swap(pool[static_cast<size_t>(i)], pool[j]);
  }
  pool.resize(static_cast<size_t>(k));
  return pool;
}

}  // namespace

void check_mqar_slice(const MqarSlice& s, int64_t vocab, const std::string& where) {
  auto fail = [&](const std::string& msg) { throw UserError(where + ": " + msg); };
  if (s.pairs < 1) fail("pairs must be >= 1, got " + std::to_string(s.pairs));
  if (s.count < 1) fail("count must be >= 1, got " + std::to_string(s.count));
  if (s.seq_len % 2 != 0 || s.seq_len < 4 * s.pairs)
    fail("seq_len must be even and at least 4 * pairs = " + std::to_string(4 * s.pairs) + ", got " +
         std::to_string(s.seq_len));
  if (s.seq_len >= vocab)
    fail("seq_len " + std::to_string(s.seq_len) + " needs a vocabulary larger than it (model.vocab_size is " +
         std::to_string(vocab) + ")");
  if (s.pairs > vocab / 2 - 1)
    fail(std::to_string(s.pairs) + " pairs need " + std::to_string(s.pairs) + " distinct keys in [1, vocab/2) = [1, " +
         std::to_string(vocab / 2) + ")");
}

void mqar_example(int64_t vocab, int64_t seq_len, int64_t pairs, double power_a, bool random_non_queries,
                  uint64_t seed, uint64_t index, int32_t* tokens, int32_t* targets) {
  const int64_t L = seq_len, P = pairs, V = vocab;
  LINAC_CHECK(L % 2 == 0 && 4 * P <= L && L < V && P >= 1 && P <= V / 2 - 1,
              "mqar_example: L=" + std::to_string(L) + " P=" + std::to_string(P) + " V=" + std::to_string(V));
  Rng rng{seed, kExampleStream + index, 0};  // a stream per example
  const std::vector<int32_t> keys = distinct(rng, 1, V / 2, P);
  const std::vector<int32_t> values = distinct(rng, V / 2, V, P);
  std::fill(tokens, tokens + L, 0);
  std::fill(targets, targets + L, -1);
  for (int64_t i = 0; i < P; ++i) {
    tokens[2 * i] = keys[static_cast<size_t>(i)];
    tokens[2 * i + 1] = values[static_cast<size_t>(i)];
  }
  // Query slots without replacement, each draw proportional to the remaining slots' weights.
  const int64_t S = (L - 2 * P) / 2;
  std::vector<double> weight(static_cast<size_t>(S));
  for (int64_t g = 0; g < S; ++g) weight[static_cast<size_t>(g)] = std::pow(static_cast<double>(g + 1), power_a - 1);
  double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  for (int64_t i = 0; i < P; ++i) {
    const double u = rng.uniform() * total;
    double c = 0;
    int64_t g = -1;
    for (int64_t s = 0; s < S; ++s) {
      if (weight[static_cast<size_t>(s)] == 0) continue;
      g = s;  // the last live slot, should rounding carry u past every cumulative weight
      c += weight[static_cast<size_t>(s)];
      if (u < c) break;
    }
    total -= weight[static_cast<size_t>(g)];
    weight[static_cast<size_t>(g)] = 0;
    const int64_t pos = 2 * P + 2 * g;
    tokens[pos] = keys[static_cast<size_t>(i)];
    targets[pos] = values[static_cast<size_t>(i)];
  }
  if (random_non_queries)
    for (int64_t t = 2 * P; t < L; ++t)
      if (tokens[t] == 0) tokens[t] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
}

MqarSet::MqarSet(std::vector<MqarSlice> slices, int64_t vocab, uint64_t seed, double power_a, bool random_non_queries)
    : slices_(std::move(slices)), vocab_(vocab), seed_(seed), power_a_(power_a), random_non_queries_(random_non_queries) {
  LINAC_CHECK(!slices_.empty(), "MqarSet: no slices");
  begin_.push_back(0);
  for (size_t s = 0; s < slices_.size(); ++s) {
    check_mqar_slice(slices_[s], vocab, "MQAR slice " + std::to_string(s));
    begin_.push_back(begin_.back() + static_cast<uint64_t>(slices_[s].count));
  }
}

MqarSet MqarSet::train(const MqarConfig& m, int64_t vocab) {
  return MqarSet(m.train, vocab, m.train_seed, m.power_a, m.random_non_queries);
}

MqarSet MqarSet::test(const MqarConfig& m, int64_t vocab) {
  return MqarSet(m.test, vocab, m.test_seed, m.power_a, m.random_non_queries);
}

size_t MqarSet::slice_of(uint64_t j) const {
  LINAC_CHECK(j < size(), "MqarSet: example " + std::to_string(j) + " of " + std::to_string(size()));
  return static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), j) - begin_.begin() - 1);
}

int64_t MqarSet::max_seq_len() const {
  int64_t L = 0;
  for (const auto& s : slices_) L = std::max(L, s.seq_len);
  return L;
}

void MqarSet::example(uint64_t j, int32_t* tokens, int32_t* targets) const {
  const MqarSlice& s = slices_[slice_of(j)];
  mqar_example(vocab_, s.seq_len, s.pairs, power_a_, random_non_queries_, seed_, j, tokens, targets);
}

MqarLoader::MqarLoader(const MqarSet& set, int64_t batch, int64_t seq_len, int rank, int world, uint64_t seed)
    : set_(set), B_(batch), T_(seq_len), rank_(rank), world_(world) {
  LINAC_CHECK(batch >= 1 && world >= 1 && rank >= 0 && rank < world, "MqarLoader: batch/rank/world");
  if (set.max_seq_len() > seq_len)
    throw UserError("data.seq_len (" + std::to_string(seq_len) + ") is shorter than the longest MQAR training slice (" +
                    std::to_string(set.max_seq_len()) + ")");
  state_.seed = seed;
}

uint64_t MqarLoader::sample(uint64_t epoch, uint64_t i) const {
  return feistel_permute(state_.seed, kOrderStream + epoch, i, set_.size());
}

int64_t MqarLoader::next(int32_t* tokens, int32_t* targets) {
  const uint64_t n = set_.size();
  int64_t scored = 0;
  // Walk the whole global batch: every rank counts every row's targets, fills only its own.
  uint64_t epoch = state_.epoch, pos = state_.cursor;
  for (int64_t g = 0; g < static_cast<int64_t>(world_) * B_; ++g) {
    const uint64_t j = sample(epoch, pos);
    const MqarSlice& s = set_.slices()[set_.slice_of(j)];
    scored += s.pairs;
    const int64_t b = g - static_cast<int64_t>(rank_) * B_;
    if (b >= 0 && b < B_) {
      int32_t* tok = tokens + b * T_;
      int32_t* tgt = targets + b * T_;
      set_.example(j, tok, tgt);
      std::fill(tok + s.seq_len, tok + T_, 0);
      std::fill(tgt + s.seq_len, tgt + T_, -1);
    }
    if (++pos == n) pos = 0, ++epoch;
  }
  state_.epoch = epoch;
  state_.cursor = pos;
  return scored;
}

}  // namespace linac
