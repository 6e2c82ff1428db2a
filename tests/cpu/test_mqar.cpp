// MQAR: the generator's properties (docs/mqar.md), the set and loader (determinism, epochs, ranks,
// resume, padding, target counts), the config's checks, the shipped configs' state sizes,
// evaluation's accuracy, exact resume of a training run, and a tiny attention model that learns
// the task.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "data/mqar.h"
#include "model/model.h"
#include "test_util.h"
#include "train/evaluate.h"
#include "train/trainer.h"
#include "model_checks.h"
#include "train_fixture.h"

namespace linac::test_mqar {
namespace {

struct Example {
  std::vector<int32_t> tokens, targets;
};

Example make(int64_t V, int64_t L, int64_t P, uint64_t seed, uint64_t index, bool noise = true) {
  Example e{std::vector<int32_t>(static_cast<size_t>(L)), std::vector<int32_t>(static_cast<size_t>(L))};
  mqar_example(V, L, P, 0.01, noise, seed, index, e.tokens.data(), e.targets.data());
  return e;
}

// Everything docs/mqar.md ("The generator") says of one example.
void check_example(const Example& e, int64_t V, int64_t L, int64_t P, bool noise) {
  std::map<int32_t, int32_t> value_of;
  std::set<int32_t> values;
  for (int64_t i = 0; i < P; ++i) {
    const int32_t k = e.tokens[static_cast<size_t>(2 * i)], v = e.tokens[static_cast<size_t>(2 * i + 1)];
    ASSERT_GE(k, 1);
    ASSERT_LT(k, V / 2);
    ASSERT_GE(v, V / 2);
    ASSERT_LT(v, V);
    ASSERT_TRUE(value_of.emplace(k, v).second) << "key " << k << " appears twice in the context";
    ASSERT_TRUE(values.insert(v).second) << "value " << v << " appears twice";
    ASSERT_EQ(e.targets[static_cast<size_t>(2 * i)], -1);
    ASSERT_EQ(e.targets[static_cast<size_t>(2 * i + 1)], -1);
  }
  std::set<int32_t> queried;
  for (int64_t t = 2 * P; t < L; ++t) {
    const int32_t tok = e.tokens[static_cast<size_t>(t)], tgt = e.targets[static_cast<size_t>(t)];
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, V);
    if (tgt < 0) {
      ASSERT_EQ(tgt, -1);
      if (!noise) ASSERT_EQ(tok, 0) << "position " << t;
      continue;
    }
    ASSERT_EQ((t - 2 * P) % 2, 0) << "a query off its slot's first position at " << t;
    ASSERT_TRUE(value_of.count(tok)) << "labelled position " << t << " holds " << tok << ", not a key";
    ASSERT_EQ(tgt, value_of[tok]) << "the label is not the queried key's value";
    ASSERT_TRUE(queried.insert(tok).second) << "key " << tok << " queried twice";
  }
  ASSERT_EQ(static_cast<int64_t>(queried.size()), P) << "every key is queried exactly once";
}

TEST(Mqar, ExamplesFollowTheSpec) {
  for (const auto& [V, L, P] : std::vector<std::array<int64_t, 3>>{
           {8192, 64, 4}, {8192, 256, 64}, {8192, 1024, 256}, {8192, 66, 16}, {130, 128, 32}, {40, 38, 9}})
    for (uint64_t i = 0; i < 20; ++i)
      for (bool noise : {true, false}) {
        SCOPED_TRACE("V " + std::to_string(V) + " L " + std::to_string(L) + " P " + std::to_string(P));
        check_example(make(V, L, P, 7, i, noise), V, L, P, noise);
      }
}

TEST(Mqar, NoiseCoversTheVocabulary) {
  // Filler tokens are uniform over [0, V): with V = 64 and many positions every id shows up,
  // keys and values included (collisions are intended).
  std::set<int32_t> seen;
  for (uint64_t i = 0; i < 50; ++i) {
    const Example e = make(64, 62, 2, 3, i);
    for (int64_t t = 4; t < 62; ++t)
      if (e.targets[static_cast<size_t>(t)] < 0) seen.insert(e.tokens[static_cast<size_t>(t)]);
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST(Mqar, QueryGapsFollowThePowerLaw) {
  // One pair: the query slot g has Pr[g] = (g+1)^(a-1) / sum over the S slots.
  const int64_t L = 40, P = 1, S = (L - 2 * P) / 2, n = 40000;
  std::vector<double> count(static_cast<size_t>(S), 0);
  for (uint64_t i = 0; i < static_cast<uint64_t>(n); ++i) {
    const Example e = make(8192, L, P, 11, i);
    for (int64_t g = 0; g < S; ++g)
      if (e.targets[static_cast<size_t>(2 * P + 2 * g)] >= 0) ++count[static_cast<size_t>(g)];
  }
  double z = 0;
  for (int64_t g = 0; g < S; ++g) z += std::pow(g + 1.0, 0.01 - 1);
  for (int64_t g : {0, 1, 2, 5, 18}) {
    const double p = std::pow(g + 1.0, 0.01 - 1) / z, expect = p * n, sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[static_cast<size_t>(g)], expect, 5 * sigma) << "slot " << g;
  }
}

TEST(Mqar, ExamplesAreDeterministicAndSeedsSeparate) {
  const Example a = make(8192, 256, 32, 0, 5), b = make(8192, 256, 32, 0, 5);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.tokens, make(8192, 256, 32, 1, 5).tokens) << "train and test seeds must give other sequences";
  EXPECT_NE(a.tokens, make(8192, 256, 32, 0, 6).tokens);
}

TEST(Mqar, SetLaysSlicesEndToEnd) {
  const MqarSet set({{64, 4, 3}, {128, 8, 2}, {32, 2, 4}}, 8192, 9, 0.01, true);
  EXPECT_EQ(set.size(), 9u);
  EXPECT_EQ(set.max_seq_len(), 128);
  const std::vector<size_t> slice = {0, 0, 0, 1, 1, 2, 2, 2, 2};
  for (uint64_t j = 0; j < 9; ++j) {
    ASSERT_EQ(set.slice_of(j), slice[j]);
    const MqarSlice& s = set.slices()[slice[j]];
    std::vector<int32_t> tok(static_cast<size_t>(s.seq_len)), tgt(static_cast<size_t>(s.seq_len));
    set.example(j, tok.data(), tgt.data());
    EXPECT_EQ(tok, make(8192, s.seq_len, s.pairs, 9, j).tokens);
    EXPECT_EQ(std::count_if(tgt.begin(), tgt.end(), [](int32_t t) { return t >= 0; }), s.pairs);
  }
}

// Every row of a loader batch: the example behind it, right-padded.
TEST(Mqar, LoaderPadsRowsAndCountsGlobalTargets) {
  const MqarSet set({{16, 2, 7}, {32, 8, 5}}, 128, 4, 0.01, true);
  const int64_t B = 3, T = 40;
  MqarLoader loader(set, B, T, 0, 1, 21);
  std::vector<int32_t> tok(static_cast<size_t>(B * T)), tgt(static_cast<size_t>(B * T));
  std::multiset<uint64_t> epoch0;
  for (int k = 0; k < 4; ++k) {  // 12 samples: the whole epoch 0 and the first of epoch 1
    const LoaderState before = loader.state();
    const int64_t scored = loader.next(tok.data(), tgt.data());
    int64_t expect_scored = 0;
    for (int64_t b = 0; b < B; ++b) {
      uint64_t e = before.epoch, i = before.cursor + static_cast<uint64_t>(b);
      if (i >= set.size()) i -= set.size(), ++e;
      const uint64_t j = loader.sample(e, i);
      if (e == 0) epoch0.insert(j);
      const MqarSlice& s = set.slices()[set.slice_of(j)];
      expect_scored += s.pairs;
      std::vector<int32_t> et(static_cast<size_t>(s.seq_len)), eg(static_cast<size_t>(s.seq_len));
      set.example(j, et.data(), eg.data());
      for (int64_t t = 0; t < T; ++t) {
        const size_t at = static_cast<size_t>(b * T + t);
        ASSERT_EQ(tok[at], t < s.seq_len ? et[static_cast<size_t>(t)] : 0);
        ASSERT_EQ(tgt[at], t < s.seq_len ? eg[static_cast<size_t>(t)] : -1);
      }
    }
    EXPECT_EQ(scored, expect_scored);
  }
  EXPECT_EQ(epoch0.size(), set.size());
  EXPECT_EQ(std::set<uint64_t>(epoch0.begin(), epoch0.end()).size(), set.size()) << "an epoch visits every example once";
  EXPECT_EQ(loader.state().epoch, 1u);
  EXPECT_EQ(loader.state().cursor, 0u);
}

TEST(Mqar, RanksSplitTheGlobalBatchAndResumeExactly) {
  const MqarSet set({{16, 2, 11}, {32, 4, 6}}, 128, 4, 0.01, true);
  const int64_t T = 32;
  MqarLoader one(set, 4, T, 0, 1, 8);
  MqarLoader r0(set, 2, T, 0, 2, 8), r1(set, 2, T, 1, 2, 8);
  std::vector<int32_t> tok(4 * T), tgt(4 * T), a(2 * T), at(2 * T), b(2 * T), bt(2 * T);
  for (int k = 0; k < 7; ++k) {
    const int64_t n = one.next(tok.data(), tgt.data());
    EXPECT_EQ(r0.next(a.data(), at.data()), n);
    EXPECT_EQ(r1.next(b.data(), bt.data()), n);
    a.insert(a.end(), b.begin(), b.end());
    at.insert(at.end(), bt.begin(), bt.end());
    ASSERT_EQ(a, tok) << "batch " << k;
    ASSERT_EQ(at, tgt) << "batch " << k;
    a.resize(2 * T), at.resize(2 * T);
  }
  EXPECT_EQ(r0.state(), one.state());
  // A loader started from a saved state reads exactly what the original reads next.
  MqarLoader resumed(set, 4, T, 0, 1, 999);
  resumed.set_state(one.state());
  std::vector<int32_t> tok2(4 * T), tgt2(4 * T);
  for (int k = 0; k < 5; ++k) {
    one.next(tok.data(), tgt.data());
    resumed.next(tok2.data(), tgt2.data());
    ASSERT_EQ(tok, tok2);
    ASSERT_EQ(tgt, tgt2);
  }
}

json mqar_config(const std::string& out_dir) {
  json j = json::parse(R"({
    "model": {"arch": "transformer", "n_layers": 2, "d_model": 64, "n_heads": 1, "vocab_size": 256,
              "tie_embeddings": true, "channel_mixer": "none", "layers": ["base_conv", "attention"]},
    "data": {"type": "mqar", "seq_len": 64,
             "mqar": {"train": [{"seq_len": 64, "pairs": 4, "count": 20000}],
                      "test": [{"seq_len": 64, "pairs": 4, "count": 500}]}},
    "train": {"steps": 600, "global_batch_tokens": 4096, "micro_batch": 64, "lr": 3e-3, "min_lr": 0,
              "warmup_steps": 50, "weight_decay": 0.1, "eval_every": 600, "log_every": 100,
              "checkpoint_every": 600, "keep_last": 1, "precision": "fp32", "device": "cpu"}
  })");
  j["train"]["out_dir"] = out_dir;
  return j;
}

