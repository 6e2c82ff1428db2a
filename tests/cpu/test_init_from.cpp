// train.init_from: a fresh run that starts from a checkpoint's weights (a run's, or one `linac
// import` made from a Hugging Face folder), and only its weights. The first step's loss is the
// checkpoint's loss on that step's batch (computed here by an independent model), the schedule and
// the optimizer are the run's own, and checkpoints that do not fit are refused naming the setting.
// The model uses grouped-query attention (2 query heads sharing 1 key/value head), so this also
// trains GQA end to end.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/train_data.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_init_from {
namespace {

json gqa_config(const std::string& out_dir) {
  json j = test::tiny_train_config(out_dir);
  j["model"]["mixer"] = {{"kv_heads", 1}};
  return j;
}

// One micro-batch per step, so a step's loss is one forward_loss.
json one_batch_per_step(json j) {
  j["train"]["global_batch_tokens"] = j["train"]["micro_batch"].get<int64_t>() * j["data"]["seq_len"].get<int64_t>();
  return j;
}

std::vector<json> metrics(const std::string& dir) {
  std::ifstream m(fs::path(dir) / "metrics.jsonl");
  std::vector<json> out;
  for (std::string line; std::getline(m, line);) out.push_back(json::parse(line));
  return out;
}

// A finished 3-step run's last checkpoint.
std::string trained_checkpoint(const std::string& name, json j) {
  const std::string dir = test::fresh_dir(name);
  j["train"]["out_dir"] = dir;
  j["train"]["steps"] = 3;
  EXPECT_EQ(run_training(Config::from_json(j, name), ""), 0);
  return test::latest_checkpoint_path(dir);
}

// The mean loss of ckpt's weights on the first micro-batch a run of cfg trains on, by a model of
// our own (the run's forward_backward is not involved).
double first_batch_loss(const Config& cfg, const std::string& ckpt) {
  const CheckpointReader reader(ckpt);
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  reader.load_params(model.params(), false);
  const int64_t B = cfg.train.micro_batch, T = cfg.data.seq_len;
  const TrainData data = TrainData::open(cfg);
  const auto batches = data.train_batches(B, T, 0, 1, cfg.train.seed);
  OwnedTensor tok(DType::I32, Device::CPU, {B, T}), tgt(DType::I32, Device::CPU, {B, T});
  batches->next(tok->data<int32_t>(), tgt->data<int32_t>());
  model.reserve(B, T);
  return model.forward_loss(tok, tgt) / static_cast<double>(B * T);  // forward_loss sums over the targets
}

std::string error_of(const json& j) {
  try {
    run_training(Config::from_json(j, "cfg.json"), "");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(InitFrom, FirstStepLossIsTheCheckpointsLossOnItsBatch) {
  const std::string ckpt = trained_checkpoint("init_src", gqa_config(""));
  const std::string dir = test::fresh_dir("init_dst");
  json j = one_batch_per_step(gqa_config(dir));
  j["train"]["init_from"] = ckpt;
  j["train"]["steps"] = 2;
  j["train"]["seed"] = 77;  // another data order than the source run's
  j["train"]["eval_every"] = 0;
  const Config cfg = Config::from_json(j, "dst");
  ASSERT_EQ(run_training(cfg, ""), 0);
  const std::vector<json> m = metrics(dir);
  ASSERT_EQ(m.size(), 2u);

  const double loss = first_batch_loss(cfg, ckpt);
  EXPECT_NEAR(m[0]["loss"].get<double>(), loss, 1e-5 * loss);
  // A trained start: well below a random model's log(vocab).
  EXPECT_LT(loss, std::log(300.0) - 0.3);

  // The schedule is this run's (warm-up from step 0), not the source run's step 3.
  const std::string fresh_dir = test::fresh_dir("init_fresh");
  json fresh = one_batch_per_step(gqa_config(fresh_dir));
  fresh["train"]["steps"] = 2;
  fresh["train"]["seed"] = 77;
  fresh["train"]["eval_every"] = 0;
  ASSERT_EQ(run_training(Config::from_json(fresh, "fresh"), ""), 0);
  const std::vector<json> mf = metrics(fresh_dir);
  ASSERT_EQ(mf.size(), 2u);
  EXPECT_EQ(m[0]["lr"], mf[0]["lr"]);
  EXPECT_EQ(m[1]["lr"], mf[1]["lr"]);
  EXPECT_GT(mf[0]["loss"].get<double>(), m[0]["loss"].get<double>() + 0.3);

  // The run's checkpoint counts its own steps and updates.
  const CheckpointReader out(test::latest_checkpoint_path(dir));
  EXPECT_EQ(out.data().state.step, 2);
  EXPECT_EQ(out.data().state.updates, 2);
  EXPECT_EQ(out.data().config["train"]["init_from"], ckpt);
}

// The fine-tuning path from a Hugging Face folder: a checkpoint exported as LlamaForCausalLM
// (GQA) and imported back (`linac import`: step 0, no optimizer, no loader state) starts a run
// whose first loss is the imported weights' loss on its first batch.
TEST(InitFrom, StartsFromAnImportedHuggingFaceModel) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = trained_checkpoint("init_src_hf", gqa_config(""));
  const std::string dir = test::fresh_dir("init_hf");
  std::string out;
  ASSERT_EQ(test::run_linac("export --format hf --checkpoint " + ckpt + " --out " + dir + "/hf", out), 0) << out;
  ASSERT_EQ(test::run_linac("import --format hf " + dir + "/hf --out " + dir + "/imported.h5", out), 0) << out;
  json j = one_batch_per_step(gqa_config(dir + "/run"));
  j["train"]["init_from"] = dir + "/imported.h5";
  j["train"]["steps"] = 1;
  j["train"]["eval_every"] = 0;
  const Config cfg = Config::from_json(j, "hf");
  ASSERT_EQ(run_training(cfg, ""), 0);
  const std::vector<json> m = metrics(dir + "/run");
  ASSERT_EQ(m.size(), 1u);

  const CheckpointReader imported(dir + "/imported.h5");
  EXPECT_EQ(imported.data().state.step, 0);
  EXPECT_FALSE(imported.has_optimizer());
  const double loss = first_batch_loss(cfg, dir + "/imported.h5");
  EXPECT_NEAR(m[0]["loss"].get<double>(), loss, 1e-5 * loss);
}

// A resumed run continues from its own checkpoint; init_from only seeds the first start.
TEST(InitFrom, ResumeIgnoresIt) {
  const std::string ckpt = trained_checkpoint("init_src2", gqa_config(""));
  const std::string dir = test::fresh_dir("init_resume");
  json j = gqa_config(dir);
  j["train"]["init_from"] = ckpt;
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "a"), ""), 0);
  const auto at3 = test::read_all_f32(test::latest_checkpoint_path(dir), "params");
  j["train"]["steps"] = 4;
  ASSERT_EQ(run_training(Config::from_json(j, "a"), "auto"), 0);
  const CheckpointReader r(test::latest_checkpoint_path(dir));
  EXPECT_EQ(r.data().state.step, 4);
  EXPECT_NE(test::read_all_f32(r.path(), "params"), at3);
}

