// Whole-model tests on the CPU: gradient check of a tiny Transformer++ in double, and a
// tiny model learning a copy task.
#include <cmath>

#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "transformer";
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 2;
  c.vocab_size = 11;
  c.ffn_hidden = 24;
  c.init_std = 0.3;  // large enough that every path carries a visible gradient
  return c;
}

TEST(ModelCpu, WholeModelGradCheckDouble) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModelConfig cfg = tiny_config();
    cfg.tie_embeddings = tied;
    test::check_model_gradients(cfg, 2, 7, 24);
  }
}

TEST(ModelCpu, IgnoredTargetsDoNotContribute) {
  ModelConfig cfg = tiny_config();
  Model model(cfg, Ctx{}, {.precision = "fp64"});
  model.init_params(9);
  model.reserve(1, 6);
  OwnedTensor tokens = test::random_tokens(1, 6, cfg.vocab_size, 3), targets = test::random_tokens(1, 6, cfg.vocab_size, 4);
  const double full = model.forward_loss(tokens, targets);
  targets->data<int32_t>()[2] = -1;
  const double partial = model.forward_loss(tokens, targets);
  EXPECT_LT(partial, full);
  EXPECT_GT(partial, 0.0);
}

// A 2-layer attention model learns to copy the first half of a sequence (an induction head).
TEST(ModelCpu, TinyModelLearnsCopyTask) {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.d_model = 32;
  cfg.n_heads = 2;
  cfg.vocab_size = 16;
  cfg.ffn_hidden = 64;
  TrainConfig tc;
  tc.steps = 300;
  tc.lr = 3e-3;
  tc.min_lr = 3e-4;
  tc.warmup_steps = 20;
  tc.weight_decay = 0.0;
  auto task = [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) { return test::copy_task(rng, tk, tg, B, T, 16); };
  test::check_tiny_model_learns(cfg, tc, 16, 16, 7, task, 0.3);
}

}  // namespace
}  // namespace linac
