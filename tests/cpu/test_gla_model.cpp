// Whole GLA models on the CPU: gradient check of a tiny model in double (every parameter: the
// projections, the low-rank gate, the gated per-head norm, the SwiGLU), decoding token by token
// against the full-sequence forward, option validation, and a tiny model learning a task that
// needs token mixing.
#include "config/config.h"
#include "model/model.h"
#include "model/mixers/gla.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tiny_gla(int64_t chunk = 32) {
  ModelConfig c;
  c.arch = "gla";
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 2;  // Dk = 4, Dv = 8
  c.vocab_size = 11;
  c.ffn_hidden = 24;
  c.init_std = 0.3;
  c.mixer = {{"gate_rank", 4}, {"chunk", chunk}};
  return c;
}

TEST(GlaModelCpu, WholeModelGradCheckDouble) {
  test::check_model_gradients(tiny_gla(), 2, 37, 16);  // two chunks of 32 (the second ragged), sub-chunks of 16
}

TEST(GlaModelCpu, DecodeStepsMatchFullSequence) {
  for (int64_t chunk : {16, 64}) {
    SCOPED_TRACE(chunk);
    test::check_decode_matches_forward(tiny_gla(chunk), 2, 21);
  }
}

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
  ModelConfig c = tiny_gla();
  c.mixer = {{"expand_k", 0.3}};  // d_k = 5, not a multiple of 2 heads
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);
}

// The target at position t is the token before it: only a mixer that carries information across
// positions can learn that. The loss starts at log(16) and must fall far below it.
TEST(GlaModelCpu, TinyModelLearnsPreviousToken) {
  ModelConfig cfg;
  cfg.arch = "gla";
  cfg.n_layers = 2;
  cfg.d_model = 32;
  cfg.n_heads = 2;
  cfg.vocab_size = 16;
  cfg.ffn_hidden = 64;
  cfg.mixer = {{"chunk", 16}};
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