TEST(MqarConfig, DefaultsAreTheFigure2Mixture) {
  json j = mqar_config("x");
  j["data"].erase("mqar");
  j["data"]["seq_len"] = 256;
  j["model"]["vocab_size"] = 8192;
  j["train"]["global_batch_tokens"] = 64 * 256;
  const Config c = Config::from_json(j, "cfg.json");
  ASSERT_EQ(c.data.mqar.train.size(), 5u);
  EXPECT_EQ(c.data.mqar.train[0], (MqarSlice{64, 4, 100000}));
  EXPECT_EQ(c.data.mqar.test.back(), (MqarSlice{1024, 256, 1000}));
  EXPECT_EQ(MqarSet::train(c.data.mqar, c.model.vocab_size).size(), 180000u);
  // The resolved config round-trips, slices included.
  EXPECT_EQ(Config::from_json(c.to_json(), "again").to_json(), c.to_json());
}

TEST(MqarConfig, BadSlicesAreUserErrors) {
  struct Case {
    std::string key;
    json value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"train", json::parse(R"([{"seq_len": 128, "pairs": 4, "count": 10}])"), "longer than data.seq_len"},
      {"train", json::parse(R"([{"seq_len": 64, "pairs": 17, "count": 10}])"), "at least 4 * pairs"},
      {"test", json::parse(R"([{"seq_len": 63, "pairs": 4, "count": 10}])"), "must be even"},
      {"test", json::parse(R"([{"seq_len": 512, "pairs": 4, "count": 10}])"), "vocabulary larger"},
      {"test", json::parse(R"([{"seq_len": 64, "pairs": 4}])"), "data.mqar.test[0].count"},
      {"test", json::parse(R"([{"seq_len": 64, "pairs": 4, "count": 1, "pairz": 3}])"), "pairz"},
      {"test", json::parse(R"([])"), "at least one"},
      {"test", json::parse(R"({"seq_len": 64})"), "expected an array"},
      {"test_seed", 0, "must differ from train_seed"},
  };
  for (const Case& c : cases) {
    json j = mqar_config("x");
    j["data"]["mqar"][c.key] = c.value;
    try {
      Config::from_json(j, "cfg.json");
      ADD_FAILURE() << c.key << " = " << c.value.dump() << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  }
  json j = mqar_config("x");
  j["data"]["path"] = "data/brown.h5";
  EXPECT_THROW(Config::from_json(j, "cfg.json"), UserError);
}

