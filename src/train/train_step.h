// One optimizer step: forward + backward over the micro-batches (gradients accumulate),
// global grad-norm clipping, AdamW, then the mixers' buffer updates (EMA codebooks). A non-finite
// loss or gradient norm skips the update entirely (gradients are discarded, parameters, moments
// and buffers untouched).
// With one process and gradients not sharded, the gradient norm's sums of squares are taken during
// the last micro-batch's backward, group by group (train/grad_squares.h), not after it.
// ZeRO-1/2 (the model's ParamStore sharded): gradients are reduced to the rank owning them (under
// ZeRO-2 in every micro-batch, GradReducer), each rank updates its shard (and the replicated group), then the compute
// weights are all-gathered.
// CUDA graphs (train.cuda_graph, on by default): on one GPU without a profiler, where every mixer
// allows it (Mixer::graph_safe_training), each micro-batch's forward and backward (thousands of
// launches for some architectures) is captured once and then replayed with a single launch. A
// micro-batch is captured when the one at its index in the step before had the same key (token,
// target and document buffers, shape, grad_scale, Model::buffers_epoch) and ran eagerly; its graph
// replays while the key stays. So a run whose grad_scale changes every step (a varying count of
// scored targets) stays eager rather than capturing each step. A replay launches the same kernels
// on the same buffers as the eager micro-batch: the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "comm/grad_reducer.h"
#include "config/config.h"
#include "core/cuda_graph.h"
#include "model/model.h"
#include "train/grad_squares.h"
#include "train/optimizer.h"

namespace linac {

struct MicroBatch {
  Tensor tokens, targets;  // [B, T] int32 on the model's device
  Tensor docs;             // [2, B, T] int32 document bounds (data.packing "document"), or undefined
};

struct StepStats {
  double loss = 0;       // mean loss over the step's valid targets (the language model's)
  double aux_loss = 0;   // the mixers' auxiliary losses per valid target (0 for most architectures)
  double grad_norm = 0;  // before clipping
  double lr = 0;
  bool skipped = false;
};

class TrainStep {
 public:
  // `comm` may be null (a single process). With several ranks, gradients are summed over
  // ranks (GradReducer) before clipping, and the reported loss is the global mean.
  TrainStep(Model& model, const TrainConfig& tc, Comm* comm = nullptr);
  ~TrainStep();
  // `step` is the 0-based step index (for the LR schedule); `target_count` the number of valid
  // targets over all micro-batches of all ranks, so gradients are those of the mean loss.
  StepStats run(int64_t step, const std::vector<MicroBatch>& micro, int64_t target_count);
  // After the master weights changed outside run() (init, checkpoint load): refreshes the compute
  // copy of what this rank owns and, under ZeRO, all-gathers the sharded weights.
  void sync_weights();
  // Updates applied so far (AdamW bias correction); restored from checkpoints.
  int64_t updates() const { return updates_; }
  void set_updates(int64_t n) { updates_ = n; }
  // The gradient reduction over ranks (null with one rank).
  const GradReducer* reducer() const { return reducer_.get(); }
  // Micro-batches run from a captured CUDA graph so far (the capture's own run included).
  int64_t graph_replays() const { return graph_replays_; }

 private:
  // What a micro-batch's captured launches depend on beyond the model's weights.
  struct GraphKey {
    const void *tokens = nullptr, *targets = nullptr, *docs = nullptr;
    int64_t B = 0, T = 0;
    float grad_scale = 0;
    uint64_t epoch = 0;  // Model::buffers_epoch
    bool squares = false;  // the step's last micro-batch: the gradient norm's sums are taken in it
    bool operator==(const GraphKey&) const = default;
  };
  struct MicroGraph {
    CudaGraph graph;
    GraphKey key;       // of the captured graph
    GraphKey warm_key;  // of the last eager run at this index (valid: warm)
    bool warm = false;
  };
  // One micro-batch's forward and backward: eagerly or from its graph; returns its loss sum.
  double forward_backward(size_t i, const MicroBatch& mb, float grad_scale);
  double eager_forward_backward(const MicroBatch& mb, float grad_scale);
  bool graphs_allowed(const MicroBatch& mb) const;

  Model& model_;
  const TrainConfig& tc_;
  AdamW adamw_;
  Comm* comm_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<GradSquares> squares_;  // one process, gradients not sharded
  bool squares_armed_ = false;            // the micro-batch running is the step's last
  int64_t updates_ = 0;
  std::vector<std::unique_ptr<MicroGraph>> graphs_;  // by micro-batch index
  int64_t graph_replays_ = 0;
};

}  // namespace linac
