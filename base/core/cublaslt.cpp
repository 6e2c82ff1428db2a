// cuBLASLt loaded at run time (cublaslt.h says why).
#if LINAC_WITH_CUDA
#include "core/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace linac {

namespace {

CublasLt load() {
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {LINAC_CUBLASLT_PATH, LINAC_CUBLASLT_SONAME}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
  }
  LINAC_CHECK(lib, "cannot load cuBLASLt: " + tried);
  CublasLt api;
#define LINAC_CUBLASLT_RESOLVE(f)                            \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f)); \
  LINAC_CHECK(api.f, "cuBLASLt (" LINAC_CUBLASLT_SONAME ") lacks " #f);
  LINAC_CUBLASLT_FUNCTIONS(LINAC_CUBLASLT_RESOLVE)
#undef LINAC_CUBLASLT_RESOLVE
  return api;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt api = load();
  return api;
}

}  // namespace linac
#endif