// evaluate_mqar against an independent count: the same model scored example by example.
TEST(MqarEval, AccuracyMatchesPerExampleArgmax) {
  const Config cfg = Config::from_json(mqar_config("x"), "cfg.json");
  Model model(cfg.model, Ctx{}, {.precision = "fp64"});
  model.init_params(3);
  const MqarSet set({{16, 2, 5}, {24, 6, 3}}, 256, 2, 0.01, true);
  model.reserve(4, 24);
  MqarResult r = evaluate_mqar(model, set, 4, 0, 1);
  ASSERT_EQ(r.scores.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    const MqarSlice& sl = set.slices()[s];
    double hits = 0, loss = 0;
    for (uint64_t j = set.slice_begin(s); j < set.slice_begin(s + 1); ++j) {
      OwnedTensor tok(DType::I32, Device::CPU, {1, sl.seq_len}), tgt(DType::I32, Device::CPU, {1, sl.seq_len});
      set.example(j, tok->data<int32_t>(), tgt->data<int32_t>());
      // Score each labelled position alone, by its argmax from the full logits of the forward.
      for (int64_t t = 0; t < sl.seq_len; ++t) {
        const int32_t y = tgt->data<int32_t>()[t];
        if (y < 0) continue;
        OwnedTensor one(DType::I32, Device::CPU, {1, sl.seq_len});
        std::fill_n(one->data<int32_t>(), sl.seq_len, -1);
        double best = -1e300;
        int32_t arg = -1;
        for (int32_t c = 0; c < 256; ++c) {  // -log p(c) for every candidate: argmax = smallest loss
          one->data<int32_t>()[t] = c;
          const double l = model.forward_loss(tok, one);
          if (-l > best) best = -l, arg = c;
        }
        hits += arg == y;
        one->data<int32_t>()[t] = y;
        loss += model.forward_loss(tok, one);
      }
    }
    EXPECT_EQ(r.scores[s].targets, sl.pairs * sl.count);
    EXPECT_EQ(r.scores[s].sequences, sl.count);
    EXPECT_EQ(r.scores[s].hits, hits) << "slice " << s;
    EXPECT_NEAR(r.scores[s].loss_sum, loss, 1e-9 * loss);
  }
  const MqarScore all = r.pooled();
  EXPECT_EQ(all.targets, 2 * 5 + 6 * 3);
  EXPECT_DOUBLE_EQ(all.accuracy(), (r.scores[0].hits + r.scores[1].hits) / 28.0);
  // Two ranks each score their share; their sum is the one-process result.
  MqarResult a = evaluate_mqar(model, set, 4, 0, 2), b = evaluate_mqar(model, set, 4, 1, 2);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(a.scores[s].sequences + b.scores[s].sequences, r.scores[s].sequences);
    EXPECT_EQ(a.scores[s].hits + b.scores[s].hits, r.scores[s].hits);
  }
}

