// Training-level tests (exact resume is ModelCpu.ResumeIsBitIdentical): crash safety of checkpoints, config and resume errors,
// eval against an independent computation, loss falls.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/hdf5_util.h"
#include "data/prepare.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_training {
namespace {

using test::read_all_f32;

TEST(Training, KilledCheckpointWriteLeavesPreviousLoadable) {
  const std::string dir = test::fresh_dir("kill_ckpt");
  ASSERT_EQ(run_training(Config::from_json(test::tiny_train_config(dir), "k"), ""), 0);
  const std::string prev = test::latest_checkpoint_path(dir);
  const auto prev_params = read_all_f32(prev, "params");
  const CheckpointReader reader(prev);
  const CheckpointData& meta = reader.data();
  const Config cfg = Config::from_json(meta.config, prev);
  Model model(cfg.model, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  reader.load_params(model.params(), true);
  // Kill writers of a new checkpoint at different moments; whatever the moment, the final
  // name holds nothing or a complete file, and `latest` still loads.
  for (int delay_us : {0, 200, 1000, 3000, 10000, 200000}) {
    const std::string target = checkpoint_path(dir, 99);
    fs::remove(target);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      save_checkpoint(target, model.params(), meta);
      publish_checkpoint(dir, target, 100);
      _exit(0);
    }
    usleep(static_cast<useconds_t>(delay_us));
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    if (fs::exists(target)) {
      EXPECT_EQ(read_all_f32(target, "params"), prev_params) << "a partial checkpoint under its final name";
    }
    const std::string latest = test::latest_checkpoint_path(dir);
    EXPECT_EQ(read_all_f32(latest, "params"), prev_params);
  }
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "ckpt"))
    if (e.path().string().find(".tmp-") != std::string::npos) fs::remove(e.path());
}

TEST(Training, RefusesToOverwriteARunWithoutResume) {
  const std::string dir = test::fresh_dir("refuse");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "r"), ""), 0);
  const std::string before = test::latest_checkpoint_path(dir);
  EXPECT_THROW(
      {
        try {
          run_training(Config::from_json(j, "r"), "");
        } catch (const UserError& e) {
          EXPECT_NE(std::string(e.what()).find("--resume auto"), std::string::npos) << e.what();
          throw;
        }
      },
      UserError);
  EXPECT_EQ(test::latest_checkpoint_path(dir), before);
}

TEST(Training, ResumeRefusesADifferentModel) {
  const std::string dir = test::fresh_dir("shape");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "s"), ""), 0);
  j["model"]["d_model"] = 48;
  j["train"]["steps"] = 6;
  try {
    run_training(Config::from_json(j, "s"), "auto");
    FAIL() << "resuming with another model shape must fail";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model config differs"), std::string::npos) << e.what();
  }
}

