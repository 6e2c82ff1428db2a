#include "core/gpu.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"

#if LINAC_WITH_CUDA
#include "core/cublaslt.h"
#include "core/cuda_check.h"
#endif

namespace linac {

namespace {
double host_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
// Timer::laps_ms on the host: the gaps between start and the marks; forgets the marks.
std::vector<double> host_laps(double start, std::vector<double>& marks) {
  std::vector<double> laps;
  for (double t : marks) laps.push_back(t - std::exchange(start, t));
  marks.clear();
  return laps;
}
}  // namespace

bool built_with_cuda() { return LINAC_WITH_CUDA != 0; }

bool hopper_kernels_allowed(const char* env_var) {
  const char* env = std::getenv(env_var);
  const std::string choice = env ? env : "";
  if (choice.empty() || choice == "auto") return true;
  if (choice == "sm80") return false;
  throw UserError(std::string(env_var) + " must be auto or sm80, got '" + choice + "'");
}

bool dependent_launches_available() {
  const char* env = std::getenv("LINAC_DEPENDENT_LAUNCHES");
  const std::string choice = env ? env : "";
  if (choice == "off") return false;
  if (!choice.empty() && choice != "auto")
    throw UserError("LINAC_DEPENDENT_LAUNCHES must be auto or off, got '" + choice + "'");
  return gpu_compute_capability() >= 90;
}

bool dependent_launches_available(const Ctx& ctx) { return ctx.is_gpu() && dependent_launches_available(); }

#if LINAC_WITH_CUDA

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool gpu_available() { return gpu_count() > 0; }

void gpu_set_device(int index) { LINAC_CUDA_CHECK(cudaSetDevice(index)); }

void* gpu_malloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    if (err == cudaErrorMemoryAllocation) throw UserError(out_of_memory_message("GPU", bytes, total_b - free_b));
    LINAC_FAIL("cudaMalloc of " + std::to_string(bytes >> 20) + " MiB failed (" + cudaGetErrorString(err) +
               "; " + std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) + ")");
  }
  return p;
}

void gpu_free(void* p) { cudaFree(p); }

void gpu_memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_dev == Device::CUDA && src_dev == Device::CPU) kind = cudaMemcpyHostToDevice;
  if (dst_dev == Device::CPU && src_dev == Device::CUDA) kind = cudaMemcpyDeviceToHost;
  if (dst_dev == Device::CUDA && src_dev == Device::CUDA) kind = cudaMemcpyDeviceToDevice;
  // Kernels run on non-blocking streams, which the legacy stream does not wait for.
  LINAC_CUDA_CHECK(cudaDeviceSynchronize());
  LINAC_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  LINAC_CUDA_CHECK(cudaDeviceSynchronize());
}

void gpu_memset_zero(void* p, size_t bytes) {
  LINAC_CUDA_CHECK(cudaDeviceSynchronize());
  LINAC_CUDA_CHECK(cudaMemset(p, 0, bytes));
  LINAC_CUDA_CHECK(cudaDeviceSynchronize());
}

void gpu_memcpy_async(const Ctx& ctx, void* dst, const void* src, size_t bytes) {
  LINAC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(ctx.stream)));
}

void gpu_memset_zero_async(const Ctx& ctx, void* p, size_t bytes) {
  LINAC_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(ctx.stream)));
}

void ctx_synchronize(const Ctx& ctx) {
  if (ctx.is_gpu()) LINAC_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)));
}

void gpu_synchronize() { LINAC_CUDA_CHECK(cudaDeviceSynchronize()); }

GpuInfo gpu_info() {
  int dev = 0;
  LINAC_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  LINAC_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  GpuInfo info;
  info.name = p.name;
  info.sm_count = p.multiProcessorCount;
  info.total_bytes = p.totalGlobalMem;
  // Dense bf16 tensor-core peak by datasheet (SXM parts); unknown GPUs fall back to the H100 figure.
  const std::string n = p.name;
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos || n.find("H800") != std::string::npos)
    info.bf16_dense_tflops = n.find("PCIe") != std::string::npos ? 756.0 : 989.4;
  else if (n.find("A100") != std::string::npos)
    info.bf16_dense_tflops = 312.0;
  else if (n.find("B200") != std::string::npos)
    info.bf16_dense_tflops = 2250.0;
  else
    info.bf16_dense_tflops = 989.4;
  return info;
}

int gpu_compute_capability() {
  int dev = 0, major = 0, minor = 0;
  LINAC_CUDA_CHECK(cudaGetDevice(&dev));
  LINAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  LINAC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major * 10 + minor;
}

