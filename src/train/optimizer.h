// AdamW over a ParamStore: one fused launch per weight-decay range of each range this rank owns
// (everything, or under ZeRO the replicated group and its shard). The update also refreshes the
// bf16 compute copy of what it updates.
#pragma once

#include "config/config.h"
#include "comm/comm.h"
#include "model/param_store.h"

namespace linac {

class AdamW {
 public:
  AdamW(ParamStore& params, const TrainConfig& tc) : params_(params), tc_(tc) {}
  // One update with learning rate `lr`; gradients are multiplied by grad_scale first.
  // `step` is the 1-based count of updates applied so far including this one.
  void update(const Ctx& ctx, double lr, double grad_scale, int64_t step);

 private:
  ParamStore& params_;
  const TrainConfig& tc_;
};

// Global L2 norm of all gradients (fixed-order reductions, so deterministic). Under ZeRO-1/2 each
// rank holds the summed gradients of what it owns only: the squares of the replicated group
// (counted by rank 0) and of every shard are summed over the ranks through `comm`.
double grad_norm(const Ctx& ctx, const ParamStore& params, const Comm* comm = nullptr);

}  // namespace linac
