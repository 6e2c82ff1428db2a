// Whole-model tests on the CPU: gradient check of a tiny Transformer++ in double, and a
// tiny model learning a copy task.
#include <cmath>

#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"
#include "train/train_step.h"

namespace linac {
namespace {

ModelConfig tiny_config(const std::string& arch = "transformer") {
  ModelConfig c;
  c.arch = arch;
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 2;
  c.vocab_size = 11;
  c.ffn_hidden = 24;
  c.init_std = 0.3;  // large enough that every path carries a visible gradient
  return c;
}

OwnedTensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  OwnedTensor t(DType::I32, Device::CPU, {B, T});
  Rng rng{seed, 1, 0};
  for (int64_t i = 0; i < B * T; ++i) t->data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

TEST(ModelCpu, WholeModelGradCheckDouble) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config();
    cfg.tie_embeddings = tied;
    Model model(cfg, Ctx{}, "fp64", false);
    model.init_params(5);
    // Norm weights start at 1; perturb them so their gradients are not special.
    ParamStore& ps = model.params();
    for (int i = 0; i < ps.count(); ++i)
      if (ps.spec(i).init == Init::Ones) test::fill_random(ps.master(i), 100 + static_cast<uint64_t>(i), 0.5, 1.5);
    const int64_t B = 2, T = 7;
    model.reserve(B, T);
    OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
    targets->data<int32_t>()[3] = -1;  // an ignored position

    ps.zero_grad(Ctx{});
    model.forward_backward(tokens, targets, 1.f);
    auto loss = [&] { return model.forward_loss(tokens, targets); };
    for (int i = 0; i < ps.count(); ++i) {
      std::vector<double> g = to_doubles(ps.grad(i));
      EXPECT_GT(test::max_abs_diff(g, std::vector<double>(g.size(), 0.0)), 0.0) << ps.spec(i).name << " has no gradient";
      const double err = test::check_grad(loss, ps.master(i).data<double>(), g.data(), g.size(), 24, 3, 1e-5);
      EXPECT_LT(err, 1e-5) << ps.spec(i).name << (tied ? " (tied)" : "");
    }
  }
}

TEST(ModelCpu, IgnoredTargetsDoNotContribute) {
  ModelConfig cfg = tiny_config();
  Model model(cfg, Ctx{}, "fp64", false);
  model.init_params(9);
  model.reserve(1, 6);
  OwnedTensor tokens = random_tokens(1, 6, cfg.vocab_size, 3), targets = random_tokens(1, 6, cfg.vocab_size, 4);
  const double full = model.forward_loss(tokens, targets);
  targets->data<int32_t>()[2] = -1;
  const double partial = model.forward_loss(tokens, targets);
  EXPECT_LT(partial, full);
  EXPECT_GT(partial, 0.0);
}

// Sequences [a_1..a_h, a_1..a_h]: the second half is a copy of the first, which a 2-layer
// attention model learns (an induction head). Only second-half targets are scored.
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
  Model model(cfg, Ctx{}, "fp32", true);
  model.init_params(1);
  const int64_t B = 16, h = 8, T = 2 * h;
  model.reserve(B, T);
  TrainStep stepper(model, tc);
  OwnedTensor tokens(DType::I32, Device::CPU, {B, T}), targets(DType::I32, Device::CPU, {B, T});
  Rng rng{42, 7, 0};
  double first = 0, last = 0;
  for (int64_t step = 0; step < tc.steps; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      int32_t* tk = tokens->data<int32_t>() + b * T;
      int32_t* tg = targets->data<int32_t>() + b * T;
      for (int64_t t = 0; t < h; ++t) tk[t] = tk[t + h] = static_cast<int32_t>(rng.below(16));
      for (int64_t t = 0; t < T; ++t) tg[t] = (t >= h - 1 && t + 1 < T) ? tk[t + 1] : -1;
    }
    const StepStats st = stepper.run(step, {{tokens, targets}}, B * h);
    ASSERT_FALSE(st.skipped);
    if (step == 0) first = st.loss;
    last = st.loss;
  }
  EXPECT_NEAR(first, std::log(16.0), 0.5);
  EXPECT_LT(last, 0.3) << "copy-task loss after " << tc.steps << " steps";
}

}  // namespace
}  // namespace linac
