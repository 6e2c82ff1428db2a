// cuBLASLt, loaded from its shared library when the first GPU context is made rather than linked:
// a process linked against libcublasLt spends about 0.6 s in the library's start-up before main (an
// empty C program took 6 ms, the same program linked against it 600 ms; 2-core machine,
// 2026-12-07), which every command and test process of a CUDA build paid, GPU or not. Call the
// functions through cublaslt(), e.g. LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmul(...)).
// Include only from code compiled with CUDA.
#pragma once

#include <cublasLt.h>

// Every cuBLASLt function linac calls.
// clang-format off
#define LINAC_CUBLASLT_FUNCTIONS(X) \
  X(cublasLtCreate) \
  X(cublasLtDestroy) \
  X(cublasLtGetVersion) \
  X(cublasLtMatmul) \
  X(cublasLtMatmulAlgoCapGetAttribute) \
  X(cublasLtMatmulAlgoCheck) \
  X(cublasLtMatmulAlgoConfigGetAttribute) \
  X(cublasLtMatmulAlgoConfigSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic) \
  X(cublasLtMatmulAlgoGetIds) \
  X(cublasLtMatmulAlgoInit) \
  X(cublasLtMatmulDescCreate) \
  X(cublasLtMatmulDescDestroy) \
  X(cublasLtMatmulDescSetAttribute) \
  X(cublasLtMatmulPreferenceCreate) \
  X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate) \
  X(cublasLtMatrixLayoutDestroy) \
  X(cublasLtMatrixLayoutSetAttribute)
// clang-format on

namespace linac {

// The functions, with the header's own types.
struct CublasLt {
#define LINAC_CUBLASLT_POINTER(f) decltype(&::f) f = nullptr;
  LINAC_CUBLASLT_FUNCTIONS(LINAC_CUBLASLT_POINTER)
#undef LINAC_CUBLASLT_POINTER
};

// The library, loaded on the first call (thread-safe; never unloaded): from where the build found
// it, else by its soname on the loader's search path (an installed or moved binary). Throws
// linac::Error naming what was tried if it cannot be loaded or lacks a function.
const CublasLt& cublaslt();

}  // namespace linac
