// Checkpoints written by earlier versions of linac keep loading: tests/data/compat/ holds tiny
// weights-only checkpoints (written on 2026-11-28 by linac at a003c6d, whose checkpoint code is
// unchanged since 5849d5f) with the fp32 CPU loss each gave on a fixed batch. Each must still verify, load into the model its config describes and give that loss.
// LINAC_WRITE_COMPAT=1 rewrites the files (only when the format changes on purpose: then keep the
// old files too, under new names, so that both versions stay covered).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"

namespace fs = std::filesystem;

namespace linac::test_checkpoint_compat {
namespace {

const fs::path kDir = fs::path(LINAC_TEST_SOURCE_DIR) / "tests" / "data" / "compat";

struct CompatCase {
  const char* name;
  json model;
};

const CompatCase kCases[] = {
    {"transformer", {{"arch", "transformer"}, {"n_layers", 2}, {"d_model", 16}, {"n_heads", 2}, {"vocab_size", 64},
                     {"ffn_hidden", 32}, {"init_std", 0.3}}},
    {"transnormer", {{"arch", "transnormer"}, {"n_layers", 2}, {"d_model", 16}, {"n_heads", 2}, {"vocab_size", 64},
                     {"ffn_hidden", 32}, {"init_std", 0.3}}},
};

double loss_of(Model& model, uint64_t seed) {
  const int64_t B = 2, T = 13, V = model.config().vocab_size;
  model.reserve(B, T);
  return model.forward_loss(test::random_tokens(B, T, V, seed), test::random_tokens(B, T, V, seed + 1));
}

Config config_of(const CompatCase& c) {
  return Config::from_json({{"model", c.model}, {"data", {{"path", "compat.h5"}}}}, c.name);
}

void write_case(const CompatCase& c) {
  const Config cfg = config_of(c);
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  model.init_params(11);
  test::perturb_special_init(model.params());
  CheckpointData d;
  d.config = cfg.to_json();
  d.state.step = 3;
  d.state.updates = 3;
  d.state.tokens_seen = 1536;
  fs::create_directories(kDir);
  save_checkpoint((kDir / (std::string(c.name) + ".h5")).string(), model.params(), d);
  std::ofstream((kDir / (std::string(c.name) + ".json")).string()) << json{{"loss", loss_of(model, 5)}}.dump(2) << "\n";
}

TEST(CheckpointCompat, OlderCheckpointsLoadAndGiveTheirLoss) {
  for (const CompatCase& c : kCases) {
    SCOPED_TRACE(c.name);
    if (std::getenv("LINAC_WRITE_COMPAT")) write_case(c);
    const CheckpointReader reader((kDir / (std::string(c.name) + ".h5")).string());
    EXPECT_EQ(reader.data().state.step, 3);
    const Config cfg = Config::from_json(reader.data().config, c.name);
    EXPECT_EQ(cfg.to_json()["model"], config_of(c).to_json()["model"]);
    Model model(cfg.model, Ctx{}, {.precision = "fp32"});
    reader.load_params(model.params(), false);
    std::ifstream f(kDir / (std::string(c.name) + ".json"));
    const double expect = json::parse(f)["loss"].get<double>();
    // Same weights and batch on the CPU: equal up to changes in f32 summation order.
    EXPECT_NEAR(loss_of(model, 5), expect, 1e-5 * std::fabs(expect));
  }
}

}  // namespace
}  // namespace linac::test_checkpoint_compat
