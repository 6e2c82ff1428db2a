// Latte and Latte-Macchiato on the CPU: the shipped configs' parameter counts against the
// totals derived in docs/latte.md §6, option errors, whole tiny models' gradient checks in
// double (VAPOR; the convolved logits, the local window and the mixture), decoding token by
// token against the full forward (across the window's ring buffer), and tiny models learning.
#include <gtest/gtest.h>

#include "config/config.h"
#include "core/error.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tiny_latte(bool macchiato) {
  ModelConfig c;
  c.arch = macchiato ? "latte_macchiato" : "latte";
  c.n_layers = 2;
  c.d_model = 12;
  c.n_heads = 2;  // Dh = 6
  c.vocab_size = 11;
  c.ffn_hidden = 20;
  c.init_std = 0.3;
  c.tie_embeddings = true;
  if (macchiato)
    c.mixer = {{"latents", 6}, {"conv", 3}, {"window", 5}, {"chunk", 4}};  // 3 latents + the local state per head
  else
    c.mixer = {{"latents", 4}, {"chunk", 4}};
  return c;
}

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
  ModelConfig c = tiny_latte(true);
  c.mixer = {{"vapor", true}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // VAPOR with a window
  c = tiny_latte(false);
  c.mixer = {{"latents", 5}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // 5 latents over 2 heads
  c.mixer = {{"latent", 4}};
  EXPECT_THROW(Model(c, Ctx{}, {.precision = "fp32"}), UserError);  // unknown key
}

TEST(LatteModelCpu, WholeModelGradCheckDouble) {
  test::check_model_gradients(tiny_latte(false), 2, 11, 16);  // T = 11: chunks of 4, the last ragged
  test::check_model_gradients(tiny_latte(true), 2, 11, 16);
  ModelConfig c = tiny_latte(false);
  c.mixer = {{"latents", 2}, {"conv", 2}, {"vapor", false}, {"chunk", 3}};  // Latte-Conv++, one latent per head
  c.tie_embeddings = false;
  test::check_model_gradients(c, 1, 7, 8);
}

TEST(LatteModelCpu, DecodeStepsMatchFullSequence) {
  test::check_decode_matches_forward(tiny_latte(false), 2, 13);
  test::check_decode_matches_forward(tiny_latte(true), 2, 13);  // past the window of 5
}

// The target everywhere is the sequence's topic token (from the upper half of the vocabulary),
// which appears at position 0 and then now and then among noise tokens: a latent that writes
// topic tokens keeps it; plain Latte (VAPOR) must learn that.
int64_t topic_task(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b) {
    const auto topic = static_cast<int32_t>(8 + rng.below(8));
    for (int64_t t = 0; t < T; ++t) {
      const bool again = t == 0 || rng.below(10) < 3;
      tokens[b * T + t] = again ? topic : static_cast<int32_t>(rng.below(8));
      targets[b * T + t] = topic;
    }
  }
  return B * T;
}

TrainConfig learning_run() {
  TrainConfig tc;
  tc.steps = 200;
  tc.lr = 1e-2;
  tc.min_lr = 1e-3;
  tc.warmup_steps = 20;
  tc.weight_decay = 0.0;
  return tc;
}

ModelConfig learner(bool macchiato) {
  ModelConfig cfg = tiny_latte(macchiato);
  cfg.d_model = 32;
  cfg.n_heads = 2;
  cfg.ffn_hidden = 64;
  cfg.vocab_size = 16;
  cfg.init_std = 0.02;
  if (macchiato)
    cfg.mixer = {{"latents", 8}, {"window", 4}};
  else
    cfg.mixer = {{"latents", 8}};
  return cfg;
}

TEST(LatteModelCpu, TinyLatteLearnsTheTopic) {
  test::check_tiny_model_learns(learner(false), learning_run(), 16, 24, 9, topic_task, 0.6);
}

// The target at position t is the token before it: the local window carries it.
TEST(LatteModelCpu, TinyMacchiatoLearnsPreviousToken) {
  auto task = [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) {
    return test::previous_token_task(rng, tk, tg, B, T, 16);
  };
  test::check_tiny_model_learns(learner(true), learning_run(), 16, 24, 9, task, 0.3);
}

}  // namespace
}  // namespace linac
