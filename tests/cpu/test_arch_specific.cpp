// What only one architecture has, on the CPU: GLA's and Latte's refusals of bad options, the
// lightning mixer's decay schedule, the shipped TransNormerLLM, Latte and Transformer-VQ configs' parameter counts against
// their specs, and Transformer-VQ's commitment loss and codebook EMA. The checks every
// architecture gets (gradients, decoding, learning, resume, checkpoints) run over the registry in
// test_model.cpp; Based's layer pattern is in test_based_config.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "core/error.h"
#include "model/mixers/gla.h"
#include "model/mixers/lightning.h"
#include "model/model.h"
#include "model/registry.h"
#include "model_checks.h"
#include "test_util.h"
#include "train/train_step.h"

namespace linac::test_arch_specific {
namespace {

// ---- GLA ----

TEST(GlaModelCpu, OptionsAreValidated) {
  auto parse = [](const json& o) { return GlaMixerOptions::parse(o, "model.mixer", "x.json"); };
  EXPECT_EQ(parse(json::object()).gate_clamp, -3.0);
  EXPECT_EQ(parse({{"gate_clamp", nullptr}}).gate_clamp, 0.0);
  EXPECT_EQ(parse({{"gate_clamp", 0}}).gate_clamp, 0.0);
  EXPECT_EQ(parse({{"expand_k", 1.0}, {"scale", 0.125}}).scale, 0.125);
  for (const json& bad : {json{{"gate_rnk", 16}}, json{{"gate_clamp", 1}}, json{{"chunk", 24}}, json{{"gate_rank", 0}}}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("model.mixer."), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("x.json: ", 0), 0u) << e.what();
    }
  }
  ModelConfig c = test::tiny_model(2, 16, 2, 11, 24, "gla");
  c.mixer = {{"expand_k", 0.3}};  // d_k = 5, not a multiple of 2 heads
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);
}

// ---- TransNormerLLM ----

TEST(LightningDecay, CodeScheduleMatchesTheSpecTable) {
  // Layer 0 of the released code's schedule (docs/transnormer.md §1.4): s = slope (1 + 1e-5).
  const auto s8 = lightning_decay_rates("code", 8, 0, 24);
  ASSERT_EQ(s8.size(), 8u);
  EXPECT_NEAR(s8[0], 0.5 * (1 + 1e-5), 1e-12);
  EXPECT_NEAR(s8[7], std::pow(2.0, -8) * (1 + 1e-5), 1e-12);
  const auto s20 = lightning_decay_rates("code", 20, 0, 24);
  ASSERT_EQ(s20.size(), 20u);
  const double extra[] = {0.841, 0.595, 0.420, 0.297};  // every 2nd slope of H = 32
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(s20[16 + i], extra[i] * (1 + 1e-5), 1e-3) << i;
  // The last layer barely decays; the temperature falls linearly in between.
  EXPECT_NEAR(lightning_decay_rates("code", 8, 23, 24)[0], 0.5 * 1e-5, 1e-12);
  EXPECT_NEAR(lightning_decay_rates("code", 8, 12, 25)[0], 0.5 * (0.5 + 1e-5), 1e-12);
  // The paper's eq. 10: s = 8 (h+1) / H (1 - l / L).
  EXPECT_NEAR(lightning_decay_rates("paper", 8, 6, 24)[3], 4.0 * 0.75, 1e-12);
}

// The totals of docs/transnormer.md §6.2, and the architecture's block defaults.
TEST(TransnormerConfigs, ParameterCountsMatchTheSpec) {
  struct Expect {
    const char* file;
    int64_t params;
  };
  for (const Expect& e : {Expect{"transnormer_385m.json", 384926720}, Expect{"transnormer_1b.json", 1020266496}}) {
    const Config c = load_config(std::string(LINAC_TEST_SOURCE_DIR) + "/configs/" + e.file);
    EXPECT_EQ(model_norm(c.model), "srmsnorm");
    EXPECT_EQ(model_channel_mixer(c.model), "sglu");
    EXPECT_DOUBLE_EQ(model_embed_scale(c.model), std::sqrt(static_cast<double>(c.model.d_model)));
    Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
    EXPECT_EQ(m.n_params(), e.params) << e.file;
  }
}

// ---- Latte and Latte-Macchiato ----

TEST(LatteConfigs, ParameterCountsMatchTheSpec) {
  // docs/latte.md §6: D = 768, 12 layers, 8 heads, 128 latents, GLU 3072, tied embeddings (GPT-2 vocab
  // padded to 50,264). Latte++ per layer: Wv, Wo (2 D^2) + the latent logits (2 D L) + the GLU
  // (3 D 3072) + two RMSNorm gains; Latte-Conv-SWA++ adds the local Wq, Wk (2 D^2), one local-state
  // logit per head (D H) and the depthwise conv (3 D): 140.1M and 154.3M (the paper rounds the
  // latter to 153M; its table: 140M + ~14M).
  const int64_t D = 768, L = 128, H = 8, V = 50264, layers = 12;
  const int64_t common = D * D + 3 * D * 3072 + 2 * D;  // Wo, GLU, norms
  const int64_t latte = layers * (common + D * D + 2 * D * L) + D + V * D;
  const int64_t macchiato = layers * (common + 3 * D * D + D * (2 * L + H) + 3 * D) + D + V * D;
  EXPECT_EQ(latte, 140071680);
  EXPECT_EQ(macchiato, 154328832);
  struct Expect {
    const char* file;
    int64_t params;
  };
  for (const Expect& e : {Expect{"latte_140m.json", latte}, Expect{"latte_macchiato_153m.json", macchiato}}) {
    const Config c = load_config(std::string(LINAC_TEST_SOURCE_DIR) + "/configs/" + e.file);
    Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
    EXPECT_EQ(m.n_params(), e.params) << e.file;
  }
}

TEST(LatteConfigs, BadOptionsAreUserErrors) {
  ModelConfig c = test::tiny_model(2, 12, 2, 11, 20, "latte_macchiato");
  c.tie_embeddings = true;
  c.mixer = {{"vapor", true}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // VAPOR with a window
  c.arch = "latte";
  c.mixer = {{"latents", 5}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // 5 latents over 2 heads
  c.mixer = {{"latent", 4}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // unknown key
}

// ---- Transformer-VQ ----

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

// The commitment loss and its gradient against the formula, and the codebook's EMA update after a
// training step.
TEST(VqModelCpu, CommitmentLossAndEmaFollowTheFormulas) {
  ModelConfig cfg;
  cfg.arch = "transformer_vq";
  cfg.n_layers = 1;
  cfg.d_model = 12;
  cfg.n_heads = 1;
  cfg.vocab_size = 11;
  cfg.init_std = 0.3;
  cfg.embed_init_std = 1.0;
  cfg.final_norm = false;
  cfg.head_bias = true;
  cfg.mixer = {{"dk", 4}, {"dv", 8}, {"codebook", 5}, {"block", 4}, {"beta", 0.1}};
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

}  // namespace
}  // namespace linac::test_arch_specific
