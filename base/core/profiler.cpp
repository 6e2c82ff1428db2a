#include "core/profiler.h"

#include <chrono>
#include <map>
#include <utility>

#include "core/error.h"

#if LINAC_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace linac {

Profiler::~Profiler() {
#if LINAC_WITH_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

int Profiler::mark(const Ctx& ctx) {
  const int i = used_++;
  if (ctx.is_gpu()) {
#if LINAC_WITH_CUDA
    if (i == static_cast<int>(events_.size())) {
      cudaEvent_t e;
      LINAC_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    // Unchecked: end() runs in destructors; a failed record resurfaces at the next checked call.
    cudaEventRecord(static_cast<cudaEvent_t>(events_[static_cast<size_t>(i)]), static_cast<cudaStream_t>(ctx.stream));
#endif
  } else {
    using namespace std::chrono;
    if (i == static_cast<int>(host_ms_.size())) host_ms_.push_back(0);
    host_ms_[static_cast<size_t>(i)] = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
  }
  return i;
}

void Profiler::begin(const Ctx& ctx, const char* name, Level level, double flops) {
  open_.push_back(static_cast<int>(regions_.size()));
  regions_.push_back({name, level, mark(ctx), -1, flops});
}

void Profiler::end(const Ctx& ctx) {
  if (open_.empty()) return;
  regions_[static_cast<size_t>(open_.back())].stop = mark(ctx);
  open_.pop_back();
}

std::vector<Profiler::Total> Profiler::totals() const {
  LINAC_CHECK(open_.empty(), "Profiler::totals: a region is still open");
  std::vector<Total> out;
  std::map<std::pair<Level, std::string>, size_t> index;
  const bool gpu = !events_.empty();
#if LINAC_WITH_CUDA
  if (gpu) LINAC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[static_cast<size_t>(used_ - 1)])));
#endif
  for (const Region& r : regions_) {
    double ms = 0;
    if (gpu) {
#if LINAC_WITH_CUDA
      float f = 0;
      LINAC_CUDA_CHECK(cudaEventElapsedTime(&f, static_cast<cudaEvent_t>(events_[static_cast<size_t>(r.start)]),
                                            static_cast<cudaEvent_t>(events_[static_cast<size_t>(r.stop)])));
      ms = f;
#endif
    } else {
      ms = host_ms_[static_cast<size_t>(r.stop)] - host_ms_[static_cast<size_t>(r.start)];
    }
    auto [it, fresh] = index.try_emplace({r.level, r.name}, out.size());
    if (fresh) out.push_back({r.name, r.level, 0.0, 0, 0.0});
    out[it->second].ms += ms;
    out[it->second].count += 1;
    out[it->second].flops += r.flops;
  }
  return out;
}

void Profiler::clear() {
  regions_.clear();
  open_.clear();
  used_ = 0;
}

}  // namespace linac