int gpu_sm_count() {
  int dev = 0, n = 0;
  LINAC_CUDA_CHECK(cudaGetDevice(&dev));
  LINAC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

size_t gpu_bytes_in_use() {
  size_t free_b = 0, total_b = 0;
  LINAC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}


GpuContext::GpuContext() {
  LINAC_CHECK(gpu_available(), "no CUDA device");
  ctx_.device = Device::CUDA;
  cudaStream_t s = nullptr;
  LINAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ctx_.stream = s;
  cublasLtHandle_t h = nullptr;
  LINAC_CUBLAS_CHECK(cublaslt().cublasLtCreate(&h));
  ctx_.blaslt = h;
  ctx_.workspace_bytes = default_workspace_bytes();
  ctx_.workspace = gpu_malloc(ctx_.workspace_bytes);
}

size_t GpuContext::default_workspace_bytes() {
  const char* env = std::getenv("LINAC_WORKSPACE_MB");
  if (env && *env) {
    char* end = nullptr;
    const long long mb = std::strtoll(env, &end, 10);
    if (*end || mb <= 0) throw UserError(std::string("LINAC_WORKSPACE_MB must be a positive integer, got '") + env + "'");
    return static_cast<size_t>(mb) << 20;
  }
  return size_t(512) << 20;
}

GpuContext::~GpuContext() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream));
  gpu_free(ctx_.workspace);
  cublaslt().cublasLtDestroy(static_cast<cublasLtHandle_t>(ctx_.blaslt));
  cudaStreamDestroy(static_cast<cudaStream_t>(ctx_.stream));
}

void GpuContext::synchronize() const {
  LINAC_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream)));
}

Timer::Timer(const Ctx& ctx) : ctx_(ctx) {
  if (ctx_.is_gpu()) {
    cudaEvent_t a, b;
    LINAC_CUDA_CHECK(cudaEventCreate(&a));
    LINAC_CUDA_CHECK(cudaEventCreate(&b));
    ev_start_ = a;
    ev_stop_ = b;
  }
}

Timer::~Timer() {
  if (ev_start_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_start_));
  if (ev_stop_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_stop_));
  for (void* e : marks_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void Timer::start() {
  if (ctx_.is_gpu())
    LINAC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev_start_), static_cast<cudaStream_t>(ctx_.stream)));
  else
    host_start_ = host_ms();
}

double Timer::stop_ms() {
  if (!ctx_.is_gpu()) return host_ms() - host_start_;
  auto b = static_cast<cudaEvent_t>(ev_stop_);
  LINAC_CUDA_CHECK(cudaEventRecord(b, static_cast<cudaStream_t>(ctx_.stream)));
  LINAC_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  LINAC_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(ev_start_), b));
  return ms;
}

void Timer::mark() {
  if (!ctx_.is_gpu()) {
    host_marks_.push_back(host_ms());
    return;
  }
  if (n_marks_ == marks_.size()) {
    cudaEvent_t e;
    LINAC_CUDA_CHECK(cudaEventCreate(&e));
    marks_.push_back(e);
  }
  LINAC_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(marks_[n_marks_++]), static_cast<cudaStream_t>(ctx_.stream)));
}

std::vector<double> Timer::laps_ms() {
  if (!ctx_.is_gpu()) return host_laps(host_start_, host_marks_);
  std::vector<double> laps;
  if (n_marks_ == 0) return laps;
  LINAC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(marks_[n_marks_ - 1])));
  auto prev = static_cast<cudaEvent_t>(ev_start_);
  for (size_t i = 0; i < n_marks_; ++i) {
    float ms = 0;
    auto e = static_cast<cudaEvent_t>(marks_[i]);
    LINAC_CUDA_CHECK(cudaEventElapsedTime(&ms, prev, e));
    laps.push_back(ms);
    prev = e;
  }
  n_marks_ = 0;
  return laps;
}

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda() { throw UserError("this linac was built without CUDA; rebuild with a CUDA toolkit"); }
}  // namespace

int gpu_count() { return 0; }
bool gpu_available() { return false; }
void gpu_set_device(int) { no_cuda(); }
void* gpu_malloc(size_t) { no_cuda(); }
void gpu_free(void*) {}
void gpu_memcpy(void*, Device, const void*, Device, size_t) { no_cuda(); }
void gpu_memset_zero(void*, size_t) { no_cuda(); }
void gpu_synchronize() {}
void gpu_memcpy_async(const Ctx&, void*, const void*, size_t) { no_cuda(); }
void gpu_memset_zero_async(const Ctx&, void*, size_t) { no_cuda(); }
void ctx_synchronize(const Ctx&) {}
GpuInfo gpu_info() { no_cuda(); }
int gpu_compute_capability() { no_cuda(); }
int gpu_sm_count() { no_cuda(); }
size_t gpu_bytes_in_use() { return 0; }
GpuContext::GpuContext() { no_cuda(); }
size_t GpuContext::default_workspace_bytes() { return 0; }
GpuContext::~GpuContext() = default;
void GpuContext::synchronize() const {}
Timer::Timer(const Ctx& ctx) : ctx_(ctx) {}
Timer::~Timer() = default;
void Timer::start() { host_start_ = host_ms(); }
double Timer::stop_ms() { return host_ms() - host_start_; }
void Timer::mark() { host_marks_.push_back(host_ms()); }
std::vector<double> Timer::laps_ms() { return host_laps(host_start_, host_marks_); }

#endif

}  // namespace linac
