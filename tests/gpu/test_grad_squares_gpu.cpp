// The gradient norm's sums of squares taken on a side stream during the last micro-batch's
// backward (train/grad_squares.h): every architecture's step, eager, captured and replayed,
// reports the norm of its whole gradient buffer.
#include <gtest/gtest.h>

#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac::test_grad_squares_gpu {
namespace {

TEST(GradSquaresGpu, StepNormEveryArchitecture) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const char* precision : {"bf16", "fp32"})
    for (const std::string& arch : test::kGpuConfigArchs) {
      SCOPED_TRACE(arch + " " + precision);
      // Each group's sum is rounded to f32 before the fixed-order sum over the groups.
      test::check_step_grad_norm(test::gpu_config_of(arch), g.ctx(), precision, 2, 77, 1e-6);
    }
}

}  // namespace
}  // namespace linac::test_grad_squares_gpu
