// Runs a kernel template for a tensor's dtype: LINAC_CPU_DISPATCH(t.dtype, T, body) binds T to
// float or double inside body (CPU kernels are instantiated for these two only); the GPU's
// LINAC_GPU_DISPATCH (common/cuda_common.cuh) binds float or __nv_bfloat16 the same way.
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/error.h"

// Binds T to T1 for dtype D1 or to T2 for D2 inside body; any other dtype fails, naming `what`
// (the side whose kernels refuse it) and the two it takes. The CPU and GPU dispatches below are its two uses.
#define LINAC_DTYPE_SWITCH2(dtype_, T, D1, T1, D2, T2, what, ...)                                          \
  do {                                                                                                     \
    switch (dtype_) {                                                                                      \
      case ::linac::DType::D1: {                                                                           \
        using T = T1;                                                                                      \
        __VA_ARGS__;                                                                                       \
        break;                                                                                             \
      }                                                                                                    \
      case ::linac::DType::D2: {                                                                           \
        using T = T2;                                                                                      \
        __VA_ARGS__;                                                                                       \
        break;                                                                                             \
      }                                                                                                    \
      default:                                                                                             \
        LINAC_FAIL(std::string(what " kernels take ") + ::linac::dtype_name(::linac::DType::D1) + " or " + \
                   ::linac::dtype_name(::linac::DType::D2) + ", got " + ::linac::dtype_name(dtype_));      \
    }                                                                                                      \
  } while (0)

#define LINAC_CPU_DISPATCH(dtype_, T, ...) LINAC_DTYPE_SWITCH2(dtype_, T, F32, float, F64, double, "CPU", __VA_ARGS__)

// Fails with a clear message when a GPU op is asked of a CPU-only build.
#if LINAC_WITH_CUDA
#define LINAC_REQUIRE_CUDA() ((void)0)
#else
#define LINAC_REQUIRE_CUDA() throw ::linac::UserError("this linac was built without CUDA")
#endif