// The mixer blocks are compared as the stack they resolve to: an option written at its default
// (kv_heads = n_heads among them), the primary kind's options moved from model.mixer to
// model.mixers, or a layer list spelling out the architecture's pattern resume the run; an option
// that changes the mixer does not, and names where.
TEST(Training, ResumeComparesTheStackTheConfigResolvesTo) {
  const std::string dir = test::fresh_dir("same_stack");
  json j = test::tiny_train_config(dir);
  j["model"]["mixer"] = {{"window", 16}};
  j["train"]["steps"] = 2;
  ASSERT_EQ(run_training(Config::from_json(j, "s"), ""), 0);
  json same = j;
  same["model"]["mixer"] = {{"window", 16}, {"rope", true}, {"rope_base", 10000}, {"kv_heads", j["model"]["n_heads"]}};
  same["model"]["layers"] = {"attention", "attention"};
  same["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(same, "s"), "auto"), 0);
  same["model"].erase("mixer");
  same["model"]["mixers"] = {{"attention", {{"window", 16}}}};
  same["train"]["steps"] = 4;
  ASSERT_EQ(run_training(Config::from_json(same, "s"), "auto"), 0);
  EXPECT_NE(test::file_bytes(dir + "/train.log").find("resumed from"), std::string::npos);
  for (const json& other :
       {json{{"window", 8}}, json{{"window", 16}, {"rope_base", 500000}}, json{{"window", 16}, {"kv_heads", 1}}}) {
    json k = j;
    k["model"]["mixer"] = other;
    k["train"]["steps"] = 5;
    try {
      run_training(Config::from_json(k, "s"), "auto");
      ADD_FAILURE() << other.dump() << " resumed a run of window 16";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("model config differs at model.mixer."), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(") from the one in s; refusing to resume"), std::string::npos) << e.what();
    }
  }
  json k = j;
  k["model"]["layers"] = {"attention", "sliding_window"};
  k["model"]["mixers"] = {{"sliding_window", {{"window", 16}}}};
  k["train"]["steps"] = 5;
  try {
    run_training(Config::from_json(k, "s"), "auto");
    ADD_FAILURE() << "a sliding_window layer resumed an attention layer";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("at layer 1's mixer (attention in the checkpoint, sliding_window here)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Training, LossFallsOnText) {
  const std::string dir = test::fresh_dir("falls");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 40;
  j["train"]["warmup_steps"] = 4;
  j["train"]["eval_every"] = 0;
  j["train"]["checkpoint_every"] = 0;
  ASSERT_EQ(run_training(Config::from_json(j, "f"), ""), 0);
  std::ifstream m(fs::path(dir) / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  while (std::getline(m, line)) losses.push_back(json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front(), std::log(300.0), 0.5);
  EXPECT_LT(losses.back(), losses.front() - 2.0) << "40 steps should cut the loss by more than 2 nats";
}

// `linac eval` against a direct computation: the checkpoint's model scores each
// non-overlapping window of the val split, one window at a time, in double precision.
TEST(Training, EvalMatchesIndependentComputation) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("eval");
  ASSERT_EQ(run_training(Config::from_json(test::tiny_train_config(dir), "e"), ""), 0);
  const std::string ckpt = test::latest_checkpoint_path(dir);
  std::string out;
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --seq-len 20 --json", out), 0) << out;
  const json r = json::parse(out.substr(out.find('{')));

  const CheckpointReader reader(ckpt);
  const Config cfg = Config::from_json(reader.data().config, ckpt);
  Model model(cfg.model, Ctx{}, {.precision = "fp64"});
  reader.load_params(model.params(), false);
  TokenDataset ds(test::tiny_dataset());
  const int64_t n = static_cast<int64_t>(ds.size(Split::Val)), T = 20;
  std::vector<int32_t> all(static_cast<size_t>(n));
  ds.read(Split::Val, 0, static_cast<uint64_t>(n), all.data());
  double loss = 0;
  int64_t count = 0;
  for (int64_t s = 0; s + 1 < n; s += T) {
    const int64_t len = std::min(T, n - 1 - s);
    model.reserve(1, len);
    OwnedTensor tok(DType::I32, Device::CPU, {1, len}), tgt(DType::I32, Device::CPU, {1, len});
    for (int64_t t = 0; t < len; ++t) {
      tok->data<int32_t>()[t] = all[static_cast<size_t>(s + t)];
      tgt->data<int32_t>()[t] = all[static_cast<size_t>(s + t + 1)];
    }
    loss += model.forward_loss(tok, tgt);
    count += len;
  }
  EXPECT_EQ(r["tokens"].get<int64_t>(), count);
  EXPECT_NEAR(r["loss"].get<double>(), loss / static_cast<double>(count), 1e-4);
  EXPECT_NEAR(r["perplexity"].get<double>(), std::exp(loss / static_cast<double>(count)), 1e-3);
}

struct ConfigErrorCase {
  const char* set;
  const char* message;
};

TEST(Training, ConfigErrorsExitWithOneLine) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("cfgerr");
  const std::string cfg_path = dir + "/cfg.json";
  std::ofstream(cfg_path) << test::tiny_train_config(dir + "/run").dump(2);
  const ConfigErrorCase cases[] = {
      {"train.lerning_rate=1", "unknown key 'train.lerning_rate'"},
      {"train.lr=\"fast\"", "train.lr: expected a number"},
      {"train.lr=-1", "train.lr: must be in"},
      {"model.n_layer=3", "did you mean 'model.n_layers'"},
      {"model.arch=transfomer", "did you mean 'transformer'"},
      {"model.n_heads=3", "with --set model.n_heads: model.n_heads: must divide model.d_model"},
      {"data.path=/nonexistent/x.h5", "/nonexistent/x.h5"},
      {"model.vocab_size=512", "512"},
      {"train.global_batch_tokens=100", "train.global_batch_tokens: must be a multiple"},
      {"train.schedule=cosin", "did you mean 'cosine'"},
  };
  for (const auto& c : cases) {
    std::string out;
    const int rc = test::run_linac("train " + cfg_path + " --set '" + c.set + "'", out);
    EXPECT_EQ(rc, 2) << c.set << ": " << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.set << " printed: " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << c.set << " printed more than one line: " << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/run")) << "a rejected config must not create the run directory";
}

// A changed train.seed cannot change a resumed run's data order (the loader state carries the
// seed): the run says so once, and config.json and the next checkpoints record the seed in effect.
TEST(Training, ResumeWithAnotherSeedKeepsAndRecordsTheCheckpointsSeed) {
  const std::string dir = test::fresh_dir("reseed");
  json j = test::tiny_train_config(dir);
  j["train"]["seed"] = 11;
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "first.json"), ""), 0);
  j["train"]["seed"] = 12;
  j["train"]["steps"] = 6;
  ASSERT_EQ(run_training(Config::from_json(j, "second.json"), "auto"), 0);
  const std::string log = test::file_bytes(fs::path(dir) / "train.log");
  EXPECT_NE(log.find("train.seed is 12 in second.json but"), std::string::npos) << log;
  EXPECT_NE(log.find("written with seed 11"), std::string::npos) << log;
  EXPECT_EQ(json::parse(test::file_bytes(fs::path(dir) / "config.json"))["train"]["seed"], 11);
  const CheckpointReader last(test::latest_checkpoint_path(dir));
  EXPECT_EQ(last.data().state.step, 6);
  EXPECT_EQ(last.data().state.seed, 11u);
  EXPECT_EQ(last.data().config["train"]["seed"], 11);
}

