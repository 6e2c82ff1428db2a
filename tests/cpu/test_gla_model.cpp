// Whole GLA models on the CPU: gradient check of a tiny model in double (every parameter: the
// projections, the low-rank gate, the gated per-head norm, the SwiGLU), decoding token by token
// against the full-sequence forward, option validation, and a tiny model learning a task that
// needs token mixing.
#include <cmath>

#include "config/config.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/mixers/gla.h"
#include "test_util.h"
#include "train/train_step.h"

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

OwnedTensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  OwnedTensor t(DType::I32, Device::CPU, {B, T});
  Rng rng{seed, 1, 0};
  for (int64_t i = 0; i < B * T; ++i) t->data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

// Norm weights (1) and biases (0) start at special values; perturb them so their gradients are generic.
void perturb_special(ParamStore& ps) {
  for (int i = 0; i < ps.count(); ++i)
    if (ps.spec(i).init == Init::Ones)
      test::fill_random(ps.master(i), 100 + static_cast<uint64_t>(i), 0.5, 1.5);
    else if (ps.spec(i).init == Init::Zeros)
      test::fill_random(ps.master(i), 200 + static_cast<uint64_t>(i), -0.5, 0.5);
}

TEST(GlaModelCpu, WholeModelGradCheckDouble) {
  Model model(tiny_gla(), Ctx{}, "fp64", false);
  model.init_params(5);
  ParamStore& ps = model.params();
  perturb_special(ps);
  const int64_t B = 2, T = 37;  // two chunks of 32 (the second ragged), sub-chunks of 16
  model.reserve(B, T);
  OwnedTensor tokens = random_tokens(B, T, 11, 1), targets = random_tokens(B, T, 11, 2);
  targets->data<int32_t>()[3] = -1;
  ps.zero_grad(Ctx{});
  model.forward_backward(tokens, targets, 1.f);
  auto loss = [&] { return model.forward_loss(tokens, targets); };
  for (int i = 0; i < ps.count(); ++i) {
    std::vector<double> g = to_doubles(ps.grad(i));
    EXPECT_GT(test::max_abs_diff(g, std::vector<double>(g.size(), 0.0)), 0.0) << ps.spec(i).name << " has no gradient";
    const double err = test::check_grad(loss, ps.master(i).data<double>(), g.data(), g.size(), 16, 3, 1e-5);
    EXPECT_LT(err, 1e-5) << ps.spec(i).name;
  }
}

// Per-position negative log-likelihoods of the full-sequence forward (one scored target at a time).
std::vector<double> full_nll(Model& m, const Tensor& tokens, const Tensor& targets) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  std::vector<double> out;
  OwnedTensor one(DType::I32, Device::CPU, {B, T});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      std::fill_n(one->data<int32_t>(), B * T, -1);
      one->data<int32_t>()[b * T + t] = targets.data<int32_t>()[b * T + t];
      out.push_back(m.forward_loss(tokens, one));
    }
  return out;
}

TEST(GlaModelCpu, DecodeStepsMatchFullSequence) {
  for (int64_t chunk : {16, 64}) {
    SCOPED_TRACE(chunk);
    Model model(tiny_gla(chunk), Ctx{}, "fp64", false);
    model.init_params(8);
    perturb_special(model.params());
    const int64_t B = 2, T = 21, V = 11;
    model.reserve(B, T);
    OwnedTensor tokens = random_tokens(B, T, V, 3), targets = random_tokens(B, T, V, 4);
    const std::vector<double> ref = full_nll(model, tokens, targets);

    Model::DecodeState st = model.init_decode(B);
    OwnedTensor tok(DType::I32, Device::CPU, {B}), logits(DType::F64, Device::CPU, {B, V});
    std::vector<double> got(ref.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) tok->data<int32_t>()[b] = tokens->data<int32_t>()[b * T + t];
      model.decode_step(st, tok, logits);
      for (int64_t b = 0; b < B; ++b) {
        const double* l = logits->data<double>() + b * V;
        double mx = l[0], z = 0;
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
        for (int64_t v = 0; v < V; ++v) z += std::exp(l[v] - mx);
        got[static_cast<size_t>(b * T + t)] = mx + std::log(z) - l[targets->data<int32_t>()[b * T + t]];
      }
    }
    EXPECT_LT(test::max_abs_diff(got, ref), 1e-10);
  }
}

TEST(GlaModelCpu, AttentionHasNoDecodeStep) {
  ModelConfig c = tiny_gla();
  c.arch = "transformer";
  c.mixer = json::object();
  Model model(c, Ctx{}, "fp64", false);
  model.init_params(1);
  try {
    model.init_decode(1);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'attention'"), std::string::npos) << e.what();
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
  EXPECT_THROW(Model(c, Ctx{}, "fp32", false), UserError);
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
  Model model(cfg, Ctx{}, "fp32", true);
  model.init_params(1);
  const int64_t B = 16, T = 24;
  model.reserve(B, T);
  TrainStep stepper(model, tc);
  OwnedTensor tokens(DType::I32, Device::CPU, {B, T}), targets(DType::I32, Device::CPU, {B, T});
  Rng rng{42, 9, 0};
  double first = 0, last = 0;
  for (int64_t step = 0; step < tc.steps; ++step) {
    for (int64_t i = 0; i < B * T; ++i) tokens->data<int32_t>()[i] = static_cast<int32_t>(rng.below(16));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        targets->data<int32_t>()[b * T + t] = t >= 1 ? tokens->data<int32_t>()[b * T + t - 1] : -1;
    const StepStats st = stepper.run(step, {{tokens, targets}}, B * (T - 1));
    ASSERT_FALSE(st.skipped);
    if (step == 0) first = st.loss;
    last = st.loss;
  }
  EXPECT_NEAR(first, std::log(16.0), 0.5);
  EXPECT_LT(last, 0.3) << "previous-token loss after " << tc.steps << " steps";
}

}  // namespace
}  // namespace linac
