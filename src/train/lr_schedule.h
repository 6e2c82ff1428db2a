// Learning-rate schedule: linear warmup from min_lr to lr over warmup_steps, then cosine or
// linear decay to min_lr at the last step, or constant lr. `step` is 0-based.
#pragma once

#include <cstdint>
#include <string>

namespace linac {

double lr_at(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr, double min_lr,
             const std::string& schedule);

}  // namespace linac
