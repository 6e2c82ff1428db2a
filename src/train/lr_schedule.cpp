#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace linac {

double lr_at(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr, double min_lr,
             const std::string& schedule) {
  if (step < warmup_steps)
    return min_lr + (lr - min_lr) * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (schedule == "constant") return lr;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double p = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  if (schedule == "linear") return lr - (lr - min_lr) * p;
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace linac
