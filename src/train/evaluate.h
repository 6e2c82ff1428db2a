// Mean loss over a split: every target scored once (non-overlapping windows, the last one
// partial). Shared by training's periodic validation and `linac eval`.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/loader.h"
#include "data/mqar.h"
#include "model/model.h"

namespace linac {

struct EvalResult {
  double loss_sum = 0;   // nats, over all scored targets
  int64_t targets = 0;
  double aux_sum = 0;    // the mixers' auxiliary losses (e.g. VQ commitment), summed like loss_sum
  double mean_aux() const { return targets ? aux_sum / static_cast<double>(targets) : 0.0; }
  double mean_loss() const { return targets ? loss_sum / static_cast<double>(targets) : 0.0; }
};

// Called after each batch with the count done so far (targets; MQAR: sequences), for progress.
using EvalProgress = std::function<void(int64_t done)>;

// Runs the loader to its end on `model` (which must have reserved loader.batch() x seq_len()).
// Each batch runs on its longest window only, so a short split is never padded to seq_len.
// documents: data.packing "document" (each token sees only its own document, data/documents.h).
EvalResult evaluate(Model& model, EvalLoader& loader, bool documents = false, const EvalProgress& progress = {});

// MQAR: loss and accuracy (the target is the argmax of the logits) over the labelled positions,
// per slice of an MqarSet and pooled.
struct MqarScore {
  double loss_sum = 0, hits = 0, aux_sum = 0;
  int64_t targets = 0, sequences = 0;
  double accuracy() const { return targets ? hits / static_cast<double>(targets) : 0.0; }
  double mean_loss() const { return targets ? loss_sum / static_cast<double>(targets) : 0.0; }
  MqarScore& operator+=(const MqarScore& o);
};
struct MqarResult {
  std::vector<MqarSlice> slices;
  std::vector<MqarScore> scores;  // one per slice
  MqarScore pooled() const;
  // Sums every score over the data-parallel ranks with `sum` (a rank-sum of one double).
  void reduce(const std::function<double(double)>& sum);
};

// Every example of `set` once: rank r takes examples r, r + world, ... of each slice, in batches
// of up to B sequences of that slice's length (model must have reserved B x set.max_seq_len()).
MqarResult evaluate_mqar(Model& model, const MqarSet& set, int64_t B, int rank, int world,
                         const EvalProgress& progress = {});

}  // namespace linac
