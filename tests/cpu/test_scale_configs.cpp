// The 1.3B configs (Transformer++ and GLA at the GLA paper's 1.3B shape) and what `linac info`
// plans for them: activation bytes under each recompute mode, ZeRO-1's per-rank shares and the
// scratch a step holds on top (the LM head's chunk, the GPU kernels' workspace).
#include <string>

#include "config/config.h"
#include "core/gpu.h"
#include "model/model.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_scale_configs {
namespace {

const std::string kConfigs = std::string(LINAC_TEST_SOURCE_DIR) + "/configs/";

TEST(ScaleConfigs, OnePointThreeBillionParameterCounts) {
  struct Expect {
    const char* file;
    int64_t params, non_embedding;
  };
  // Transformer++: 24 x (4 d^2 attention + 3 d F SwiGLU with F = 5632 + 2 norms) + norm_f, and
  // untied 32000 x 2048 embedding and head.
  const Expect cases[] = {{"transformer_1.3b.json", 1364297728, 1233225728}, {"gla_1.3b.json", 1365551104, 1234479104}};
  for (const Expect& e : cases) {
    const Config c = load_config(kConfigs + e.file);
    EXPECT_EQ(c.model.n_layers, 24) << e.file;
    EXPECT_EQ(c.model.d_model, 2048) << e.file;
    EXPECT_EQ(c.data.seq_len, 2048) << e.file;
    Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
    EXPECT_EQ(m.n_params(), e.params) << e.file;
    EXPECT_EQ(m.n_params() - m.n_embedding_params(), e.non_embedding) << e.file;
  }
}

json info(const std::string& args, const char* device = "cpu") {
  std::string out;
  EXPECT_EQ(test::run_linac(
                "info " + kConfigs + "transformer_1.3b.json --json --set train.device=" + device + " " + args, out),
            0)
      << out;
  return json::parse(out.substr(out.find('{')));
}

TEST(ScaleConfigs, InfoPlansRecomputeAndZeroShares) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const json none = info(""), mixer = info("--set train.recompute=mixer"), block = info("--set train.recompute=block");
  const double a0 = none["bytes"]["activations"], a1 = mixer["bytes"]["activations"], a2 = block["bytes"]["activations"];
  EXPECT_LT(a1, a0);
  EXPECT_LT(a2, a1);
  EXPECT_LT(a2, a0 / 8);  // 25 f32 block inputs plus one block, against 24 blocks' worth
  EXPECT_DOUBLE_EQ(block["activation_bytes_per_token"].get<double>(), a2 / (8 * 2048));

  const json plain = info("--ranks 4"), zero = info("--ranks 4 --set train.zero=1");
  EXPECT_EQ(plain["bytes"]["optimizer"], none["bytes"]["optimizer"]);  // no ZeRO: every rank holds it all
  // The replicated part (norms, the 65.5M-parameter embedding) plus a quarter of the rest.
  const double opt = plain["bytes"]["optimizer"], opt4 = zero["bytes"]["optimizer"];
  EXPECT_GT(opt4, 0.25 * opt);
  EXPECT_LT(opt4, 0.30 * opt);
  EXPECT_EQ(zero["bytes"]["grads"], plain["bytes"]["grads"]);  // ZeRO-1 keeps whole gradients
  // On the CPU the master is the compute weight: whole on every rank.
  EXPECT_EQ(zero["bytes"]["params"], plain["bytes"]["params"]);
  // ZeRO-2: the same optimizer shares, and of the gradients the replicated part, a quarter of the
  // rest and two staging slots of the largest group (the untied 32000 x 2048 head, 4-byte elements).
  const json zero2 = info("--ranks 4 --set train.zero=2");
  EXPECT_EQ(zero2["zero"], 2);
  EXPECT_EQ(zero2["bytes"]["optimizer"], zero["bytes"]["optimizer"]);
  const double grads = plain["bytes"]["grads"], grads4 = zero2["bytes"]["grads"];
  EXPECT_NEAR(grads4 - grads * opt4 / opt, 2.0 * 32000 * 2048 * 4, 1e3);
}

