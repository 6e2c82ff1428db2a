#include "data/loader.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace linac {
namespace {

constexpr int64_t kStateVersion = 1;
const uint64_t kShiftStream = stream_id("loader.shift");
const uint64_t kPermStream = stream_id("loader.perm");

void check_shape(int64_t batch, int64_t seq_len, int rank, int world) {
  if (batch < 1) throw UserError("batch size must be >= 1, got " + std::to_string(batch));
  if (seq_len < 1) throw UserError("seq_len must be >= 1, got " + std::to_string(seq_len));
  LINAC_CHECK(world >= 1 && rank >= 0 && rank < world,
              "rank " + std::to_string(rank) + " of world " + std::to_string(world));
}

}  // namespace

std::vector<int64_t> LoaderState::to_vector() const {
  return {kStateVersion, static_cast<int64_t>(seed), static_cast<int64_t>(epoch), static_cast<int64_t>(cursor)};
}

LoaderState LoaderState::from_vector(const std::vector<int64_t>& v) {
  if (v.size() != 4 || v[0] != kStateVersion || v[2] < 0 || v[3] < 0)
    throw UserError("malformed data loader state (expected {1, seed, epoch, cursor})");
  return LoaderState{static_cast<uint64_t>(v[1]), static_cast<uint64_t>(v[2]), static_cast<uint64_t>(v[3])};
}

nlohmann::json LoaderState::to_json() const { return {{"seed", seed}, {"epoch", epoch}, {"cursor", cursor}}; }

LoaderState LoaderState::from_json(const nlohmann::json& j) {
  try {
    return LoaderState{j.at("seed").get<uint64_t>(), j.at("epoch").get<uint64_t>(), j.at("cursor").get<uint64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("malformed data loader state: ") + e.what());
  }
}

TrainLoader::TrainLoader(const TokenDataset& ds, Split split, int64_t batch, int64_t seq_len, int rank, int world,
                         uint64_t seed)
    : ds_(ds), split_(split), B_(batch), T_(seq_len), rank_(rank), world_(world), n_(ds.size(split)) {
  check_shape(batch, seq_len, rank, world);
  if (n_ < static_cast<uint64_t>(seq_len) + 1)
    throw UserError(ds.path() + ": split " + split_name(split) + " has " + std::to_string(n_) +
                    " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1));
  state_.seed = seed;
}

uint64_t TrainLoader::shift(uint64_t epoch) const {
  const uint64_t T = static_cast<uint64_t>(T_);
  const uint64_t max_shift = std::min(T - 1, n_ - 1 - T);
  const Philox4 r = philox_block(state_.seed, kShiftStream, epoch);
  return ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) % (max_shift + 1);
}

uint64_t TrainLoader::windows_in_epoch(uint64_t epoch) const {
  return (n_ - 1 - shift(epoch)) / static_cast<uint64_t>(T_);
}

// A balanced Feistel network on the smallest even-bit power of two >= m, iterated until the
// value lands in range (cycle walking keeps it a bijection).
uint64_t feistel_permute(uint64_t seed, uint64_t stream, uint64_t index, uint64_t m) {
  if (m <= 1) return 0;
  int bits = 0;
  while ((uint64_t{1} << bits) < m) ++bits;
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = index;
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const Philox4 r = philox_block(seed, stream, (round << 40) | right);
      const uint64_t f = ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= m);
  return x;
}

uint64_t TrainLoader::window_start(uint64_t epoch, uint64_t index) const {
  const uint64_t m = windows_in_epoch(epoch);
  LINAC_CHECK(index < m, "sample " + std::to_string(index) + " of an epoch of " + std::to_string(m));
  return shift(epoch) + feistel_permute(state_.seed, kPermStream + epoch, index, m) * static_cast<uint64_t>(T_);
}

void TrainLoader::next(int32_t* out) {
  const uint64_t L = static_cast<uint64_t>(T_) + 1;
  // Walk from the batch's first global position to this rank's rows, crossing epochs as needed.
  uint64_t epoch = state_.epoch, pos = state_.cursor + static_cast<uint64_t>(rank_) * B_;
  uint64_t m = windows_in_epoch(epoch);
  while (pos >= m) {
    pos -= m;
    m = windows_in_epoch(++epoch);
  }
  for (int64_t b = 0; b < B_; ++b) {
    ds_.read(split_, window_start(epoch, pos), L, out + b * L);
    if (++pos == m) {
      pos = 0;
      m = windows_in_epoch(++epoch);
    }
  }
  state_.cursor += static_cast<uint64_t>(world_) * B_;
  for (uint64_t em = windows_in_epoch(state_.epoch); state_.cursor >= em; em = windows_in_epoch(state_.epoch)) {
    state_.cursor -= em;
    ++state_.epoch;
  }
}

int64_t TrainLoader::next(int32_t* tokens, int32_t* targets) {
  const int64_t L = T_ + 1;
  std::vector<int32_t> rows(batch_elems());
  next(rows.data());
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      tokens[b * T_ + t] = rows[static_cast<size_t>(b * L + t)];
      targets[b * T_ + t] = rows[static_cast<size_t>(b * L + t + 1)];
    }
  return static_cast<int64_t>(world_) * B_ * T_;
}

std::vector<int32_t> TrainLoader::next() {
  std::vector<int32_t> out(batch_elems());
  next(out.data());
  return out;
}

EvalLoader::EvalLoader(const TokenDataset& ds, Split split, int64_t batch, int64_t seq_len, int rank, int world,
                       uint64_t max_targets)
    : ds_(ds), split_(split), B_(batch), T_(seq_len), rank_(rank), world_(world), n_(ds.size(split)) {
  check_shape(batch, seq_len, rank, world);
  if (max_targets > 0) n_ = std::min(n_, max_targets + 1);
  if (n_ < 2)
    throw UserError(ds.path() + ": split " + split_name(split) + " has " + std::to_string(ds.size(split)) +
                    " tokens, too few to evaluate (need at least 2)");
  windows_ = (n_ - 1 + static_cast<uint64_t>(T_) - 1) / static_cast<uint64_t>(T_);
  pad_ = static_cast<int32_t>(ds.pad_id() >= 0 ? ds.pad_id() : ds.eos_id());
}

int64_t EvalLoader::num_batches() const {
  const uint64_t per_rank = (windows_ + world_ - 1) / world_;
  return static_cast<int64_t>((per_rank + B_ - 1) / B_);
}

bool EvalLoader::next(int32_t* tokens, int32_t* counts) {
  if (next_batch_ >= num_batches()) return false;
  const uint64_t T = static_cast<uint64_t>(T_), L = T + 1;
  for (int64_t b = 0; b < B_; ++b) {
    int32_t* row = tokens + b * L;
    const uint64_t w = static_cast<uint64_t>(rank_) + static_cast<uint64_t>(world_) * (next_batch_ * B_ + b);
    uint64_t len = 0;
    if (w < windows_) {
      const uint64_t start = w * T;
      len = std::min(L, n_ - start);
      ds_.read(split_, start, len, row);
    }
    std::fill(row + len, row + L, pad_);
    counts[b] = len > 0 ? static_cast<int32_t>(len - 1) : 0;
  }
  ++next_batch_;
  return true;
}

int32_t EvalLoader::eos() const { return static_cast<int32_t>(ds_.eos_id()); }

}  // namespace linac
