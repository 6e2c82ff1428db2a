// Whole-model tests on the CPU, one parameterised suite over the architecture registry
// (model/registry.h): every check runs as ModelCpu.<check>/<arch>, so an architecture gets them
// all by being registered.
//   GradCheckDouble                every parameter's gradient against central differences (double)
//   IgnoredTargetsDoNotContribute  a target of -1 leaves the loss
//   DecodeStepsMatchFullSequence   decode_step token by token, and after a prefill, against the
//                                  full-sequence forward (double)
//   TinyModelLearns                a tiny model learns a task that needs token mixing
//   ResumeIsBitIdentical           a run resumed from its mid-run checkpoint ends bit for bit like
//                                  an uninterrupted one (parameters, AdamW moments, buffers)
//   CheckpointRoundTrip            a checkpoint read back into the model its config builds gives
//                                  the same parameters, moments, buffers and loss
// What each runs on: arch_entries() below. An architecture without an entry gets tiny_config_of's
// config (tied and untied), the previous-token task and a 2-layer training run; its entry, when it
// needs one, sets its own tiny configs (ragged chunks, ring buffers, caches: the paths that are
// its own), its task and its thresholds. Checks of what only one architecture has (its options,
// schedules, shipped configs' sizes, codebook statistics): test_arch_specific.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/model.h"
#include "model/registry.h"
#include "model_checks.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_model {
namespace {

struct GradCase {
  std::string what;
  ModelConfig cfg;
  int64_t B, T;
  size_t n_probe;
};

struct DecodeCase {
  std::string what;
  ModelConfig cfg;
  int64_t B, T;
  int64_t prompt = 0;  // > 0: tokens that go through Model::prefill first
};

struct LearnCase {
  std::string task_name;
  ModelConfig cfg;
  TrainConfig tc;
  int64_t B, T;
  uint64_t data_stream;
  test::TaskBatch task;
  double max_final_loss;
};

// (cfg, B, T, n_probe): test::check_model_gradients unless the architecture needs its own.
using GradCheck = std::function<void(const ModelConfig&, int64_t, int64_t, size_t)>;

struct ArchCases {
  std::vector<GradCase> grads;
  GradCheck grad_check = test::check_model_gradients;
  std::vector<DecodeCase> decodes;
  LearnCase learn;
  json run_model;  // the "model" block of a short training run on test::tiny_dataset() (vocab 300)
};

// d_model 16 or so, init_std 0.3: large enough that every path carries a visible gradient.
ModelConfig tiny(const std::string& arch, int64_t n_layers, int64_t d, int64_t heads, int64_t ffn) {
  ModelConfig c = test::tiny_model(n_layers, d, heads, 11, ffn, arch);
  c.init_std = 0.3;
  return c;
}

// The learning runs' schedule: AdamW without weight decay, 20 warmup steps, lr down to lr / 10.
TrainConfig learning_run(int64_t steps, double lr) {
  TrainConfig tc;
  tc.steps = steps;
  tc.lr = lr;
  tc.min_lr = lr / 10;
  tc.warmup_steps = 20;
  tc.weight_decay = 0.0;
  return tc;
}

// Tasks over 16 tokens. Copy: [a_1..a_h, a_1..a_h], the second half scored. Previous token: the
// target at t is the token at t - 1; only a mixer that carries information across positions can
// learn either. The loss starts at log(16) and must fall far below it.
test::TaskBatch copy_task16() {
  return [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) { return test::copy_task(rng, tk, tg, B, T, 16); };
}
test::TaskBatch previous_token16() {
  return [](Rng& rng, int32_t* tk, int32_t* tg, int64_t B, int64_t T) {
    return test::previous_token_task(rng, tk, tg, B, T, 16);
  };
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

// What every architecture gets unless its entry says otherwise.
ArchCases default_cases(const ArchInfo& arch) {
  ArchCases c;
  const ModelConfig cfg = test::tiny_config_of(arch);
  ModelConfig tied = cfg;
  tied.tie_embeddings = true;
  c.grads = {{"untied", cfg, 2, 21, 16}, {"tied", tied, 1, 9, 8}};
  c.decodes = {{"", cfg, 2, 21}, {"prefill 13", cfg, 2, 21, 13}};
  ModelConfig learner = cfg;
  learner.d_model = 32;
  learner.ffn_hidden = 64;
  learner.vocab_size = 16;
  learner.init_std = 0.02;
  c.learn = {"previous token", learner, learning_run(200, 1e-2), 16, 24, 9, previous_token16(), 0.3};
  c.run_model = {{"arch", arch.name}, {"n_layers", cfg.n_layers}, {"d_model", 32},
                 {"n_heads", 2},      {"vocab_size", 300},          {"ffn_hidden", 64}};
  return c;
}

// ---- Architectures' own configs and tasks ----

ModelConfig tiny_gla(int64_t chunk) {
  ModelConfig c = tiny("gla", 2, 16, 2, 24);  // Dk = 4, Dv = 8
  c.mixer = {{"gate_rank", 4}, {"chunk", chunk}};
  return c;
}

ModelConfig tiny_based(int64_t d, int64_t window) {
  ModelConfig c = tiny("based", 4, d, 2, 2 * d);
  c.tie_embeddings = true;
  c.layers = {"base_conv", "taylor", "sliding_window", "base_conv"};
  c.mixers = {{"taylor", {{"feature_dim", 3}, {"chunk", 8}}},
              {"sliding_window", {{"window", window}}},
              {"base_conv", {{"expand", 2}, {"kernel_size", 3}}}};
  return c;
}

ModelConfig tiny_tnl() {
  ModelConfig c = tiny("transnormer", 2, 12, 2, 20);  // dh = 6; layer 0 runs the attention with Dk = 12 (LRPE)
  c.norm_eps = 1e-6;
  c.tie_embeddings = true;
  c.mixer = {{"block", 8}};
  return c;
}

ModelConfig tiny_latte(bool macchiato) {
  ModelConfig c = tiny(macchiato ? "latte_macchiato" : "latte", 2, 12, 2, 20);  // Dh = 6
  c.tie_embeddings = true;
  if (macchiato)
    c.mixer = {{"latents", 6}, {"conv", 3}, {"window", 5}, {"chunk", 4}};  // 3 latents + the local state per head
  else
    c.mixer = {{"latents", 4}, {"chunk", 4}};
  return c;
}

ModelConfig latte_learner(bool macchiato) {
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

ModelConfig tiny_vq() {
  ModelConfig c;
  c.arch = "transformer_vq";
  c.n_layers = 2;
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

// Transformer-VQ's keys take the straight-through estimator, whose gradient no finite difference
// of the forward can see: this checks, in double, every parameter downstream of the last
// layer's quantizer (the last layer and the head; not the keys' rows of its projection, nor its
// pre-norm), every entry, loss with the commitment term. The key rows and everything upstream of
// a quantizer are checked at the op level (test_vq_attn.cpp).
void vq_grad_check_downstream_of_the_quantizer(const ModelConfig& cfg, int64_t B, int64_t T, size_t) {
  Model model(cfg, Ctx{}, {.precision = "fp64"});
  model.init_params(5);
  ParamStore& ps = model.params();
  test::perturb_special_init(ps);
  model.reserve(B, T);
  OwnedTensor tokens = test::random_tokens(B, T, cfg.vocab_size, 1), targets = test::random_tokens(B, T, cfg.vocab_size, 2);
  ps.zero_grad(Ctx{});
  model.forward_backward(tokens, targets, 1.f);
  auto loss = [&] { return model.forward_loss(tokens, targets) + model.aux_loss_sum(); };
  const int64_t d = cfg.d_model, Dk = cfg.mixer.at("dk").get<int64_t>();
  const std::string last = "layers." + std::to_string(cfg.n_layers - 1) + ".";
  int checked = 0;
  for (int i = 0; i < ps.count(); ++i) {
    const std::string& name = ps.spec(i).name;
    const bool last_layer = name.rfind(last, 0) == 0, head = name.rfind("head.", 0) == 0;
    if ((!last_layer && !head) || name == last + "norm1.weight") continue;  // upstream of the last layer's keys
    ++checked;
    const std::vector<double> g = to_doubles(ps.grad(i));
    double* x = ps.master(i).data<double>();
    double worst = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      // wqkvg rows [Dk, 2 Dk) are the keys' (straight-through).
      if (name == last + "gau.wqkvg" && static_cast<int64_t>(j) / d >= Dk && static_cast<int64_t>(j) / d < 2 * Dk) continue;
      // The loss is a sum over 22 targets: a step of 1e-4 keeps the differences' rounding noise
      // (~1e-10 here) under the tolerance for the smallest gradients.
      const double num = test::numeric_grad(loss, x, j, 1e-4);
      worst = std::max(worst, std::fabs(num - g[j]) / std::max(1e-5, std::fabs(num) + std::fabs(g[j])));
    }
    EXPECT_LT(worst, 1e-5) << name;
    EXPECT_GT(test::max_abs_diff(g, std::vector<double>(g.size(), 0.0)), 0.0) << name << " has no gradient";
  }
  EXPECT_GT(checked, 0) << "no parameter downstream of the quantizer";
}

// One entry per architecture that needs more than the defaults: it edits default_cases' result.
const std::map<std::string, std::function<void(ArchCases&)>>& arch_entries() {
  static const std::map<std::string, std::function<void(ArchCases&)>> table = {
      {"transformer",
       [](ArchCases& c) {
         ModelConfig cfg = tiny("transformer", 2, 16, 2, 24), tied = cfg;
         tied.tie_embeddings = true;
         // Grouped-query attention: 4 query heads over 2 key/value heads, Llama 3's RoPE scaling
         // over a context of 4 (so the 7- and 21-token sequences use all three frequency bands).
         ModelConfig gqa = tiny("transformer", 2, 16, 4, 24);
         gqa.mixer = {{"kv_heads", 2},
                      {"rope_base", 500},
                      {"rope_scaling", {{"factor", 4}, {"original_max_position_embeddings", 4}}}};
         c.grads = {{"untied", cfg, 2, 7, 24}, {"tied", tied, 2, 7, 24}, {"GQA 4/2, llama3 RoPE", gqa, 2, 7, 24}};
         c.decodes = {{"", cfg, 2, 21}, {"prefill 13", cfg, 2, 21, 13}, {"GQA 4/2, prefill 9", gqa, 2, 21, 9}};
         // An induction head: the copy task.
         c.learn = {"copy", test::tiny_model(2, 32, 2, 16, 64), learning_run(300, 3e-3), 16, 16, 7, copy_task16(), 0.3};
       }},
      {"gla",
       [](ArchCases& c) {
         c.grads = {{"two chunks of 32, the second ragged; sub-chunks of 16", tiny_gla(32), 2, 37, 16}};
         c.decodes = {{"chunk 16", tiny_gla(16), 2, 21},
                      {"chunk 16, prefill a chunk and a token", tiny_gla(16), 2, 21, 17},
                      {"chunk 64", tiny_gla(64), 2, 21}};
         ModelConfig learner = test::tiny_model(2, 32, 2, 16, 64, "gla");
         learner.mixer = {{"chunk", 16}};
         c.learn = {"previous token", learner, learning_run(200, 1e-2), 16, 24, 9, previous_token16(), 0.3};
       }},
      {"based",
       [](ArchCases& c) {
         // base_conv, taylor, sliding_window layers; T = 21: three chunks of 8, the last ragged.
         ModelConfig untied = tiny_based(16, 3);
         untied.tie_embeddings = false;
         untied.layers = {"taylor", "base_conv", "sliding_window", "taylor"};
         untied.mixers["taylor"]["head_dim"] = 5;  // Dv not d / H
         untied.mixers["base_conv"]["activation"] = "none";
         c.grads = {{"tied, window 3", tiny_based(16, 3), 2, 21, 16}, {"untied, Dv 5, no activation", untied, 1, 13, 8}};
         c.decodes = {{"the 3-slot ring buffer wraps 6 times", tiny_based(16, 3), 2, 21},
                      {"prefill 10: the ring buffer wrapped by the prefill", tiny_based(16, 3), 2, 21, 10},
                      {"a window longer than the sequence", tiny_based(16, 32), 1, 9}};
         // Sequences [a_1..a_8, a_1..a_8]: each second-half target sits 7 tokens back, beyond the
         // window (4 keys) and beyond any single layer's reach, so the model must learn to route it
         // through its stack of convolution, linear attention and window layers.
         ModelConfig learner = tiny_based(32, 4);
         learner.vocab_size = 16;
         learner.init_std = 0.02;
         learner.mixers["taylor"] = {{"feature_dim", 8}, {"chunk", 8}};
         c.learn = {"copy", learner, learning_run(400, 1e-2), 16, 16, 7, copy_task16(), 0.3};
       }},
      {"transnormer",
       [](ArchCases& c) {
         // LRPE layer, SRMSNorm, SGLU, embedding scale; T = 21: three blocks of 8, the last ragged.
         ModelConfig paper = tiny_tnl(), lrpe_all = tiny_tnl();
         paper.tie_embeddings = false;
         paper.mixer = {{"block", 4}, {"lrpe", "all"}, {"decay", "paper"}};
         lrpe_all.mixer = {{"lrpe", "all"}};
         c.grads = {{"block 8", tiny_tnl(), 2, 21, 16}, {"untied, block 4, LRPE everywhere, paper decay", paper, 1, 9, 8}};
         c.decodes = {{"block 8", tiny_tnl(), 2, 21},
                      {"block 8, prefill a block and a token", tiny_tnl(), 2, 21, 9},
                      {"LRPE everywhere", lrpe_all, 1, 13}};
         // The decayed linear attention (with LRPE's relative positions in layer 0) must carry it.
         ModelConfig learner = tiny_tnl();
         learner.d_model = 32;
         learner.ffn_hidden = 64;
         learner.vocab_size = 16;
         learner.init_std = 0.02;
         learner.mixer = {{"block", 16}};
         c.learn = {"previous token", learner, learning_run(200, 1e-2), 16, 24, 9, previous_token16(), 0.3};
       }},
      {"latte",
       [](ArchCases& c) {
         ModelConfig conv = tiny_latte(false);  // Latte-Conv++, one latent per head
         conv.mixer = {{"latents", 2}, {"conv", 2}, {"vapor", false}, {"chunk", 3}};
         conv.tie_embeddings = false;
         c.grads = {{"VAPOR; T = 11: chunks of 4, the last ragged", tiny_latte(false), 2, 11, 16},
                    {"Latte-Conv++", conv, 1, 7, 8}};
         c.decodes = {{"", tiny_latte(false), 2, 13}, {"prefill 6", tiny_latte(false), 2, 13, 6}};
         c.learn = {"topic", latte_learner(false), learning_run(200, 1e-2), 16, 24, 9, topic_task, 0.6};
         c.run_model["mixer"] = {{"latents", 16}};  // not the default 128: the run stays short
       }},
      {"latte_macchiato",
       [](ArchCases& c) {
         c.grads = {{"the convolved logits, the local window and the mixture", tiny_latte(true), 2, 11, 16}};
         c.decodes = {{"past the window of 5", tiny_latte(true), 2, 13},
                      {"prefill 7, longer than the window", tiny_latte(true), 2, 13, 7}};
         // The local window carries the previous token.
         c.learn = {"previous token", latte_learner(true), learning_run(200, 1e-2), 16, 24, 9, previous_token16(), 0.3};
         c.run_model["mixer"] = {{"latents", 16}, {"window", 8}};  // not 128 latents: the run stays short
       }},
      {"transformer_vq",
       [](ArchCases& c) {
         // T = 11: three blocks of 4 (the last ragged): the cache holds block 0 for block 2.
         c.grads = {{"downstream of the quantizer", tiny_vq(), 2, 11, 0}};
         c.grad_check = vq_grad_check_downstream_of_the_quantizer;
         c.decodes = {{"blocks of 4: the cache fills from token 8", tiny_vq(), 2, 14},
                      {"prefill 9: the cache filled by the prefill", tiny_vq(), 2, 14, 9}};
         ModelConfig learner = tiny_vq();
         learner.d_model = 32;
         learner.vocab_size = 16;
         learner.init_std = 0.02;  // the untied head (the GAUs draw N(0, 1/fan_in))
         learner.mixer = {{"dk", 16}, {"dv", 64}, {"codebook", 16}, {"block", 8}};
         c.learn = {"previous token", learner, learning_run(200, 1e-2), 16, 24, 9, previous_token16(), 0.3};
         c.run_model = {{"arch", "transformer_vq"}, {"n_layers", 2},      {"d_model", 32},
                        {"n_heads", 1},             {"vocab_size", 300},  {"head_bias", true},
                        {"final_norm", false},
                        {"mixer", {{"dk", 8}, {"dv", 32}, {"codebook", 16}, {"block", 8}, {"beta", 0.01}}}};
       }},
  };
  return table;
}

ArchCases cases_of(const std::string& name) {
  const ArchInfo& arch = find_architecture(name, "test");
  ArchCases c = default_cases(arch);
  const auto& entries = arch_entries();
  if (const auto it = entries.find(name); it != entries.end()) it->second(c);
  return c;
}

std::vector<std::string> arch_names() {
  std::vector<std::string> out;
  for (const ArchInfo& a : architectures()) out.push_back(a.name);
  return out;
}

class ModelCpu : public ::testing::TestWithParam<std::string> {};

// Every entry of arch_entries() names a registered architecture (a renamed one would otherwise
// fall back to the defaults unnoticed).
TEST(ModelCpuTable, EntriesNameRegisteredArchitectures) {
  const std::vector<std::string> names = arch_names();
  for (const auto& [name, entry] : arch_entries())
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name << " is not registered";
}

TEST_P(ModelCpu, GradCheckDouble) {
  const ArchCases c = cases_of(GetParam());
  ASSERT_FALSE(c.grads.empty());
  for (const GradCase& g : c.grads) {
    SCOPED_TRACE(g.what);
    c.grad_check(g.cfg, g.B, g.T, g.n_probe);
  }
}

TEST_P(ModelCpu, IgnoredTargetsDoNotContribute) {
  const ModelConfig cfg = cases_of(GetParam()).grads.at(0).cfg;
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

TEST_P(ModelCpu, DecodeStepsMatchFullSequence) {
  const ArchCases c = cases_of(GetParam());
  ASSERT_FALSE(c.decodes.empty());
  for (const DecodeCase& d : c.decodes) {
    SCOPED_TRACE(d.what);
    test::check_decode_matches_forward(d.cfg, d.B, d.T, 1e-10, d.prompt);
  }
}

TEST_P(ModelCpu, TinyModelLearns) {
  const LearnCase l = cases_of(GetParam()).learn;
  SCOPED_TRACE(l.task_name + " task");
  test::check_tiny_model_learns(l.cfg, l.tc, l.B, l.T, l.data_stream, l.task, l.max_final_loss);
}

TEST_P(ModelCpu, ResumeIsBitIdentical) {
  json j = test::tiny_train_config("");
  j["model"] = cases_of(GetParam()).run_model;
  // Buffers (e.g. Transformer-VQ's codebook statistics) are model state: compared too.
  const Model shape(Config::from_json(j, "test").model, Ctx{}, {.precision = "fp32", .allocate = false});
  std::vector<std::string> extra;
  if (shape.params().buffer_count() > 0) extra.push_back("buffers");
  test::check_resume_is_bit_identical(j, extra);
}

TEST_P(ModelCpu, CheckpointRoundTrip) {
  const ModelConfig cfg = cases_of(GetParam()).grads.at(0).cfg;
  test::check_checkpoint_round_trip(cfg, 2, 9, test::fresh_dir("roundtrip_" + GetParam()));
}

// The parameter's name is the architecture's (gtest takes letters, digits and '_').
INSTANTIATE_TEST_SUITE_P(, ModelCpu, ::testing::ValuesIn(arch_names()), [](const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

}  // namespace
}  // namespace linac::test_model
