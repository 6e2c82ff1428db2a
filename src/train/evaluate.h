// Mean loss over a split: every target scored once (non-overlapping windows, the last one
// partial). Shared by training's periodic validation and `linac eval`.
#pragma once

#include <cstdint>

#include "data/loader.h"
#include "model/model.h"

namespace linac {

struct EvalResult {
  double loss_sum = 0;   // nats, over all scored targets
  int64_t targets = 0;
  double aux_sum = 0;    // the mixers' auxiliary losses (e.g. VQ commitment), summed like loss_sum
  double mean_aux() const { return targets ? aux_sum / static_cast<double>(targets) : 0.0; }
  double mean_loss() const { return targets ? loss_sum / static_cast<double>(targets) : 0.0; }
};

// Runs the loader to its end on `model` (which must have reserved loader.batch() x seq_len()).
// Each batch runs on its longest window only, so a short split is never padded to seq_len.
EvalResult evaluate(Model& model, EvalLoader& loader);

}  // namespace linac
