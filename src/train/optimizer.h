// AdamW over a ParamStore: one fused launch per weight-decay group (the store keeps decayed
// parameters first). The update also refreshes the bf16 compute copy.
#pragma once

#include "config/config.h"
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

// Global L2 norm of all gradients (fixed-order reduction, so deterministic).
double grad_norm(const Ctx& ctx, const ParamStore& params);

}  // namespace linac
