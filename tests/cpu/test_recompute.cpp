// Activation recompute on the CPU: every architecture gives the same losses and the same gradient
// bytes with train.recompute none, mixer and block (float and double), keeps fewer activations,
// and `linac bench` reports a lower peak.
#include <fstream>

#include "model/model.h"
#include "model/registry.h"
#include "model_checks.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_recompute {
namespace {

// Every registered architecture at its default layer pattern (hybrids included), 3 layers at least
// so shared saved buffers are reused by more than one layer.
TEST(RecomputeCpu, SameGradientsBitForBit) {
  ASSERT_FALSE(architectures().empty());
  for (const ArchInfo& arch : architectures()) {
    ModelConfig cfg = test::tiny_config_of(arch);
    cfg.n_layers = std::max<int64_t>(3, cfg.n_layers);
    for (const char* precision : {"fp64", "fp32"}) {
      SCOPED_TRACE(arch.name + " " + precision);
      test::check_recompute_identical(cfg, Ctx{}, precision, 2, 19);
    }
  }
}

// The activation arithmetic of `linac info`: block recompute keeps each block's input (f32
// residual rows) plus one block's worth of saved state.
TEST(RecomputeCpu, BlockRecomputeKeepsBlockInputsAndOneBlock) {
  ModelConfig c = test::tiny_config_of(find_architecture("transformer", "test"));
  c.n_layers = 3;
  Model none(c, Ctx{}, {.precision = "fp32", .allocate = false}), block(c, Ctx{}, {.precision = "fp32", .allocate = false});
  block.set_recompute(Recompute::Block);
  const int64_t B = 2, T = 19, N = B * T, d = c.d_model, F = c.ffn_dim(), L = c.n_layers;
  const size_t f = sizeof(float);
  // Per block: xn1 + rstd1, attention (qkv, o, lse), R[2l+1], xn2 + rstd2, SwiGLU (h, a).
  const size_t per_block = N * (d + 1) * f + N * (4 * d + c.n_heads) * f + N * d * f + N * (d + 1) * f + N * 3 * F * f;
  const size_t kept = (L + 1) * N * d * f + N * (d + 2) * f;  // block inputs, final norm, losses
  EXPECT_EQ(none.activation_bytes(B, T), kept + L * per_block);
  EXPECT_EQ(block.activation_bytes(B, T), kept + per_block);
}

// `linac bench` reports the peak of linac's buffers: recompute lowers it (here on the CPU, where
// the buffers are host memory). It reports the precision the step ran in: a bf16 config computes
// in fp32 on the CPU.
TEST(RecomputeCpu, BenchPeakMemoryFalls) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("recompute_bench");
  json j = test::tiny_train_config(dir + "/run");
  j["model"]["n_layers"] = 4;
  j["data"]["seq_len"] = 64;
  j["train"]["global_batch_tokens"] = 256;
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << j.dump();
  double prev = 0;
  for (const char* r : {"none", "mixer", "block"}) {
    std::string out;
    ASSERT_EQ(test::run_linac("bench " + cfg + " --steps 1 --warmup 0 --json --set train.precision=bf16 " +
                                  "--set train.recompute=" + r,
                              out),
              0)
        << out;
    const json res = json::parse(out.substr(out.find('{')));
    EXPECT_EQ(res["recompute"], r);
    EXPECT_EQ(res["precision"], "fp32");
    const double peak = res["rows"][0]["peak_bytes"];
    EXPECT_GT(peak, 0) << r;
    // One timed step: its mean, median and slowest are that step.
    EXPECT_EQ(res["rows"][0]["step_ms_median"], res["rows"][0]["step_ms"]) << r;
    EXPECT_EQ(res["rows"][0]["step_ms_max"], res["rows"][0]["step_ms"]) << r;
    if (prev > 0) EXPECT_LT(peak, prev) << r;
    prev = peak;
  }
}

}  // namespace
}  // namespace linac::test_recompute
