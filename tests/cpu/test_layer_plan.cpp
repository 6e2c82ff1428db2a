// Per-layer stacks: resolving model.layers / model.layer_pattern / model.mixers into one mixer
// per layer, the config errors a stack can have, and hybrid models built from a stack.
#include <string>

#include "config/config.h"
#include "model/layer_plan.h"
#include "model/model.h"
#include "test_util.h"

namespace linac::test_layer_plan {
namespace {

json doc_with(const json& model) {
  json m = {{"arch", "transformer"}, {"n_layers", 5}, {"d_model", 16}, {"n_heads", 2}, {"vocab_size", 11}};
  m.update(model);
  return {{"model", m}};
}

std::vector<LayerSpec> plan_of(const json& model) {
  const Config c = Config::from_json(doc_with(model), "x.json");
  return resolve_layers(c.model, "x.json");
}

std::string error_of(const json& model) {
  try {
    Config::from_json(doc_with(model), "x.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> kinds(const std::vector<LayerSpec>& plan) {
  std::vector<std::string> k;
  for (const auto& s : plan) k.push_back(s.kind);
  return k;
}

TEST(LayerPlan, SingleMixerConfigsKeepTheirMeaning) {
  const auto plan = plan_of({{"mixer", {{"window", 8}}}});
  ASSERT_EQ(plan.size(), 5u);
  for (const auto& s : plan) {
    EXPECT_EQ(s.kind, "attention");
    EXPECT_EQ(s.path, "model.mixer");
    EXPECT_EQ(s.options, json({{"window", 8}}));
  }
  EXPECT_EQ(kinds(plan_of({{"arch", "gla"}})), std::vector<std::string>(5, "gla"));
}

TEST(LayerPlan, ExplicitListAndRepeatingPattern) {
  EXPECT_EQ(kinds(plan_of({{"layers", {"gla", "attention", "gla", "sliding_window", "gla"}}})),
            (std::vector<std::string>{"gla", "attention", "gla", "sliding_window", "gla"}));
  EXPECT_EQ(kinds(plan_of({{"layer_pattern", {"gla", "sliding_window"}}})),
            (std::vector<std::string>{"gla", "sliding_window", "gla", "sliding_window", "gla"}));
}

TEST(LayerPlan, NamedVariantsCarryTheirOwnOptions) {
  const auto plan = plan_of({{"layer_pattern", {"near", "far"}},
                             {"mixers",
                              {{"near", {{"type", "sliding_window"}, {"window", 4}}},
                               {"far", {{"type", "attention"}, {"rope_base", 500000}}}}}});
  EXPECT_EQ(plan[0].kind, "sliding_window");
  EXPECT_EQ(plan[0].options, json({{"window", 4}}));
  EXPECT_EQ(plan[0].path, "model.mixers.near");
  EXPECT_EQ(plan[1].kind, "attention");
  EXPECT_EQ(plan[1].options, json({{"rope_base", 500000}}));
}

TEST(LayerPlan, StackErrorsNameTheField) {
  struct Bad {
    json model;
    std::vector<std::string> says;
  };
  const Bad cases[] = {
      {{{"layers", {"gla", "attention"}}}, {"x.json", "model.layers", "2 entries", "n_layers is 5"}},
      {{{"layer_pattern", {"gla", "atention"}}}, {"model.layer_pattern[1]", "unknown mixer 'atention'", "attention"}},
      {{{"layers", json::array()}}, {"model.layers", "at least one"}},
      {{{"layers", {"gla", "gla", "gla", "gla", "gla"}}, {"layer_pattern", {"gla"}}}, {"not both"}},
      {{{"layer_pattern", {"sliding_window"}}, {"mixers", {{"sliding_window", {{"gate_rank", 4}}}}}},
       {"model.mixers.sliding_window", "gate_rank"}},
      {{{"layer_pattern", {"gla"}}, {"mixers", {{"sliding_window", {{"window", 4}}}}}},
       {"model.mixers.sliding_window", "no layer uses"}},
      {{{"layer_pattern", {"w"}}, {"mixers", {{"w", {{"window", 4}}}}}}, {"model.mixers.w", "\"type\""}},
      {{{"layer_pattern", {"w"}}, {"mixers", {{"w", {{"type", "windw"}}}}}}, {"model.mixers.w.type", "sliding_window"}},
      {{{"mixer", {{"window", 4}}}, {"mixers", {{"attention", {{"window", 8}}}}}},
       {"model.mixer", "model.mixers.attention", "one of them"}},
      {{{"mixer", {{"window", 4}}}, {"layer_pattern", {"gla"}}}, {"model.mixer", "no layer uses"}},
      {{{"layer_pattern", {"sliding_window"}}, {"mixers", {{"sliding_window", {{"window", 0}}}}}},
       {"model.mixers.sliding_window.window"}},
      {{{"mixers", json::array()}}, {"model.mixers", "object"}},
      // Entries past n_layers would name no layer (5 layers here).
      {{{"layer_pattern", {"gla", "gla", "gla", "gla", "gla", "attention"}}},
       {"model.layer_pattern", "6 entries", "n_layers is 5", "from [5] on"}},
      // A block named after a kind configures that kind.
      {{{"mixers", {{"attention", {{"type", "gla"}}}}}},
       {"model.mixers.attention.type", "named after the mixer kind 'attention'", "got 'gla'"}},
  };
  for (const Bad& b : cases) {
    const std::string msg = error_of(b.model);
    ASSERT_FALSE(msg.empty()) << b.model.dump();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& s : b.says) EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
  }
}

// null reads as absent: a kind's block of null is its defaults, a pattern as long as the stack is
// whole, and a block naming its own kind in "type" is allowed.
TEST(LayerPlan, NullBlocksAndWholePatternsAreAccepted) {
  EXPECT_EQ(kinds(plan_of({{"mixers", {{"attention", nullptr}}}})), std::vector<std::string>(5, "attention"));
  EXPECT_EQ(plan_of({{"mixers", {{"attention", nullptr}}}})[0].options, json::object());
  EXPECT_EQ(kinds(plan_of({{"layer_pattern", {"gla", "gla", "gla", "gla", "attention"}}})),
            (std::vector<std::string>{"gla", "gla", "gla", "gla", "attention"}));
  EXPECT_EQ(plan_of({{"mixers", {{"attention", {{"type", "attention"}, {"window", 3}}}}}})[0].options,
            json({{"window", 3}}));
}

TEST(LayerPlan, ResolvedConfigRoundTripsTheStack) {
  const json model = {{"layer_pattern", {"gla", "w"}}, {"mixers", {{"w", {{"type", "sliding_window"}, {"window", 4}}}}}};
  const Config c = Config::from_json(doc_with(model), "x.json");
  const Config back = Config::from_json(c.to_json(), "resolved");
  EXPECT_EQ(back.model.layer_pattern, c.model.layer_pattern);
  EXPECT_EQ(back.model.mixers, c.model.mixers);
  EXPECT_EQ(kinds(resolve_layers(back.model, "resolved")), kinds(resolve_layers(c.model, "x.json")));
  // Single-mixer configs write no stack keys.
  const json plain = Config::from_json(doc_with(json::object()), "x.json").to_json();
  EXPECT_FALSE(plain["model"].contains("layers") || plain["model"].contains("layer_pattern") ||
               plain["model"].contains("mixers"));
}

TEST(LayerPlan, HybridModelBuildsOneMixerPerLayer) {
  const json model = {{"layers", {"gla", "attention", "w", "gla", "attention"}},
                      {"mixers", {{"w", {{"type", "sliding_window"}, {"window", 4}}}, {"gla", {{"gate_rank", 4}}}}}};
  const Config c = Config::from_json(doc_with(model), "x.json");
  Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
  std::vector<std::string> mixer_kinds_seen;
  for (const auto& r : m.layer_table())
    if (r.name.size() > 6 && r.name.substr(r.name.size() - 6) == ".mixer") mixer_kinds_seen.push_back(r.kind);
  EXPECT_EQ(mixer_kinds_seen, (std::vector<std::string>{"gla", "attention", "sliding_window", "gla", "attention"}));
}

}  // namespace
}  // namespace linac::test_layer_plan
