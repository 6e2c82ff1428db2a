// Constants and edge cases an independent float64 reference found: the model's scalar constants
// are applied in the model's precision (not rounded to f32 in fp64 runs); a one-layer
// TransNormerLLM's decay; `lrpe: "first"` in a hybrid stack; null for keys read only when present.
#include <cmath>

#include "config/config.h"
#include "model/layer_plan.h"
#include "model/mixers/lightning.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_model_constants {
namespace {

double fp64_loss(const ModelConfig& cfg) {
  Model m(cfg, Ctx{}, {.precision = "fp64"});
  m.init_params(7);
  test::perturb_special_init(m.params());
  m.reserve(2, 9);
  const OwnedTensor tokens = test::random_tokens(2, 9, cfg.vocab_size, 3);
  const OwnedTensor targets = test::random_tokens(2, 9, cfg.vocab_size, 4);
  return m.forward_loss(tokens, targets);
}

// Each constant once as a double that f32 cannot hold and once rounded to f32: an fp64 model
// must see the difference (it did not when the constants were stored as float).
TEST(ModelConstants, Fp64ModelsApplyConstantsInDouble) {
  const ModelConfig base = test::tiny_model(2, 16, 2, 11, 24);
  struct Knob {
    const char* name;
    double ModelConfig::*field;
    double value;
  };
  for (const Knob& k : {Knob{"embed_scale", &ModelConfig::embed_scale, 1.0 / 3.0},
                        Knob{"logit_scale", &ModelConfig::logit_scale, 1.0 / 3.0},
                        Knob{"norm_eps", &ModelConfig::norm_eps, 0.1}}) {
    ModelConfig exact = base, rounded = base;
    exact.*k.field = k.value;
    rounded.*k.field = static_cast<double>(static_cast<float>(k.value));
    ASSERT_NE(exact.*k.field, rounded.*k.field);
    EXPECT_NE(fp64_loss(exact), fp64_loss(rounded)) << k.name << " is rounded to f32 in an fp64 model";
  }
}

// l / (L - 1) is 0 / 0 with one layer: the single layer is taken as the first of a stack.
TEST(ModelConstants, OneLayerLightningDecayIsTheFirstLayers) {
  for (const char* schedule : {"code", "paper"}) {
    const std::vector<double> one = lightning_decay_rates(schedule, 6, 0, 1), two = lightning_decay_rates(schedule, 6, 0, 2);
    ASSERT_EQ(one.size(), 6u);
    for (size_t h = 0; h < one.size(); ++h) {
      EXPECT_TRUE(std::isfinite(one[h]) && one[h] > 0) << schedule << " head " << h;
      EXPECT_DOUBLE_EQ(one[h], two[h]) << schedule << " head " << h;
    }
  }
}

// lrpe "first" is the first lightning layer, whatever its index; pure stacks are unchanged.
TEST(ModelConstants, LrpeFirstIsTheFirstLightningLayer) {
  ModelConfig c = test::tiny_model(3, 32, 2, 11, 24, "transnormer");
  c.layers = {"attention", "lightning", "lightning"};
  Model hybrid(c, Ctx{}, {.precision = "fp32", .allocate = false});
  EXPECT_LT(hybrid.params().find("layers.0.tnl.theta"), 0);
  EXPECT_GE(hybrid.params().find("layers.1.tnl.theta"), 0) << "the first lightning layer has no LRPE";
  EXPECT_LT(hybrid.params().find("layers.2.tnl.theta"), 0);
  EXPECT_EQ(resolve_layers(c, "c").at(1).kind_index, 0);
  c.layers.clear();
  Model pure(c, Ctx{}, {.precision = "fp32", .allocate = false});
  EXPECT_GE(pure.params().find("layers.0.tnl.theta"), 0);
  EXPECT_LT(pure.params().find("layers.1.tnl.theta"), 0);
}

// "key": null reads as absent for every model key, also those read only when present
// (layer_pattern, layers, norm, channel_mixer): the architecture's choice, not "unknown key".
TEST(ModelConstants, NullMeansTheArchitecturesChoice) {
  json doc = {{"model", {{"arch", "transnormer"}, {"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}}},
              {"data", {{"path", "x.h5"}}}};
  const Config plain = Config::from_json(doc, "c.json");
  for (const char* key : {"layer_pattern", "layers", "norm", "channel_mixer"}) {
    json d = doc;
    apply_override(d, std::string("model.") + key + "=null");
    const Config c = Config::from_json(d, "c.json");
    EXPECT_EQ(c.to_json()["model"], plain.to_json()["model"]) << key;
  }
}

}  // namespace
}  // namespace linac::test_model_constants
