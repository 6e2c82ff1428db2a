// Kernel timeline of a linac run, for machines without Nsight Systems: a CUPTI activity tracer that
// CUDA loads into the process (CUDA_INJECTION64_PATH=build/liblinac_kernel_trace.so). Every kernel
// of every rank is one CSV line in $KTRACE_DIR/trace.r<rank>.<pid>.csv (the folder is made if it
// is missing):
//   start_ns,end_ns,device,stream,grid_x,name
// (CUPTI's timestamps, comparable across the processes of one host). scripts/kernel_trace.py
// cuts it into training steps and shows what ran beside each NCCL kernel. Concurrent-kernel
// records do not serialise kernels; the run is a few percent slower for the per-launch hooks.
#include <cupti.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>

namespace {

FILE* out = nullptr;
std::mutex mu;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 16 << 20;
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mu);
  CUpti_Activity* rec = nullptr;
  while (out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::fprintf(out, "%llu,%llu,%u,%u,%d,%s\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->deviceId, k->streamId, k->gridX, k->name);
  }
  std::free(buf);
}

void flush_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mu);
  if (out) std::fclose(out);
  out = nullptr;
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection(void) {
  const char* dir = std::getenv("KTRACE_DIR");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string folder = dir ? dir : ".";
  const std::string path = folder + "/trace.r" + (rank ? rank : "0") + "." + std::to_string(getpid()) + ".csv";
  std::error_code ec;  // the ranks of one host may race to make it: whoever made it, it is there
  std::filesystem::create_directories(folder, ec);
  out = std::fopen(path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return 0;
  }
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::atexit(flush_at_exit);
  return 1;
}