TEST(ScaleConfigs, InfoPlansTheHeadChunkAndWorkspace) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  // 16384 tokens, vocabulary 32000: chunks of 256M logits are 8388 rows.
  const double logits = 8388.0 * 32000;
  auto sum = [](const json& b) {
    return b["params"].get<double>() + b["grads"].get<double>() + b["optimizer"].get<double>() +
           b["buffers"].get<double>() + b["activations"].get<double>() + b["head_scratch"].get<double>() +
           b["workspace"].get<double>();
  };
  const json cpu = info("");  // fp32 compute: f32 logits, their gradient in place; no workspace
  EXPECT_EQ(cpu["logits_dtype"], "f32");
  EXPECT_DOUBLE_EQ(cpu["bytes"]["head_scratch"].get<double>(), 4 * logits);
  EXPECT_DOUBLE_EQ(cpu["bytes"]["workspace"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(cpu["bytes"]["total"].get<double>(), sum(cpu["bytes"]));
  // On a GPU (planned, none needed) with train.logits_dtype f32: f32 logits and a bf16 gradient,
  // and LINAC_WORKSPACE_MB's workspace (the default 512 MiB; none in a build without CUDA).
  const json gpu = info("--set train.recompute=block --set train.logits_dtype=f32", "cuda");
  EXPECT_EQ(gpu["logits_dtype"], "f32");
  EXPECT_DOUBLE_EQ(gpu["bytes"]["head_scratch"].get<double>(), 6 * logits);
  EXPECT_DOUBLE_EQ(gpu["bytes"]["workspace"].get<double>(), static_cast<double>(GpuContext::default_workspace_bytes()));
  EXPECT_DOUBLE_EQ(gpu["bytes"]["total"].get<double>(), sum(gpu["bytes"]));
  // bf16 logits, the default under bf16 precision (auto) and asked for: their gradient in place,
  // 1 GiB less; on the CPU (fp32 compute) nothing changes.
  for (const char* set : {"", " --set train.logits_dtype=bf16"}) {
    const json gpu16 = info(std::string("--set train.recompute=block") + set, "cuda");
    EXPECT_EQ(gpu16["logits_dtype"], "bf16") << set;
    EXPECT_DOUBLE_EQ(gpu16["bytes"]["head_scratch"].get<double>(), 2 * logits) << set;
    EXPECT_DOUBLE_EQ(gpu16["bytes"]["total"].get<double>(), gpu["bytes"]["total"].get<double>() - 4 * logits) << set;
  }
  EXPECT_EQ(info("--set train.logits_dtype=bf16")["bytes"], cpu["bytes"]);
  EXPECT_EQ(info("--set train.logits_dtype=f32")["bytes"], cpu["bytes"]);
  // Under fp32 precision auto means f32 logits.
  EXPECT_EQ(info("--set train.precision=fp32", "cuda")["logits_dtype"], "f32");
}

// train.residual_dtype bf16 (and auto under bf16 precision): the 2 L + 1 saved residual-stream slots (each block's
// input and its attention output's sum; no recompute) in 2 bytes instead of 4 on a GPU; the CPU computes in fp32 either
// way.
TEST(ScaleConfigs, InfoPlansABf16ResidualStream) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const json f32 = info("--set train.residual_dtype=f32", "cuda"),
             bf16 = info("--set train.residual_dtype=bf16", "cuda");
  EXPECT_EQ(f32["residual_dtype"], "f32");
  EXPECT_EQ(bf16["residual_dtype"], "bf16");
  EXPECT_EQ(info("", "cuda")["residual_dtype"], "bf16");  // auto, under the default bf16 precision
  EXPECT_EQ(info("--set train.precision=fp32", "cuda")["residual_dtype"], "f32");
  const double slots = 2 * 24 + 1, tokens = 16384, d = 2048;
  EXPECT_DOUBLE_EQ(f32["bytes"]["activations"].get<double>() - bf16["bytes"]["activations"].get<double>(),
                   slots * tokens * d * 2);
  EXPECT_DOUBLE_EQ(f32["bytes"]["total"].get<double>() - bf16["bytes"]["total"].get<double>(), slots * tokens * d * 2);
  const json cpu = info("--set train.residual_dtype=bf16");
  EXPECT_EQ(cpu["residual_dtype"], "f32");
  EXPECT_EQ(cpu["bytes"], info("")["bytes"]);
}

}  // namespace
}  // namespace linac::test_scale_configs
