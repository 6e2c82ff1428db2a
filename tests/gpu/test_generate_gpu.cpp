// Decoding on the GPU (fp32) against the GPU's full forward for every registered architecture:
// token by token and after a one-pass prefill; the full-attention KV cache growing past its first
// 256 slots; the sliding window's ring buffer filled by a prefill longer than the window; and
// greedy `linac generate` giving the same tokens on the GPU as on the CPU.
#include <gtest/gtest.h>

#include "model/registry.h"
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace linac::test_generate_gpu {
namespace {

TEST(GenerateGpu, EveryArchitectureDecodesAsItsForward) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const ArchInfo& arch : architectures()) {
    SCOPED_TRACE(arch.name);
    const ModelConfig cfg = test::gpu_tiny_of(arch);
    test::check_model_gpu_decode(cfg, 2, 77, {0, 1, 40, 63, 64, 76}, 1e-4);
    test::check_model_gpu_decode(cfg, 2, 77, {64, 65, 70, 76}, 1e-4, 65);  // prefill 65: a chunk and one token
  }
}

TEST(GenerateGpu, FullAttentionCacheGrowsPastItsFirstSlots) {
  LINAC_SKIP_WITHOUT_GPU();
  ModelConfig cfg = test::tiny_model(2, 128, 2, 1000, 256);
  test::check_model_gpu_decode(cfg, 3, 300, {0, 100, 255, 256, 257, 299}, 1e-4);
  test::check_model_gpu_decode(cfg, 3, 300, {199, 255, 256, 299}, 1e-4, 200);
  test::check_model_gpu_decode(cfg, 3, 300, {269, 270, 299}, 1e-4, 270);  // prefill beyond the first slots
}

// Grouped-query attention: a KV cache of 2 key/value heads for 4 query heads (head dim 64).
TEST(GenerateGpu, GroupedQueryAttentionDecodesAsItsForward) {
  LINAC_SKIP_WITHOUT_GPU();
  ModelConfig cfg = test::tiny_model(2, 256, 4, 1000, 256);
  cfg.mixer = {{"kv_heads", 2}};
  test::check_model_gpu_decode(cfg, 2, 300, {0, 1, 63, 255, 256, 299}, 1e-4);
  test::check_model_gpu_decode(cfg, 2, 300, {100, 101, 299}, 1e-4, 100);
}

TEST(GenerateGpu, SlidingWindowRingBufferAfterALongPrefill) {
  LINAC_SKIP_WITHOUT_GPU();
  ModelConfig cfg = test::tiny_model(2, 128, 2, 1000, 256);
  cfg.layers = {"sliding_window", "attention"};
  cfg.mixers = {{"sliding_window", {{"window", 16}}}};
  test::check_model_gpu_decode(cfg, 2, 90, {0, 15, 16, 17, 50, 89}, 1e-4);
  test::check_model_gpu_decode(cfg, 2, 90, {39, 40, 55, 56, 89}, 1e-4, 40);
}

TEST(GenerateGpu, GreedyTextIsTheCpuText) {
  LINAC_SKIP_WITHOUT_GPU();
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("gen_gpu_ckpt");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 3;
  j["model"]["d_model"] = 128;  // head dim 64: the GPU attention kernels take 64..128
  ASSERT_EQ(run_training(Config::from_json(j, "tiny"), ""), 0);
  const std::string args = "generate --checkpoint " + test::latest_checkpoint_path(dir) +
                           " --prompt 'the cat' --temperature 0 --max-new-tokens 16 --json --device ";
  std::string cpu, gpu;
  ASSERT_EQ(test::run_linac(args + "cpu", cpu), 0) << cpu;
  ASSERT_EQ(test::run_linac(args + "gpu", gpu), 0) << gpu;
  const json a = json::parse(cpu.substr(cpu.find('{'))), b = json::parse(gpu.substr(gpu.find('{')));
  EXPECT_EQ(b["device"], "gpu");
  EXPECT_EQ(a["sequences"][0]["tokens"], b["sequences"][0]["tokens"]);
}

}  // namespace
}  // namespace linac::test_generate_gpu
