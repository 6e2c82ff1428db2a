// Transformer-VQ on the CPU: the shipped config's parameter count against the formula of
// docs/transformer_vq.md §6, a gradient check in double of every parameter downstream of the
// quantizer (keys take the straight-through estimator, whose gradient no finite difference of
// the forward can see, so the key rows and everything upstream of a quantizer are checked at
// the op level instead), the commitment loss and its gradient against the formula, the
// codebook's EMA update after a training step, decoding token by token against the full forward
// across blocks and into the compressive cache, and a tiny model learning.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "core/error.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"
#include "train/train_step.h"
#include "train_fixture.h"

namespace linac {
namespace {

ModelConfig tiny_vq(int64_t layers = 2) {
  ModelConfig c;
  c.arch = "transformer_vq";
  c.n_layers = layers;
  c.d_model = 12;
  c.n_heads = 1;
  c.vocab_size = 11;
  c.init_std = 0.3;
  c.embed_init_std = 1.0;
  c.final_norm = false;
  c.head_bias = true;
  c.mixer = {{"dk", 4}, {"dv", 8}, {"codebook", 5}, {"block", 4}, {"beta", 0.1}};
  return c;
}

TEST(VqConfigs, ParameterCountMatchesTheSpec) {
  // docs/transformer_vq.md §6 (Enwik8, 190M): 48 GAUs of D_m 768, D_k 128, D_v 1536; per GAU
  // W_Q, W_K, W_r (3 D_m D_k), W_V, W_G, W_O (3 D_m D_v), the pre-norm gain and u, v_r; bytes (V = 256) with an
  // untied head and its bias. The codebooks (48 x 512 x 128) are buffers, not parameters: with
  // them the model holds the paper's ~190M numbers.
  const int64_t Dm = 768, Dk = 128, Dv = 1536, V = 256;
  const int64_t gau = 3 * Dm * Dk + 3 * Dm * Dv + Dm + 2 * Dk;
  const int64_t expect = 48 * gau + 2 * V * Dm + V;
  EXPECT_EQ(expect, 184467712);
  const Config c = load_config(std::string(LINAC_TEST_SOURCE_DIR) + "/configs/transformer_vq_190m.json");
  const Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
  EXPECT_EQ(m.n_params(), expect);
}

TEST(VqModelCpu, GradCheckDownstreamOfTheQuantizerDouble) {
  const ModelConfig cfg = tiny_vq();
  Model model(cfg, Ctx{}, {.precision = "fp64"});
  model.init_params(5);
  ParamStore& ps = model.params();
  test::perturb_special_init(ps);
  const int64_t B = 2, T = 11;  // three blocks of 4 (the last ragged): the cache holds block 0 for block 2
  model.reserve(B, T);
  OwnedTensor tokens = test::random_tokens(B, T, cfg.vocab_size, 1), targets = test::random_tokens(B, T, cfg.vocab_size, 2);
  ps.zero_grad(Ctx{});
  model.forward_backward(tokens, targets, 1.f);
  auto loss = [&] { return model.forward_loss(tokens, targets) + model.aux_loss_sum(); };
  const int64_t d = 12, Dk = 4;
  for (int i = 0; i < ps.count(); ++i) {
    const std::string& name = ps.spec(i).name;
    const bool last_layer = name.rfind("layers.1.", 0) == 0, head = name.rfind("head.", 0) == 0;
    if ((!last_layer && !head) || name == "layers.1.norm1.weight") continue;  // upstream of layer 1's keys
    const std::vector<double> g = to_doubles(ps.grad(i));
    double* x = ps.master(i).data<double>();
    double worst = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      // wqkvg rows [Dk, 2 Dk) are the keys' (straight-through).
      if (name == "layers.1.gau.wqkvg" && static_cast<int64_t>(j) / d >= Dk && static_cast<int64_t>(j) / d < 2 * Dk) continue;
      // The loss is a sum over 22 targets: a step of 1e-4 keeps the differences' rounding noise
      // (~1e-10 here) under the tolerance for the smallest gradients.
      const double num = test::numeric_grad(loss, x, j, 1e-4);
      worst = std::max(worst, std::fabs(num - g[j]) / std::max(1e-5, std::fabs(num) + std::fabs(g[j])));
    }
    EXPECT_LT(worst, 1e-5) << name;
    EXPECT_GT(test::max_abs_diff(g, std::vector<double>(g.size(), 0.0)), 0.0) << name << " has no gradient";
  }
}

TEST(VqModelCpu, CommitmentLossAndEmaFollowTheFormulas) {
  ModelConfig cfg = tiny_vq(1);
  Model model(cfg, Ctx{}, {.precision = "fp64", .with_optimizer = true});
  model.init_params(3);
  const int64_t B = 2, T = 9;
  model.reserve(B, T);
  OwnedTensor tokens = test::random_tokens(B, T, cfg.vocab_size, 4), targets = test::random_tokens(B, T, cfg.vocab_size, 5);
  ParamStore& ps = model.params();
  const std::vector<double> sum0 = to_doubles(ps.buffer(0)), count0 = to_doubles(ps.buffer(1));
  model.forward_loss(tokens, targets);
  const double aux = model.aux_loss_sum();
  EXPECT_GT(aux, 0.0);
  // One applied step: c_sum <- 0.99 c_sum + 0.01 sums, c_count <- 0.99 c_count + 0.01 counts, where
  // the counts over the step's B*T keys add up to B*T.
  TrainConfig tc;
  tc.steps = 1;
  TrainStep stepper(model, tc);
  MicroBatch mb{tokens, targets};
  const StepStats st = stepper.run(0, {mb}, B * T);
  EXPECT_FALSE(st.skipped);
  EXPECT_NEAR(st.aux_loss, aux / static_cast<double>(B * T), 1e-12);
  const std::vector<double> count1 = to_doubles(ps.buffer(1)), sum1 = to_doubles(ps.buffer(0));
  double total = 0;
  for (size_t s = 0; s < count1.size(); ++s) {
    const double stat = (count1[s] - 0.99 * count0[s]) / 0.01;
    EXPECT_NEAR(stat, std::round(stat), 1e-9) << "code " << s;
    total += stat;
  }
  EXPECT_NEAR(total, static_cast<double>(B * T), 1e-9);
  EXPECT_NE(sum1, sum0);
}

TEST(VqModelCpu, DecodeStepsMatchFullSequence) {
  test::check_decode_matches_forward(tiny_vq(), 2, 14);  // blocks of 4: the cache fills from token 8
}

json tiny_vq_run() {
  json j = test::tiny_train_config("");
  j["model"] = {{"arch", "transformer_vq"}, {"n_layers", 2},   {"d_model", 32},     {"n_heads", 1},
                {"vocab_size", 300},        {"head_bias", true}, {"final_norm", false},
                {"mixer", {{"dk", 8}, {"dv", 32}, {"codebook", 16}, {"block", 8}, {"beta", 0.01}}}};
  return j;
}

// The codebook statistics are model state: a resumed run ends with the same buffers, bit for bit.
TEST(VqModelCpu, ResumeRestoresTheCodebookExactly) {
  test::check_resume_is_bit_identical(tiny_vq_run(), {"buffers"});
}

TEST(VqModelCpu, TinyModelLearnsPreviousToken) {
  ModelConfig cfg = tiny_vq();
  cfg.d_model = 32;
  cfg.vocab_size = 16;
  cfg.init_std = 0.02;  // the untied head (the GAUs draw N(0, 1/fan_in))
  cfg.mixer = {{"dk", 16}, {"dv", 64}, {"codebook", 16}, {"block", 8}};
  TrainConfig tc;
  tc.steps = 200;
  tc.lr = 1e-2;
  tc.min_lr = 1e-3;
  tc.warmup_steps = 20;
  tc.weight_decay = 0.0;
  auto task = [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) {
    return test::previous_token_task(rng, tk, tg, B, T, 16);
  };
  test::check_tiny_model_learns(cfg, tc, 16, 24, 9, task, 0.3);
}

}  // namespace
}  // namespace linac
