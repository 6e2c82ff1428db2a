// MQAR: multi-query associative recall (Arora et al. 2024, Based §3.1), generated on the fly.
// The exact generator of docs/mqar.md ("The generator"; the zoology reference), for one example
// of length L with P key-value pairs over a vocabulary of V tokens:
//   keys    P distinct tokens, uniform without replacement from [1, V/2)
//   values  P distinct tokens, uniform without replacement from [V/2, V); key i goes with value i
//   tokens  [0, 2P): k_1 v_1 k_2 v_2 ... k_P v_P
//           [2P, L): S = (L - 2P) / 2 two-token slots; P distinct slots g_i drawn without
//           replacement with Pr[g] proportional to (g + 1)^(power_a - 1); key k_i at 2P + 2 g_i
//           (every key is queried exactly once, in random order)
//   targets -1 (not scored) everywhere but targets[2P + 2 g_i] = v_i: the output at a query
//           predicts its value (the token after a query is noise, not the value)
//   noise   with random_non_queries, every other position of [2P, L) holds a uniform token of
//           [0, V) (it may collide with keys and values, as in the reference); else 0
// An example is a pure function of (seed, index): MqarSet lays its slices (L, P, count) end to
// end, so example j of a set is the same on every rank, every epoch and after every resume.
// The training mixture and the test slices of the paper's Figure 2 are the config defaults
// (data/mqar_config.h); train and test sets use different seeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/mqar_config.h"

namespace linac {

// Writes one example: tokens[0, L), targets[0, L). Checks 4P <= L, L even, P <= V/2 - 1, L < V.
void mqar_example(int64_t vocab, int64_t seq_len, int64_t pairs, double power_a, bool random_non_queries,
                  uint64_t seed, uint64_t index, int32_t* tokens, int32_t* targets);

// UserError (naming `where`, e.g. "configs/x.json: data.mqar.train[2]") when the slice cannot be
// generated with this vocabulary.
void check_mqar_slice(const MqarSlice& s, int64_t vocab, const std::string& where);

class MqarSet {
 public:
  MqarSet(std::vector<MqarSlice> slices, int64_t vocab, uint64_t seed, double power_a, bool random_non_queries);
  // The configured training mixture or test slices (data.mqar) over a vocabulary of `vocab`.
  static MqarSet train(const MqarConfig& m, int64_t vocab);
  static MqarSet test(const MqarConfig& m, int64_t vocab);

  uint64_t size() const { return begin_.back(); }
  const std::vector<MqarSlice>& slices() const { return slices_; }
  uint64_t slice_begin(size_t s) const { return begin_[s]; }  // first example of slice s
  size_t slice_of(uint64_t j) const;
  int64_t max_seq_len() const;
  // Example j: slices()[slice_of(j)].seq_len tokens and targets.
  void example(uint64_t j, int32_t* tokens, int32_t* targets) const;

 private:
  std::vector<MqarSlice> slices_;
  std::vector<uint64_t> begin_;  // prefix sums of the counts, size slices + 1
  int64_t vocab_;
  uint64_t seed_;
  double power_a_;
  bool random_non_queries_;
};

// Training batches from an MqarSet: the epoch order is a keyed permutation of the whole set
// (as TrainLoader's windows), global batch k is the world*B consecutive samples after k*world*B
// and rank r takes rows [r*B, (r+1)*B). Rows are right-padded to seq_len with token 0 and
// target -1 (causal models are unaffected by right padding). State {seed, epoch, cursor} as
// TrainLoader's: resume is exact at any world size with the same world*B.
class MqarLoader final : public TrainBatches {
 public:
  // Keeps a reference to `set`. UserError when a slice is longer than seq_len.
  MqarLoader(const MqarSet& set, int64_t batch, int64_t seq_len, int rank, int world, uint64_t seed);
  int64_t next(int32_t* tokens, int32_t* targets) override;
  LoaderState state() const override { return state_; }
  void set_state(const LoaderState& s) override { state_ = s; }
  // The set index of global sample i of epoch e.
  uint64_t sample(uint64_t epoch, uint64_t i) const;

 private:
  const MqarSet& set_;
  int64_t B_, T_;
  int rank_, world_;
  LoaderState state_;
};

}  // namespace linac