// The state sizes `linac info` prints for the shipped MQAR configs, against the Based paper's
// formulas (docs/based.md §7.4): attention 2 d T, a window 2 d min(T, w), Taylor (d + 1) D_sym with
// D_sym = 153 at d' = 16, GLA Dk x Dv, TNL d x d, Latte L (Dh + 1), each plus the short
// convolution's 2 past inputs of its 2d channels. Every config must parse and build.
TEST(MqarConfig, ShippedConfigsAndTheirStateSizes) {
  const std::string dir = std::string(LINAC_TEST_SOURCE_DIR) + "/configs/mqar/";
  for (int64_t d : {64, 128}) {
    const int64_t conv = 2 * 2 * d;
    const std::map<std::string, int64_t> expected = {
        {"attention", 2 * d * 1024 + conv},   {"sliding_window", 2 * d * 64 + conv},
        {"based", (d + 1) * 153 + conv},      {"gla", (d / 2) * d + conv},
        {"transnormer", d * d + conv},        {"latte", 64 * (d + 1) + conv},
        // Macchiato: Latte's state, its own convolution's 2 past inputs, the 129-key window.
        {"latte_macchiato", 64 * (d + 1) + 2 * d + 2 * 129 * d + conv},
        {"transformer_vq", 64 * (d / 2 + 2 * d) + 128 * (2 * d + 1) + conv}};
    for (const auto& [name, elems] : expected) {
      const std::string path = dir + name + "_d" + std::to_string(d) + ".json";
      SCOPED_TRACE(path);
      const Config cfg = load_config(path);
      EXPECT_EQ(cfg.data.type, "mqar");
      EXPECT_EQ(cfg.model.n_layers, 2);
      EXPECT_EQ(cfg.model.vocab_size, 8192);
      Model model(cfg.model, Ctx{}, {.precision = cfg.train.precision, .allocate = false});
      EXPECT_EQ(model.state_elems(MqarSet::test(cfg.data.mqar, cfg.model.vocab_size).max_seq_len()), elems);
    }
  }
}