// eval_every with a dataset that holds nothing out validates nothing: said once when the run starts.
TEST(Training, EvalEveryWithoutAValSplitIsSaid) {
  const std::string dir = test::fresh_dir("noval");
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 20; ++i) text << "the cat sees the ball today. a dog likes a bird again.\n\n";
  }
  PrepareOptions o;
  o.inputs = {dir + "/text.txt"};
  o.out = dir + "/noval.h5";
  o.tokenizer = test::tiny_dataset();
  o.val_fraction = 0;
  o.progress = false;
  prepare(o);
  json j = test::tiny_train_config(dir + "/run");
  j["data"]["path"] = o.out;
  j["data"]["seq_len"] = 8;
  j["train"]["global_batch_tokens"] = 32;
  j["train"]["steps"] = 2;
  j["train"]["eval_every"] = 1;
  ASSERT_EQ(run_training(Config::from_json(j, "n"), ""), 0);
  const std::string log = test::file_bytes(fs::path(dir) / "run" / "train.log");
  EXPECT_NE(log.find("noval.h5's val split has 0 token(s), so train.eval_every (1) validates nothing"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("val loss"), std::string::npos) << log;
}

// The train.log of a short fresh run of the tiny config with `train` keys set, in `out_dir`.
std::string log_of_run(const std::string& out_dir, const json& train) {
  json j = test::tiny_train_config(out_dir);
  j["train"]["eval_every"] = 0;
  j["train"].update(train);
  EXPECT_EQ(run_training(Config::from_json(j, "r"), ""), 0);
  return test::file_bytes(out_dir + "/train.log");
}

// A warmup longer than the run never reaches train.lr: allowed (a short smoke run of a long
// config), but the log says so; a run whose warmup ends inside it says nothing.
TEST(Training, WarmupLongerThanTheRunIsSaid) {
  const std::string dir = test::fresh_dir("warmup");
  const std::string says = "train.warmup_steps (5) exceeds train.steps (2): the learning rate never reaches train.lr";
  EXPECT_NE(log_of_run(dir + "/long", {{"steps", 2}, {"warmup_steps", 5}}).find(says), std::string::npos);
  EXPECT_EQ(log_of_run(dir + "/short", {{"steps", 2}, {"warmup_steps", 2}}).find("warmup_steps"), std::string::npos);
}

// train.zero and train.reduce_dtype act across ranks: a run of one rank keeps them and says so.
TEST(Training, RankSettingsOnOneRankAreSaid) {
  const std::string dir = test::fresh_dir("one_rank");
  EXPECT_NE(log_of_run(dir + "/both", {{"steps", 1}, {"zero", 1}, {"reduce_dtype", "bf16"}})
                .find("on one rank nothing changes for train.zero (1) and train.reduce_dtype (bf16), settings for "
                      "the ranks of an mpirun job"),
            std::string::npos);
  EXPECT_EQ(log_of_run(dir + "/none", {{"steps", 1}}).find("mpirun"), std::string::npos);
}

}  // namespace
}  // namespace linac::test_training
