// `linac bench CONFIG --profile`: where one training step's time goes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/profiler.h"
#include "model/model.h"

namespace linac::cli {

struct StepProfile {
  int64_t steps = 0;
  double step_ms = 0;  // per step, with the profiler's events in the stream
  std::vector<Profiler::Total> totals;  // summed over the steps
};

// Runs `steps` calls of run_step with a profiler attached to the model (and detaches it).
StepProfile profile_steps(Model& model, const Ctx& ctx, int64_t steps, const std::function<void()>& run_step);

// The phase and op breakdowns of one step, and its problems (GEMM shapes) slowest first, as
// tables and as JSON.
void print_step_profile(const StepProfile& p, double unprofiled_step_ms);
nlohmann::json step_profile_json(const StepProfile& p);

}  // namespace linac::cli
