// TransNormerLLM on the CPU: the decay schedule against the table of docs/transnormer.md §1.4,
// the shipped configs' parameter counts against the totals of docs/transnormer.md §6.2, a whole
// tiny TNL model's gradient check in double (LRPE layer, SRMSNorm, SGLU, embedding scale, every
// parameter), decoding token by token against the full forward, and a tiny model learning.
#include <cmath>

#include "config/config.h"
#include "model/mixers/tnl.h"
#include "model/model.h"
#include "model/registry.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tiny_tnl() {
  ModelConfig c;
  c.arch = "transnormer";
  c.n_layers = 2;
  c.d_model = 12;
  c.n_heads = 2;  // dh = 6; layer 0 runs the attention with Dk = 12 (LRPE)
  c.vocab_size = 11;
  c.ffn_hidden = 20;
  c.init_std = 0.3;
  c.norm_eps = 1e-6;
  c.tie_embeddings = true;
  c.mixer = {{"block", 8}};
  return c;
}

TEST(TnlDecay, CodeScheduleMatchesTheSpecTable) {
  // Layer 0 of the released code's schedule (docs/transnormer.md §1.4): s = slope (1 + 1e-5).
  const auto s8 = tnl_decay_rates("code", 8, 0, 24);
  ASSERT_EQ(s8.size(), 8u);
  EXPECT_NEAR(s8[0], 0.5 * (1 + 1e-5), 1e-12);
  EXPECT_NEAR(s8[7], std::pow(2.0, -8) * (1 + 1e-5), 1e-12);
  const auto s20 = tnl_decay_rates("code", 20, 0, 24);
  ASSERT_EQ(s20.size(), 20u);
  const double extra[] = {0.841, 0.595, 0.420, 0.297};  // every 2nd slope of H = 32
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(s20[16 + i], extra[i] * (1 + 1e-5), 1e-3) << i;
  // The last layer barely decays; the temperature falls linearly in between.
  EXPECT_NEAR(tnl_decay_rates("code", 8, 23, 24)[0], 0.5 * 1e-5, 1e-12);
  EXPECT_NEAR(tnl_decay_rates("code", 8, 12, 25)[0], 0.5 * (0.5 + 1e-5), 1e-12);
  // The paper's eq. 10: s = 8 (h+1) / H (1 - l / L).
  EXPECT_NEAR(tnl_decay_rates("paper", 8, 6, 24)[3], 4.0 * 0.75, 1e-12);
}

TEST(TnlConfigs, ParameterCountsMatchTheSpec) {
  struct Expect {
    const char* file;
    int64_t params;
  };
  for (const Expect& e : {Expect{"tnl_385m.json", 384926720}, Expect{"tnl_1b.json", 1020266496}}) {
    const Config c = load_config(std::string(LINAC_TEST_SOURCE_DIR) + "/configs/" + e.file);
    EXPECT_EQ(model_norm(c.model), "srmsnorm");
    EXPECT_EQ(model_channel_mixer(c.model), "sglu");
    EXPECT_DOUBLE_EQ(model_embed_scale(c.model), std::sqrt(static_cast<double>(c.model.d_model)));
    Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
    EXPECT_EQ(m.n_params(), e.params) << e.file;
  }
}

TEST(TnlModelCpu, WholeModelGradCheckDouble) {
  test::check_model_gradients(tiny_tnl(), 2, 21, 16);  // T = 21: three blocks of 8, the last ragged
  ModelConfig c = tiny_tnl();
  c.tie_embeddings = false;
  c.mixer = {{"block", 4}, {"lrpe", "all"}, {"decay", "paper"}};
  test::check_model_gradients(c, 1, 9, 8);
}

TEST(TnlModelCpu, DecodeStepsMatchFullSequence) {
  test::check_decode_matches_forward(tiny_tnl(), 2, 21);
  ModelConfig c = tiny_tnl();
  c.mixer = {{"lrpe", "all"}};
  test::check_decode_matches_forward(c, 1, 13);
}

// The target at position t is the token before it: the decayed linear attention (with LRPE's
// relative positions in layer 0) must carry it.
TEST(TnlModelCpu, TinyModelLearnsPreviousToken) {
  ModelConfig cfg = tiny_tnl();
  cfg.d_model = 32;
  cfg.ffn_hidden = 64;
  cfg.vocab_size = 16;
  cfg.init_std = 0.02;
  cfg.mixer = {{"block", 16}};
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
