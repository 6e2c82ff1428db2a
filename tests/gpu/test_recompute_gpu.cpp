// Activation recompute on the GPU: with train.recompute mixer or block every architecture's
// losses and gradient bytes equal recompute none's, in bf16 mixed precision and in fp32 (the
// kernels are deterministic, so re-running a forward reproduces its saved activations exactly).
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac::test_recompute_gpu {
namespace {

TEST(RecomputeGpu, SameGradientsBitForBit) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const char* precision : {"bf16", "fp32"})
    for (const std::string& arch : test::kGpuConfigArchs) {
      SCOPED_TRACE(arch + " " + precision);
      test::check_recompute_identical(test::gpu_config_of(arch), g.ctx(), precision, 2, 77);
    }
}

}  // namespace
}  // namespace linac::test_recompute_gpu
