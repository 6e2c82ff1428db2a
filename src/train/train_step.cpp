#include "train/train_step.h"

#include <cmath>

#include "train/lr_schedule.h"

namespace linac {

TrainStep::TrainStep(Model& model, const TrainConfig& tc) : model_(model), tc_(tc), adamw_(model.params(), tc) {}

StepStats TrainStep::run(int64_t step, const std::vector<MicroBatch>& micro, int64_t target_count) {
  const Ctx& ctx = model_.env().ctx;
  ParamStore& ps = model_.params();
  StepStats st;
  st.lr = lr_at(step, tc_.steps, tc_.warmup_steps, tc_.lr, tc_.min_lr, tc_.schedule);
  ps.zero_grad(ctx);
  const float scale = 1.f / static_cast<float>(std::max<int64_t>(1, target_count));
  double loss_sum = 0;
  for (const auto& mb : micro) loss_sum += model_.forward_backward(mb.tokens, mb.targets, scale);
  st.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, target_count));
  st.grad_norm = grad_norm(ctx, ps);
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)) {
    st.skipped = true;
    return st;
  }
  double clip = 1.0;
  if (tc_.grad_clip > 0 && st.grad_norm > tc_.grad_clip) clip = tc_.grad_clip / (st.grad_norm + 1e-6);
  adamw_.update(ctx, st.lr, clip, ++updates_);
  return st;
}

}  // namespace linac
