// Host-side GPU services that compile with or without CUDA. Without CUDA (or without a
// device) gpu_available() is false and every other call throws.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace linac {

bool built_with_cuda();
bool gpu_available();
int gpu_count();
void gpu_set_device(int index);

void* gpu_malloc(size_t bytes);
void gpu_free(void* p);
// Synchronous, device-wide: waits for all streams first, returns when the copy/fill is done.
void gpu_memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
void gpu_memset_zero(void* p, size_t bytes);
void gpu_synchronize();

struct GpuInfo {
  std::string name;
  int sm_count = 0;
  size_t total_bytes = 0;
  double bf16_dense_tflops = 0;  // datasheet dense bf16 peak used for MFU
};
GpuInfo gpu_info();
int gpu_compute_capability();  // of the current device: major * 10 + minor (90 for H100/H200)
// A kernel family's switch between its Hopper kernels and the portable ones, read from env_var
// (LINAC_<FAMILY>_KERNELS): unset or "auto" -> true (the Hopper kernels may run where the build and
// the GPU have them), "sm80" -> false; anything else is a UserError naming the variable.
bool hopper_kernels_allowed(const char* env_var);
// Whether a GPU context may turn on Ctx::dependent_launches: the current device is sm_90+ and
// LINAC_DEPENDENT_LAUNCHES is unset or "auto" ("off" turns them off, for comparisons; anything
// else is a UserError naming the variable).
bool dependent_launches_available();
int gpu_sm_count();            // of the current device
size_t gpu_bytes_in_use();  // device-wide, from cudaMemGetInfo

// One execution context for kernels: device, stream, cuBLASLt handle and its workspace.
// The CPU context has only device == CPU.
class Profiler;

struct Ctx {
  Device device = Device::CPU;
  void* stream = nullptr;     // cudaStream_t
  void* blaslt = nullptr;     // cublasLtHandle_t
  void* workspace = nullptr;  // cuBLASLt workspace
  size_t workspace_bytes = 0;
  Profiler* profiler = nullptr;  // core/profiler.h; null: nothing is timed
  // Kernels launched through cuda::launch_dependent may start before the kernel ahead of them on
  // the stream ends (programmatic dependent launch, sm_90+; cuda_common.cuh). Model::decode_step
  // turns it on for its launches, where launch latency is most of a kernel's time.
  bool dependent_launches = false;
  bool is_gpu() const { return device == Device::CUDA; }
};
// Whether ctx may turn dependent launches on: a GPU context where dependent_launches_available().
bool dependent_launches_available(const Ctx& ctx);

// Stream-ordered on ctx's stream (what kernels between launches use).
void gpu_memcpy_async(const Ctx& ctx, void* dst, const void* src, size_t bytes);
void gpu_memset_zero_async(const Ctx& ctx, void* p, size_t bytes);
void ctx_synchronize(const Ctx& ctx);  // waits for ctx's stream (no-op on the CPU)

// Owns the CUDA objects behind a GPU Ctx. The workspace is scratch for cuBLASLt and for
// kernels that reduce deterministically through partial sums (attention's backward needs
// about 4 bytes per token per model dimension); LINAC_WORKSPACE_MB overrides its size.
class GpuContext {
 public:
  GpuContext();
  static size_t default_workspace_bytes();  // 512 MiB unless LINAC_WORKSPACE_MB says otherwise
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;
  const Ctx& ctx() const { return ctx_; }
  void synchronize() const;

 private:
  Ctx ctx_;
};

// Timing with device events on a context's stream (host clock for a CPU context).
class Timer {
 public:
  explicit Timer(const Ctx& ctx);
  ~Timer();
  void start();
  double stop_ms();  // waits for the work between start() and now
  // Marks the stream's current point without waiting; laps_ms() waits for the last mark and
  // returns the ms from start() to the first mark and between consecutive ones (then forgets them).
  void mark();
  std::vector<double> laps_ms();

 private:
  const Ctx& ctx_;
  void* ev_start_ = nullptr;
  void* ev_stop_ = nullptr;
  double host_start_ = 0;
  std::vector<void*> marks_;        // cudaEvent_t, created as needed and reused
  std::vector<double> host_marks_;  // CPU
  size_t n_marks_ = 0;
};

}  // namespace linac
