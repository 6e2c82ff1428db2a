// Where a training step's time goes: named regions timed on the context's stream (CUDA events
// on the GPU, the host clock on the CPU, where every op is synchronous) and summed by name.
// Nothing is recorded unless a Profiler is attached to the Ctx (Ctx::profiler); an attached one
// costs two event records per region, so it is for `linac bench --profile`, not for training.
// Regions nest: a Phase is a part of the step (a layer's token mixer, the LM head, the
// optimizer), an Op a kernel family inside phases (GEMMs, attention); the two are reported as
// separate breakdowns of the same step. A Shape region splits an op by problem (each GEMM's
// M x N x K) and carries the floating-point operations it did, so a breakdown can print its rate.
#pragma once

#include <string>
#include <vector>

#include "core/gpu.h"

namespace linac {

class Profiler {
 public:
  enum class Level { Phase, Op, Shape };
  struct Total {
    std::string name;
    Level level;
    double ms;
    int64_t count;
    double flops;  // summed over the regions (Shape regions; 0 elsewhere)
  };

  Profiler() = default;
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Marks stay open until end(); end() closes the innermost open region.
  void begin(const Ctx& ctx, const char* name, Level level, double flops = 0);
  void end(const Ctx& ctx);
  // Waits for the recorded work and sums it by (level, name), in order of first appearance.
  std::vector<Total> totals() const;
  void clear();

 private:
  struct Region {
    std::string name;
    Level level;
    int start, stop;  // marks
    double flops;
  };
  int mark(const Ctx& ctx);
  std::vector<Region> regions_;
  std::vector<int> open_;         // indices into regions_
  std::vector<void*> events_;     // cudaEvent_t pool, reused after clear()
  std::vector<double> host_ms_;   // the CPU's marks
  int used_ = 0;
};

// RAII region; free when no profiler is attached.
class ProfileScope {
 public:
  ProfileScope(const Ctx& ctx, const char* name, Profiler::Level level = Profiler::Level::Phase, double flops = 0)
      : ctx_(ctx) {
    if (ctx_.profiler) ctx_.profiler->begin(ctx_, name, level, flops);
  }
  ~ProfileScope() {
    if (ctx_.profiler) ctx_.profiler->end(ctx_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const Ctx& ctx_;
};

}  // namespace linac
