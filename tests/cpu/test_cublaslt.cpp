// cuBLASLt is loaded at run time, not linked (core/cublaslt.h): in a CUDA build the library loads
// without a GPU and has every function linac calls, callable with the header's types; neither this
// test program nor linac (LINAC_BIN) links it, so their start-up does not pay for it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#if LINAC_WITH_CUDA
#include "core/cublaslt.h"
#endif

namespace linac::test_cublaslt {
namespace {

TEST(CublasLt, LoadsWithEveryFunction) {
#if LINAC_WITH_CUDA
  const CublasLt& lt = cublaslt();
#define LINAC_EXPECT_LOADED(f) EXPECT_NE(lt.f, nullptr) << #f;
  LINAC_CUBLASLT_FUNCTIONS(LINAC_EXPECT_LOADED)
#undef LINAC_EXPECT_LOADED
  // The library the build found: the major version of the header compiled against.
  EXPECT_EQ(lt.cublasLtGetVersion() / 10000, size_t{CUBLAS_VER_MAJOR});
  EXPECT_EQ(&cublaslt(), &lt) << "loaded twice";
#else
  GTEST_SKIP() << "a CPU-only build has no cuBLASLt";
#endif
}

// What the dynamic loader maps at start-up for the program at `path` (ldd's listing).
std::string libraries_of(const std::string& path) {
  std::string out;
  FILE* p = popen(("ldd '" + path + "' 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  pclose(p);
  return out;
}

TEST(CublasLt, NotLinked) {
  std::vector<std::string> programs = {std::filesystem::read_symlink("/proc/self/exe").string()};
  if (const char* bin = std::getenv("LINAC_BIN"); bin && *bin) programs.push_back(bin);
  for (const std::string& program : programs) {
    SCOPED_TRACE(program);
    const std::string libs = libraries_of(program);
    ASSERT_NE(libs.find("libc.so"), std::string::npos) << "ldd listed nothing:\n" << libs;
    EXPECT_EQ(libs.find("libcublasLt"), std::string::npos) << libs;
  }
}

}  // namespace
}  // namespace linac::test_cublaslt
