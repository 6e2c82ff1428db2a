// Training on the GPU: N steps + resume + N steps equals 2N steps bit for bit (bf16 mixed
// precision, every kernel deterministic); more GPU memory than the device has is the user's
// error, in one line.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/buffer.h"
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

TEST(TrainingGpu, OutOfGpuMemoryIsAUserErrorInOneLine) {
  LINAC_SKIP_WITHOUT_GPU();
  try {
    const Buffer b(size_t{1} << 50, Device::CUDA);  // 1 PiB
    ADD_FAILURE() << "allocated 1 PiB on the GPU";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory: 1048576.0 GiB more could not be allocated"),
              std::string::npos)
        << e.what();
  }
  if (!test::have_linac_binary()) return;
  const std::string dir = test::fresh_dir("gpu_oom");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["device"] = "cuda";
  j["model"]["d_model"] = 16384;  // 16 layers at d 16384: 52 G parameters, 0.8 TB with their AdamW state
  j["model"]["n_heads"] = 128;
  j["model"]["n_layers"] = 16;
  std::ofstream(dir + "/cfg.json") << j.dump(2);
  std::string out;
  EXPECT_EQ(test::run_linac("train " + dir + "/cfg.json", out), 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("linac train: error: out of "), std::string::npos)
      << out;  // GPU or host, whichever runs out first
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "a refused run leaves no directory";
}

}  // namespace
}  // namespace linac::test_training_gpu
