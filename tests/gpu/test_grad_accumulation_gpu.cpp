// Gradient accumulation with first writes on the GPU: after a step that left NaN in every
// gradient, each architecture's next accumulation gives the bytes of a clean one (the weight
// gradients' GEMMs run with beta = 0 and must not read C), in bf16 mixed precision and fp32.
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac::test_grad_accumulation_gpu {
namespace {

TEST(GradAccumulationGpu, AfterNanGradientsEveryArchitecture) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const char* precision : {"bf16", "fp32"})
    for (const std::string& arch : test::kGpuConfigArchs) {
      SCOPED_TRACE(arch + " " + precision);
      test::check_accumulation_after_nan(test::gpu_config_of(arch), g.ctx(), precision, 2, 77, 1e-5);
    }
}

}  // namespace
}  // namespace linac::test_grad_accumulation_gpu
