// Checked CUDA / cuBLAS calls: a failure throws linac::Error naming the call, file:line and the
// library's message. Include only from code compiled with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

#define LINAC_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess)                                                                \
      ::linac::fail_at(__FILE__, __LINE__, std::string(#call) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define LINAC_CUDA_LAUNCH_CHECK() LINAC_CUDA_CHECK(cudaGetLastError())

#define LINAC_CUBLAS_CHECK(call)                                                            \
  do {                                                                                      \
    int st_ = static_cast<int>(call);                                                       \
    if (st_ != 0)                                                                           \
      ::linac::fail_at(__FILE__, __LINE__, std::string(#call) + ": cublas status " + std::to_string(st_)); \
  } while (0)

namespace linac {
// The CUDA handles host code keeps untyped (Ctx::stream, events held as void*), typed again.
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace linac
