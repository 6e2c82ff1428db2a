// Runs a CPU reference template for a tensor's dtype: LINAC_CPU_DISPATCH(t.dtype, T, body)
// binds T to float or double inside body. CPU kernels are instantiated for these two only.
#pragma once

#include "core/error.h"

#define LINAC_CPU_DISPATCH(dtype_, T, ...)                                           \
  do {                                                                               \
    switch (dtype_) {                                                                \
      case ::linac::DType::F32: {                                                    \
        using T = float;                                                             \
        __VA_ARGS__;                                                                 \
        break;                                                                       \
      }                                                                              \
      case ::linac::DType::F64: {                                                    \
        using T = double;                                                            \
        __VA_ARGS__;                                                                 \
        break;                                                                       \
      }                                                                              \
      default:                                                                       \
        LINAC_FAIL(std::string("CPU kernels take f32 or f64, got ") + ::linac::dtype_name(dtype_)); \
    }                                                                                \
  } while (0)

// Fails with a clear message when a GPU op is asked of a CPU-only build.
#if LINAC_WITH_CUDA
#define LINAC_REQUIRE_CUDA() ((void)0)
#else
#define LINAC_REQUIRE_CUDA() throw ::linac::UserError("this linac was built without CUDA")
#endif
