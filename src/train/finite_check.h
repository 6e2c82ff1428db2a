// The finiteness check of what a checkpoint would hold: the master weights, the AdamW moments
// and the model's buffers. The step's own guard (train_step.h) looks at the loss and the
// gradient norm before an update, never at the values the update writes; AdamW can write inf
// into weights whose gradients are zero (an unseen embedding row with eps -> 0) while every loss
// stays finite, so the trainer runs this before each checkpoint and at each logged step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "model/param_store.h"

namespace linac {

struct NonFiniteReport {
  int64_t count = 0;                  // inf/NaN values over every rank
  std::vector<std::string> tensors;   // this rank's tensors holding some, as "name (part: k)"
  bool ok() const { return count == 0; }
};

// Counts over what this rank owns (under ZeRO the replicated group on rank 0 only, so the sum
// over ranks counts each value once), summed over ranks through `comm` when given; a collective
// then. Names the tensors only when the count is not zero (a second, per-parameter pass).
NonFiniteReport find_nonfinite(const Ctx& ctx, const ParamStore& ps, const Comm* comm);

}  // namespace linac
