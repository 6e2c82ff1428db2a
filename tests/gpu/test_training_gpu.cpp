// Training on the GPU: N steps + resume + N steps equals 2N steps bit for bit (bf16 mixed
// precision, every kernel deterministic).
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_training_gpu {
namespace {

TEST(TrainingGpu, ResumeIsBitIdenticalBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  json cfg = test::tiny_train_config("");
  cfg["train"]["device"] = "cuda";
  cfg["train"]["precision"] = "bf16";
  cfg["model"]["d_model"] = 128;  // head dim 64: the tensor-core attention path
  test::check_resume_is_bit_identical(cfg);
}

}  // namespace
}  // namespace linac::test_training_gpu
