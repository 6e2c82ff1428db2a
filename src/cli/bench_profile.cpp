#include "cli/bench_profile.h"

#include <algorithm>
#include <cstdio>

namespace linac::cli {

StepProfile profile_steps(Model& model, const Ctx& ctx, int64_t steps, const std::function<void()>& run_step) {
  Profiler prof;
  model.set_profiler(&prof);
  StepProfile p;
  p.steps = steps;
  Timer timer(ctx);
  timer.start();
  for (int64_t i = 0; i < steps; ++i) run_step();
  p.step_ms = timer.stop_ms() / static_cast<double>(steps);
  model.set_profiler(nullptr);
  p.totals = prof.totals();
  return p;
}

namespace {

// Phases cover the step; what they miss is time between them (host work, launch gaps, the
// loss read back). Ops are parts of phases; what they miss is every other kernel. Shapes split
// ops by problem, slowest first.
struct ShapeRow {
  std::string name;
  double calls, ms, tflops;  // per step; achieved rate
};
struct Breakdown {
  std::vector<std::pair<std::string, double>> phases, ops;
  std::vector<ShapeRow> shapes;
  double phase_rest = 0, op_rest = 0;
};

Breakdown breakdown(const StepProfile& p) {
  Breakdown b;
  double phase_sum = 0, op_sum = 0;
  const double n = static_cast<double>(p.steps);
  for (const auto& t : p.totals) {
    const double ms = t.ms / n;
    if (t.level == Profiler::Level::Phase) {
      b.phases.emplace_back(t.name, ms);
      phase_sum += ms;
    } else if (t.level == Profiler::Level::Op) {
      b.ops.emplace_back(t.name, ms);
      op_sum += ms;
    } else {
      b.shapes.push_back({t.name, static_cast<double>(t.count) / n, ms, t.ms > 0 ? t.flops / (t.ms * 1e9) : 0.0});
    }
  }
  std::stable_sort(b.shapes.begin(), b.shapes.end(), [](const ShapeRow& x, const ShapeRow& y) { return x.ms > y.ms; });
  b.phase_rest = p.step_ms - phase_sum;
  b.op_rest = p.step_ms - op_sum;
  return b;
}

}  // namespace

void print_step_profile(const StepProfile& p, double unprofiled_step_ms) {
  const Breakdown b = breakdown(p);
  std::printf("profile: %.2f ms per step with the profiler's events (%.2f ms without), mean of %lld steps\n",
              p.step_ms, unprofiled_step_ms, static_cast<long long>(p.steps));
  auto row = [&](const std::string& name, double ms) {
    std::printf("  %-58s %10.3f %7.1f%%\n", name.c_str(), ms, 100.0 * ms / p.step_ms);
  };
  std::printf("  %-58s %10s %8s\n", "phase", "ms/step", "share");
  for (const auto& [name, ms] : b.phases) row(name, ms);
  row("between phases (host work, launch gaps, loss read-back)", b.phase_rest);
  std::printf("  %-58s %10s %8s\n", "op (inside the phases)", "ms/step", "share");
  for (const auto& [name, ms] : b.ops) row(name, ms);
  row("every other kernel and gap", b.op_rest);
  if (b.shapes.empty()) return;
  std::printf("  %-58s %10s %8s %9s\n", "problem (inside the ops)", "ms/step", "calls", "TFLOP/s");
  for (const auto& s : b.shapes) std::printf("  %-58s %10.3f %8.0f %9.1f\n", s.name.c_str(), s.ms, s.calls, s.tflops);
}

nlohmann::json step_profile_json(const StepProfile& p) {
  const Breakdown b = breakdown(p);
  nlohmann::json j = {{"step_ms", p.step_ms}, {"steps", p.steps}, {"phases", nlohmann::json::array()},
                      {"ops", nlohmann::json::array()}};
  for (const auto& [name, ms] : b.phases) j["phases"].push_back({{"name", name}, {"ms", ms}});
  j["phases"].push_back({{"name", "between phases"}, {"ms", b.phase_rest}});
  for (const auto& [name, ms] : b.ops) j["ops"].push_back({{"name", name}, {"ms", ms}});
  j["ops"].push_back({{"name", "other"}, {"ms", b.op_rest}});
  j["problems"] = nlohmann::json::array();
  for (const auto& s : b.shapes)
    j["problems"].push_back({{"name", s.name}, {"ms", s.ms}, {"calls", s.calls}, {"tflops", s.tflops}});
  return j;
}

}  // namespace linac::cli
