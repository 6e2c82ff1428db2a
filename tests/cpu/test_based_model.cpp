// Whole Based models on the CPU: gradient check of a tiny three-kind stack in double (taylor,
// sliding_window and base_conv layers, every parameter), decoding token by token against the
// full-sequence forward with the window's ring buffer wrapping, and a tiny model learning a copy
// task that no single layer can solve.
#include "config/config.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tiny_based(int64_t d = 16, int64_t window = 3) {
  ModelConfig c;
  c.arch = "based";
  c.n_layers = 4;
  c.d_model = d;
  c.n_heads = 2;
  c.vocab_size = 11;
  c.ffn_hidden = 2 * d;
  c.init_std = 0.3;
  c.tie_embeddings = true;
  c.layers = {"base_conv", "taylor", "sliding_window", "base_conv"};
  c.mixers = {{"taylor", {{"feature_dim", 3}, {"chunk", 8}}},
              {"sliding_window", {{"window", window}}},
              {"base_conv", {{"expand", 2}, {"kernel_size", 3}}}};
  return c;
}

TEST(BasedModelCpu, WholeModelGradCheckDouble) {
  test::check_model_gradients(tiny_based(), 2, 21, 16);  // T = 21: three chunks of 8, the last ragged
  ModelConfig untied = tiny_based();
  untied.tie_embeddings = false;
  untied.layers = {"taylor", "base_conv", "sliding_window", "taylor"};
  untied.mixers["taylor"]["head_dim"] = 5;  // Dv not d / H
  untied.mixers["base_conv"]["activation"] = "none";
  test::check_model_gradients(untied, 1, 13, 8);
}

TEST(BasedModelCpu, DecodeStepsMatchFullSequence) {
  test::check_decode_matches_forward(tiny_based(), 2, 21);  // the 3-slot ring buffer wraps 6 times
  test::check_decode_matches_forward(tiny_based(16, 32), 1, 9);  // a window longer than the sequence
}

// Sequences [a_1..a_8, a_1..a_8]: each second-half target sits 7 tokens back, beyond the window
// (4 keys) and beyond any single layer's reach, so the model must learn to route it through its
// stack of convolution, linear attention and window layers.
TEST(BasedModelCpu, TinyModelLearnsCopyTask) {
  ModelConfig cfg = tiny_based(32, 4);
  cfg.vocab_size = 16;
  cfg.init_std = 0.02;
  cfg.mixers["taylor"] = {{"feature_dim", 8}, {"chunk", 8}};
  TrainConfig tc;
  tc.steps = 400;
  tc.lr = 1e-2;
  tc.min_lr = 1e-3;
  tc.warmup_steps = 20;
  tc.weight_decay = 0.0;
  auto task = [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) { return test::copy_task(rng, tk, tg, B, T, 16); };
  test::check_tiny_model_learns(cfg, tc, 16, 16, 7, task, 0.3);
}

}  // namespace
}  // namespace linac