// The MQAR attention models have no positional encoding (attention option rope: false):
// gradients, decoding and prefill are those of the same mixer without the rotations, and the
// rotations really are gone (the loss differs from the RoPE model's with the same weights).
TEST(MqarConfig, AttentionWithoutRope) {
  ModelConfig c = test::tiny_model(2, 16, 2, 11, 24);
  c.init_std = 0.3;
  c.mixer = {{"rope", false}};
  test::check_model_gradients(c, 2, 9, 16);
  test::check_decode_matches_forward(c, 2, 9);
  ModelConfig with_rope = c;
  with_rope.mixer = json::object();
  auto loss = [](const ModelConfig& m) {
    Model model(m, Ctx{}, {.precision = "fp64"});
    model.init_params(5);
    model.reserve(2, 9);
    const OwnedTensor tok = test::random_tokens(2, 9, 11, 1), tgt = test::random_tokens(2, 9, 11, 2);
    return model.forward_loss(tok, tgt);
  };
  EXPECT_NE(loss(c), loss(with_rope));
}

TEST(MqarTraining, ResumeIsBitIdentical) {
  json j = mqar_config("");
  const json short_run = {{"steps", 6},      {"checkpoint_every", 3}, {"keep_last", 5},
                          {"eval_every", 3}, {"micro_batch", 8},      {"global_batch_tokens", 8 * 64 * 2}};
  j["train"].update(short_run);
  test::check_resume_is_bit_identical(j);
}

// The issue's bar: a tiny attention model (a short convolution, then one attention head) learns
// MQAR at (L = 64, P = 4) to more than 90% accuracy on held-out sequences.
TEST(MqarTraining, TinyAttentionModelLearnsRecall) {
  const std::string dir = test::fresh_dir("mqar_learn");
  ASSERT_EQ(run_training(Config::from_json(mqar_config(dir), "mqar"), ""), 0);
  std::ifstream metrics(std::filesystem::path(dir) / "metrics.jsonl");
  double acc = -1, first_loss = -1, time_s = -1;
  for (std::string line; std::getline(metrics, line);) {
    const json rec = json::parse(line);
    if (first_loss < 0) first_loss = rec.at("loss");
    if (rec.contains("val_accuracy")) acc = rec["val_accuracy"];
    if (rec.contains("time_s")) time_s = rec["time_s"];
  }
  EXPECT_GT(acc, 0.9) << "MQAR (64, 4) accuracy after 600 steps";
  EXPECT_GT(time_s, 0) << "metrics carry the wall-clock time";
  // The accuracy comes from the eval CLI too, on the same test slices.
  if (!test::have_linac_binary()) return;
  std::string out;
  ASSERT_EQ(test::run_linac("eval --checkpoint " + test::latest_checkpoint_path(dir) + " --json", out), 0) << out;
  const json j = json::parse(out.substr(out.find('{')));
  EXPECT_DOUBLE_EQ(j["mqar"]["accuracy"].get<double>(), acc);
  EXPECT_EQ(j["mqar"]["slices"][0]["targets"], 2000);
  EXPECT_NE(test::run_linac("eval --checkpoint " + test::latest_checkpoint_path(dir) + " --seq-len 32", out), 0);
  EXPECT_NE(out.find("--seq-len does not apply"), std::string::npos) << out;
}

}  // namespace
}  // namespace linac::test_mqar
