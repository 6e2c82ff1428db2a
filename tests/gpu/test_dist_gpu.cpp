// Data parallelism over NCCL: 2 ranks on 2 GPUs vs 1 rank accumulating twice as many
// micro-batches (same global batch), bf16 mixed precision. Needs 2 GPUs and mpirun.
#include <cmath>
#include <fstream>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace linac::test_dist_gpu {
namespace {

TEST(DistGpu, TwoGpusMatchOneGpuWithDoubleAccumulation) {
  LINAC_SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  if (!test::have_linac_binary() || std::system("command -v mpirun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs the linac binary and mpirun";
  const std::string dir = test::fresh_dir("dp_gpu");
  json j = test::tiny_train_config(dir + "/two");
  j["model"]["d_model"] = 128;
  j["train"]["device"] = "cuda";
  j["train"]["precision"] = "bf16";
  j["train"]["micro_batch"] = 2;
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << j.dump(2);
  const std::string bin = std::getenv("LINAC_BIN");
  std::string out;
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 ";
  FILE* p = popen((env + "timeout 300 mpirun -np 2 " + bin + " train " + cfg + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("via nccl"), std::string::npos) << out;
  EXPECT_NE(out.find("in 2 files"), std::string::npos) << out;
  // One GPU, two micro-batches of 2 per step: the same windows in the same order.
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.out_dir=" + dir + "/one", out), 0) << out;
  const auto a = test::read_all_f32(test::checkpoint_at(dir + "/two", 6), "params");
  const auto b = test::read_all_f32(test::checkpoint_at(dir + "/one", 6), "params");
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-2) << "bf16 tolerance";
}

}  // namespace
}  // namespace linac::test_dist_gpu
