// Loaders: (B, T+1) int32 token windows from a TokenDataset split, for training and evaluation.
// Row b of a batch holds T+1 consecutive tokens: inputs are its first T, targets its last T.
//
// TrainLoader — seeded random windows, disjoint across ranks, exactly resumable.
//   Epoch e cuts the split into M(e) = floor((N - 1 - shift(e)) / T) window slots starting at
//   shift(e) + k*T (neighbouring windows share one token, so every token after the shift is a
//   target exactly once per epoch); shift(e) in [0, min(T-1, N-1-T)] is drawn per epoch so
//   slot boundaries move between epochs. The epoch's sample order is a keyed pseudo-random
//   permutation of its slots (a Feistel network over Philox with cycle walking: O(1) memory,
//   any sample computable on its own). Samples form one global stream — epoch 0's M(0)
//   samples, then epoch 1's, ... — and global batch k is the world*B consecutive samples
//   after k*world*B; rank r takes rows [r*B, (r+1)*B) of it. Hence:
//     - ranks never share a window while world*B <= M(e) (within an epoch all slots differ);
//     - `mpirun -np W` with per-rank batch B reads the same windows, in the same rows, as one
//       rank with batch W*B;
//     - the state {seed, epoch, cursor} (cursor = position of the next global batch within
//       the epoch) is the same on every rank and fully determines every later batch, so a run
//       resumed from a saved state continues exactly where it stopped, at any world size with
//       the same world*B.
//
// EvalLoader — each target scored exactly once.
//   Window w covers tokens [w*T, w*T + T + 1), w = 0 .. W-1 with W = ceil((N-1)/T); the last
//   window may be short. Rank r takes windows r, r + world, ... in batches of B rows; every
//   rank yields the same number of batches (num_batches()), with rows past its last window
//   empty. counts[b] is the number of valid targets of row b (targets at positions
//   >= counts[b] and their inputs are padding and must be masked). Token 0 is never a target.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/token_dataset.h"

namespace linac {

struct LoaderState {
  uint64_t seed = 0, epoch = 0, cursor = 0;

  // {version, seed, epoch, cursor}; from_vector/from_json throw UserError on malformed input.
  std::vector<int64_t> to_vector() const;
  static LoaderState from_vector(const std::vector<int64_t>& v);
  nlohmann::json to_json() const;
  static LoaderState from_json(const nlohmann::json& j);
  bool operator==(const LoaderState&) const = default;
};

// What training draws micro-batches from (TrainLoader's token windows, MqarLoader's examples).
class TrainBatches {
 public:
  virtual ~TrainBatches() = default;
  // This rank's next micro-batch: tokens and targets [B, T] row-major (targets < 0 are not
  // scored). Returns the number of scored targets of the global micro-batch (every rank's rows),
  // the same on every rank, so each rank can scale its gradients by the global count.
  virtual int64_t next(int32_t* tokens, int32_t* targets) = 0;
  virtual LoaderState state() const = 0;
  // Continues from a saved state (its seed replaces the constructor's).
  virtual void set_state(const LoaderState& s) = 0;
};

// A keyed bijection of [0, m): element `index` of the permutation for (seed, stream). O(1)
// memory, any element computable on its own.
uint64_t feistel_permute(uint64_t seed, uint64_t stream, uint64_t index, uint64_t m);

class TrainLoader final : public TrainBatches {
 public:
  // Keeps a reference to `ds`, which must outlive the loader. UserError when the split is
  // shorter than T+1 tokens or the shape arguments are invalid.
  TrainLoader(const TokenDataset& ds, Split split, int64_t batch, int64_t seq_len, int rank, int world, uint64_t seed);

  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  size_t batch_elems() const { return static_cast<size_t>(B_ * (T_ + 1)); }

  // This rank's next batch, row-major (B, T+1), into `out` (batch_elems() values).
  void next(int32_t* out);
  std::vector<int32_t> next();
  // The same batch split into inputs (a row's first T tokens) and targets (its last T); every
  // target is scored: returns world * B * T.
  int64_t next(int32_t* tokens, int32_t* targets) override;

  LoaderState state() const override { return state_; }
  void set_state(const LoaderState& s) override { state_ = s; }

  // The pure functions behind next(): slots of an epoch and the token offset of sample i.
  uint64_t windows_in_epoch(uint64_t epoch) const;
  uint64_t window_start(uint64_t epoch, uint64_t index) const;

 private:
  uint64_t shift(uint64_t epoch) const;
  const TokenDataset& ds_;
  Split split_;
  int64_t B_, T_;
  int rank_, world_;
  uint64_t n_;
  LoaderState state_;
};

class EvalLoader {
 public:
  // max_targets > 0 evaluates only the first max_targets targets of the split.
  EvalLoader(const TokenDataset& ds, Split split, int64_t batch, int64_t seq_len, int rank, int world,
             uint64_t max_targets = 0);

  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  size_t batch_elems() const { return static_cast<size_t>(B_ * (T_ + 1)); }
  uint64_t num_windows() const { return windows_; }   // over all ranks
  uint64_t num_targets() const { return n_ - 1; }     // over all ranks
  int64_t num_batches() const;                        // the same on every rank
  int32_t pad_token() const { return pad_; }
  int32_t eos() const;

  // Fills tokens (B, T+1) and counts (B); false once this rank's batches are done.
  bool next(int32_t* tokens, int32_t* counts);
  void reset() { next_batch_ = 0; }

 private:
  const TokenDataset& ds_;
  Split split_;
  int64_t B_, T_;
  int rank_, world_;
  uint64_t n_, windows_;
  int32_t pad_;
  int64_t next_batch_ = 0;
};

}  // namespace linac
