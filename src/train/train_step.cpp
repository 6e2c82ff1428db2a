#include "train/train_step.h"

#include <cmath>

#include "core/profiler.h"
#include "train/lr_schedule.h"

namespace linac {

TrainStep::TrainStep(Model& model, const TrainConfig& tc, Comm* comm)
    : model_(model), tc_(tc), adamw_(model.params(), tc), comm_(comm) {
  LINAC_CHECK(!model.params().sharded() || (comm_ && comm_->world() == model.params().shard_world()),
              "TrainStep: a ZeRO model needs the communicator of its ranks");
  if (comm_ && comm_->world() > 1) {
    reducer_ = std::make_unique<GradReducer>(
        model.params(), *comm_, model.env().ctx, static_cast<size_t>(tc.bucket_mb * 1024 * 1024), tc.overlap_comm,
        model.grad_groups(), tc.reduce_dtype == "bf16" ? DType::BF16 : model.params().master_dtype());
    model_.set_grad_hooks(
        [this](const std::vector<int>& ids) { reducer_->on_begin(ids); },
        [this](const std::vector<int>& ids, bool window_ahead) { reducer_->on_ready(ids, window_ahead); },
        [this] { reducer_->window(); });
  } else if (!model.params().sharded()) {
    squares_ = std::make_unique<GradSquares>(model.params(), model.env().ctx, model.grad_groups());
    model_.set_grad_hooks(
        nullptr,
        [this](const std::vector<int>& ids, bool) {
          if (squares_armed_) squares_->on_ready(ids);
        },
        nullptr);
  }
}

TrainStep::~TrainStep() {
  if (reducer_ || squares_) model_.set_grad_hooks(nullptr, nullptr, nullptr);
}

void TrainStep::sync_weights() {
  ParamStore& ps = model_.params();
  ps.refresh_compute(model_.env().ctx);
  if (ps.sharded()) comm_->allgather(ps.sharded_weights(), model_.env().ctx.stream);
}

bool TrainStep::graphs_allowed(const MicroBatch& mb) const {
  const Ctx& ctx = model_.env().ctx;
  return tc_.cuda_graph && ctx.is_gpu() && !reducer_ && !ctx.profiler && model_.training_graph_safe(mb.docs.defined());
}

double TrainStep::forward_backward(size_t i, const MicroBatch& mb, float grad_scale) {
  if (!graphs_allowed(mb)) return eager_forward_backward(mb, grad_scale);
  while (graphs_.size() <= i) graphs_.push_back(std::make_unique<MicroGraph>());
  MicroGraph& g = *graphs_[i];
  const GraphKey key{mb.tokens.ptr, mb.targets.ptr,         mb.docs.ptr,   mb.tokens.size(0), mb.tokens.size(1),
                     grad_scale,    model_.buffers_epoch(), squares_armed_};
  const Ctx& ctx = model_.env().ctx;
  if (!(g.graph.captured() && g.key == key)) {
    g.graph.reset();
    if (!(g.warm && g.warm_key == key)) {
      // First sight of this key: run eagerly (scratch buffers take their sizes) and capture next time.
      const double loss = eager_forward_backward(mb, grad_scale);
      g.warm_key = key;
      g.warm_key.epoch = model_.buffers_epoch();
      g.warm = true;
      return loss;
    }
    g.graph.capture(ctx, [&] {
      model_.launch_forward_backward(mb.tokens, mb.targets, grad_scale, mb.docs);
      if (squares_armed_) squares_->join();
    });
    g.key = key;
    LINAC_CHECK(model_.buffers_epoch() == key.epoch, "TrainStep: a buffer moved while the step was captured");
  }
  g.graph.launch(ctx);
  model_.params().end_grad_pass(false);
  ++graph_replays_;
  return model_.read_loss_sum();
}

double TrainStep::eager_forward_backward(const MicroBatch& mb, float grad_scale) {
  const double loss = model_.forward_backward(mb.tokens, mb.targets, grad_scale, nullptr, mb.docs);
  if (squares_armed_) squares_->join();
  return loss;
}

StepStats TrainStep::run(int64_t step, const std::vector<MicroBatch>& micro, int64_t target_count) {
  const Ctx& ctx = model_.env().ctx;
  ParamStore& ps = model_.params();
  StepStats st;
  st.lr = lr_at(step, tc_.steps, tc_.warmup_steps, tc_.lr, tc_.min_lr, tc_.schedule);
  {
    ProfileScope prof(ctx, "optimizer: zero gradients");
    ps.zero_grad(ctx);
  }
  const float scale = 1.f / static_cast<float>(std::max<int64_t>(1, target_count));
  double loss_sum = 0, aux_sum = 0;
  for (size_t i = 0; i < micro.size(); ++i) {
    if (reducer_) reducer_->start_micro_batch(i == 0, i + 1 == micro.size());
    squares_armed_ = squares_ && i + 1 == micro.size();
    loss_sum += forward_backward(i, micro[i], scale);
    aux_sum += model_.aux_loss_sum();
  }
  const bool squares_taken = squares_armed_;
  squares_armed_ = false;
  if (reducer_) {
    {
      ProfileScope prof(ctx, "gradient all-reduce (what the backward did not hide)");
      reducer_->finish();
    }
    loss_sum = comm_->sum(loss_sum);
    aux_sum = comm_->sum(aux_sum);
  }
  st.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, target_count));
  st.aux_loss = aux_sum / static_cast<double>(std::max<int64_t>(1, target_count));
  {
    ProfileScope prof(ctx, "optimizer: gradient norm");
    st.grad_norm = squares_taken ? std::sqrt(squares_->total()) : grad_norm(ctx, ps, comm_);
  }
  if (!std::isfinite(st.loss) || !std::isfinite(st.aux_loss) || !std::isfinite(st.grad_norm)) {
    st.skipped = true;
    return st;
  }
  double clip = 1.0;
  if (tc_.grad_clip > 0 && st.grad_norm > tc_.grad_clip) clip = tc_.grad_clip / (st.grad_norm + 1e-6);
  ProfileScope prof(ctx, "optimizer: AdamW and buffers");
  adamw_.update(ctx, st.lr, clip, ++updates_);
  if (ps.sharded()) comm_->allgather(ps.sharded_weights(), ctx.stream);
  model_.update_buffers([this, &ctx](const Tensor& t) {
    if (comm_ && comm_->world() > 1) comm_->allreduce_sum(t, ctx.stream);
  });
  return st;
}

}  // namespace linac
