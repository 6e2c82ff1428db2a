// The environment switches of the GPU services (core/gpu.h) that can be checked without a GPU:
// LINAC_DEPENDENT_LAUNCHES=off answers without touching a device, anything but auto or off is
// refused naming the variable; a CPU context answers no without reading it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/gpu.h"
#include "test_util.h"

namespace linac::test_gpu_env {
namespace {

TEST(GpuEnv, DependentLaunchesSwitch) {
  {
    test::ScopedEnv off("LINAC_DEPENDENT_LAUNCHES", "off");
    EXPECT_FALSE(dependent_launches_available());
  }
  // A CPU context never launches dependently, whatever the GPU (and before any device is touched).
  {
    test::ScopedEnv bad_but_unread("LINAC_DEPENDENT_LAUNCHES", "yes");
    EXPECT_FALSE(dependent_launches_available(Ctx{}));
  }
  test::ScopedEnv bad("LINAC_DEPENDENT_LAUNCHES", "yes");
  try {
    dependent_launches_available();
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("LINAC_DEPENDENT_LAUNCHES must be auto or off, got 'yes'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace linac::test_gpu_env