TEST(InitFrom, SettingsWithoutWeightsMayDiffer) {
  const std::string ckpt = trained_checkpoint("init_src3", gqa_config(""));
  const std::string dir = test::fresh_dir("init_rope");
  json j = gqa_config(dir);
  j["train"]["init_from"] = ckpt;
  j["train"]["steps"] = 1;
  j["model"]["mixer"]["rope_base"] = 500000;
  j["model"]["mixer"]["rope_scaling"] = {{"type", "llama3"}, {"factor", 4}, {"original_max_position_embeddings", 16}};
  ASSERT_EQ(run_training(Config::from_json(j, "r"), ""), 0);
  std::ifstream log(fs::path(dir) / "train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("model/mixer/rope_base is 500000"), std::string::npos) << text;
}

TEST(InitFrom, RefusesWhatDoesNotFit) {
  const std::string ckpt = trained_checkpoint("init_src4", gqa_config(""));
  const std::string dir = test::fresh_dir("init_bad");
  json j = gqa_config(dir);
  j["train"]["init_from"] = dir + "/missing.h5";
  std::string e = error_of(j);
  EXPECT_NE(e.find("train.init_from"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.h5"), std::string::npos) << e;

  // Multi-head attention has a larger wqkv than the checkpoint's GQA one.
  j["train"]["init_from"] = ckpt;
  j["model"]["mixer"].erase("kv_heads");
  e = error_of(j);
  EXPECT_NE(e.find("train.init_from"), std::string::npos) << e;
  EXPECT_NE(e.find("attn.wqkv"), std::string::npos) << e;

  // A damaged file is refused by the checkpoint's own verification.
  const std::string damaged = dir + "/damaged.h5";
  fs::copy_file(ckpt, damaged);
  fs::resize_file(damaged, fs::file_size(damaged) / 2);
  j = gqa_config(dir + "/run2");
  j["train"]["init_from"] = damaged;
  e = error_of(j);
  EXPECT_NE(e.find("damaged.h5"), std::string::npos) << e;
}

}  // namespace
}  // namespace linac::test_init_from
