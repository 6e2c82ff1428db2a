// What protects a run directory and the files in it: one run per out_dir (an advisory lock that
// a crash releases), stale temp files of killed writers removed, one metrics record per step
// across resumes, no checkpoint written with a
// non-finite value, divergence reported with its own exit status, AdamW settings that cannot
// be numerically sound refused before any work, and a run refused while it sets up (its data,
// a checkpoint of another tokenizer) changing nothing on disk.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/run_lock.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_run_safety {
namespace {

TEST(RunLock, SecondHolderIsRefusedUntilTheFirstLetsGo) {
  const std::string dir = test::fresh_dir("lock") + "/run";
  {
    const RunLock first(dir, "train.out_dir");
    const std::string msg = test::user_error_message([&] { RunLock second(dir, "train.out_dir"); });
    EXPECT_NE(msg.find("in use by another training run (pid " + std::to_string(::getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  }
  const RunLock again(dir, "train.out_dir");  // released with the first
}

// The lock belongs to the process: a holder killed by SIGKILL runs no destructor, and the next
// run still gets the directory.
TEST(RunLock, AKilledHolderReleasesIt) {
  const std::string dir = test::fresh_dir("lock_kill");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const RunLock held(dir, "train.out_dir");
    const char c = 1;
    [[maybe_unused]] ssize_t n = write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const std::string msg = test::user_error_message([&] { RunLock second(dir, "train.out_dir"); });
  EXPECT_NE(msg.find("pid " + std::to_string(pid)), std::string::npos) << msg;
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_NO_THROW(RunLock after(dir, "train.out_dir"));
  close(ready[0]);
  close(ready[1]);
}

// A refused or failed start leaves no directory behind that it created, and never removes one
// that existed.
TEST(RunLock, ARefusedRunLeavesNoDirectoryItCreated) {
  const std::string base = test::fresh_dir("lock_clean");
  { const RunLock l(base + "/new", "train.out_dir"); }
  EXPECT_FALSE(fs::exists(base + "/new"));
  { const RunLock l(base, "train.out_dir"); }
  EXPECT_TRUE(fs::exists(base));
  std::ofstream(base + "/file") << "x";
  EXPECT_NE(test::user_error_message([&] { RunLock l(base + "/file", "train.out_dir"); }).find("not a directory"),
            std::string::npos);
}

TEST(RunLock, RemovesStaleTempFilesOnly) {
  const std::string dir = test::fresh_dir("stale");
  fs::create_directories(dir + "/ckpt");
  std::ofstream(dir + "/ckpt/step_000004.h5.tmp-4242") << std::string(1000, 'x');
  std::ofstream(dir + "/ckpt/latest.tmp-4242") << "step_000004.h5";
  std::ofstream(dir + "/ckpt/step_000002.h5") << "kept";
  std::ofstream(dir + "/ckpt/latest") << "step_000002.h5";
  std::ofstream(dir + "/metrics.jsonl.tmp-4242") << "{}";
  std::ofstream(dir + "/metrics.jsonl") << "kept";
  const auto removed = remove_stale_temp_files(dir);
  ASSERT_EQ(removed.size(), 3u);
  EXPECT_TRUE(removed[0].bytes == 1000 || removed[1].bytes == 1000);
  EXPECT_FALSE(fs::exists(dir + "/ckpt/step_000004.h5.tmp-4242"));
  EXPECT_FALSE(fs::exists(dir + "/ckpt/latest.tmp-4242"));
  EXPECT_TRUE(fs::exists(dir + "/ckpt/step_000002.h5"));
  EXPECT_TRUE(fs::exists(dir + "/ckpt/latest"));
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl.tmp-4242"));
  EXPECT_TRUE(fs::exists(dir + "/metrics.jsonl"));
}

// A resumed run removes what a writer killed mid-checkpoint left, and says so in its log.
TEST(RunSafety, ResumeRemovesStaleTempFilesAndSaysSo) {
  const std::string dir = test::fresh_dir("stale_resume");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "s"), ""), 0);
  const std::string stale = dir + "/ckpt/step_000006.h5.tmp-999999";
  std::ofstream(stale) << std::string(4096, 'x');
  j["train"]["steps"] = 4;
  ASSERT_EQ(run_training(Config::from_json(j, "s"), "auto"), 0);
  EXPECT_FALSE(fs::exists(stale));
  const std::string log = test::file_bytes(dir + "/train.log");
  EXPECT_NE(log.find("removed " + stale + " (4096 bytes)"), std::string::npos) << log;
}

// The step of every record of out_dir/metrics.jsonl, in file order.
std::vector<int64_t> logged_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::ifstream m(dir + "/metrics.jsonl");
  for (std::string line; std::getline(m, line);) steps.push_back(json::parse(line).at("step").get<int64_t>());
  return steps;
}

// metrics.jsonl holds one record per step whatever the run went through: a resume from an earlier
// checkpoint drops the records of the steps it runs again, a line a killed writer left
// unfinished and a line that is no record, and keeps the earlier ones byte for byte; a fresh run into a directory whose
// run died before its first checkpoint starts the log again. Each drop is logged.
TEST(RunSafety, MetricsHoldOneRecordPerStepAcrossResumes) {
  const std::string dir = test::fresh_dir("metrics_resume");
  json j = test::tiny_train_config(dir);
  ASSERT_EQ(run_training(Config::from_json(j, "s"), ""), 0);
  ASSERT_EQ(logged_steps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  std::string first = test::file_bytes(dir + "/metrics.jsonl");
  size_t third_end = 0;
  for (int i = 0; i < 3; ++i) third_end = first.find('\n', third_end) + 1;
  // A damaged line among the kept records (line 2), and a last line a killed writer left.
  first.insert(first.find('\n') + 1, "{\"step\": 1.5}\n");
  std::ofstream(dir + "/metrics.jsonl", std::ios::trunc) << first << R"({"step": 7, "loss": 4.)";
  std::ofstream(dir + "/metrics.jsonl.tmp-999999") << "stale";

  ASSERT_EQ(run_training(Config::from_json(j, "s"), dir + "/ckpt/step_000003.h5"), 0);
  EXPECT_EQ(logged_steps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const std::string second = test::file_bytes(dir + "/metrics.jsonl");
  first.erase(first.find('\n') + 1, std::string("{\"step\": 1.5}\n").size());
  EXPECT_EQ(second.substr(0, third_end), first.substr(0, third_end)) << "steps 1-3 kept as written";
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl.tmp-999999"));
  const std::string log = test::file_bytes(dir + "/train.log");
  EXPECT_NE(log.find("dropped 3 record(s) of steps after 3, which this run writes again"), std::string::npos) << log;
  EXPECT_NE(log.find("dropped its last line, which a killed run left unfinished"), std::string::npos) << log;
  EXPECT_NE(log.find("dropped 1 line(s) that were no step's JSON record (line 2)"), std::string::npos) << log;

  fs::remove_all(dir + "/ckpt");  // as if the first run had died before its first checkpoint
  j["train"]["steps"] = 2;
  ASSERT_EQ(run_training(Config::from_json(j, "s"), ""), 0);
  EXPECT_EQ(logged_steps(dir), (std::vector<int64_t>{1, 2}));
  EXPECT_NE(test::file_bytes(dir + "/train.log").find("dropped 6 record(s) of steps after 0,"), std::string::npos);
}

pid_t start_linac(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    const char* bin = std::getenv("LINAC_BIN");
    argv.push_back(const_cast<char*>(bin));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin, argv.data());
    _exit(127);
  }
  return pid;
}

// Two `linac train` processes into one out_dir: the second, fresh or --resume auto, is refused
// with exit 2 naming the first's pid, whether or not the first has written a checkpoint, and
// writes nothing there; once the first ends (SIGTERM, or SIGKILL) the directory is free again.
TEST(RunSafety, SecondTrainerIntoALiveRunIsRefused) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("two_runs"), dir = base + "/run";
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 1000000;
  j["train"]["eval_every"] = 0;
  j["train"]["checkpoint_every"] = 0;
  const std::string cfg = base + "/cfg.json";
  std::ofstream(cfg) << j.dump(2);

  const pid_t first = start_linac({"train", cfg}, base + "/first.txt");
  // Running: the lock names it and it has logged a step.
  for (int i = 0; i < 600 && test::file_bytes(dir + "/metrics.jsonl").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE(test::file_bytes(dir + "/metrics.jsonl").empty()) << test::file_bytes(base + "/first.txt");
  EXPECT_FALSE(fs::exists(dir + "/ckpt")) << "the first run has written no checkpoint yet";
  const std::string config_before = test::file_bytes(dir + "/config.json");
  for (const std::string extra : {"", " --resume auto", " --set train.lr=1e-3"}) {
    std::string out;
    // (bounded: without the lock a second run would train its million steps)
    const int rc = test::run_linac("train " + cfg + extra, out, "ulimit -t 20;");
    EXPECT_EQ(rc, 2) << extra << ": " << out;
    EXPECT_NE(out.find("linac train: error: train.out_dir '" + dir + "' is in use by another training run (pid " +
                       std::to_string(first)),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(test::file_bytes(dir + "/config.json"), config_before);
  kill(first, SIGTERM);
  int st = 0;
  waitpid(first, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << test::file_bytes(base + "/first.txt");
  // Every logged step once: nothing of the refused runs is in the metrics.
  std::ifstream m(dir + "/metrics.jsonl");
  int64_t expect = 1;
  for (std::string line; std::getline(m, line); ++expect) ASSERT_EQ(json::parse(line)["step"], expect) << line;
  const std::string ckpt = test::latest_checkpoint_path(dir);
  ASSERT_FALSE(ckpt.empty());

  // Free again after a clean stop, and after a SIGKILL.
  const pid_t second = start_linac({"train", cfg, "--resume", "auto"}, base + "/second.txt");
  for (int i = 0; i < 600 && test::file_bytes(dir + "/train.log").find("resumed from") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(second, SIGKILL);
  waitpid(second, &st, 0);
  std::string out;
  const int64_t at = CheckpointReader(ckpt).data().state.step;
  EXPECT_EQ(test::run_linac("train " + cfg + " --resume auto --set train.steps=" + std::to_string(at + 1), out), 0) << out;
}

// Writes a tiny config with overrides to base/cfg.json.
std::string write_cfg(const std::string& base, json j) {
  const std::string path = base + "/cfg.json";
  std::ofstream(path) << j.dump(2);
  return path;
}

// Every value of every checkpoint left in out_dir is finite.
void expect_checkpoints_finite(const std::string& out_dir) {
  if (!fs::exists(out_dir + "/ckpt")) return;
  for (const auto& e : fs::directory_iterator(out_dir + "/ckpt")) {
    if (e.path().extension() != ".h5") continue;
    for (const char* group : {"params", "optim/m", "optim/v"})
      for (float v : test::read_all_f32(e.path().string(), group))
        ASSERT_TRUE(std::isfinite(v)) << e.path() << " " << group << " holds " << v;
  }
}

// Runs config `j` with AdamW's eps and beta2 at 0 (validation bypassed): the run must end as
// diverged; returns its message.
std::string diverged_message(const json& j, const std::string& resume) {
  Config cfg = Config::from_json(j, "n");
  cfg.train.adam_eps = 0;
  cfg.train.beta2 = 0;
  try {
    run_training(cfg, resume);
  } catch (const Diverged& e) {
    return e.what();
  }
  ADD_FAILURE() << "a run with non-finite weights ended normally";
  return "";
}

// The issue's case, with validation bypassed: AdamW with eps 0 and beta2 0 writes NaN/inf into
// embedding rows that see no gradient while every loss stays finite. The run stops as diverged
// before a checkpoint holds one of them, and names the last checkpoint that is finite.
TEST(RunSafety, NonFiniteWeightsNeverReachACheckpoint) {
  const std::string dir = test::fresh_dir("nonfinite");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 2;
  j["train"]["checkpoint_every"] = 2;
  ASSERT_EQ(run_training(Config::from_json(j, "n"), ""), 0);
  const std::string good = test::latest_checkpoint_path(dir);
  j["train"]["steps"] = 8;
  j["train"]["log_every"] = 100;  // the check before the checkpoint must catch it, not a log step
  {
    const std::string msg = diverged_message(j, "auto");
    EXPECT_NE(msg.find("training diverged at step 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not finite"), std::string::npos) << msg;
    EXPECT_NE(msg.find("embed"), std::string::npos) << "names the tensor: " << msg;
    EXPECT_NE(msg.find("the last checkpoint with finite values is " + good + " (step 2)"), std::string::npos) << msg;
  }
  EXPECT_EQ(test::latest_checkpoint_path(dir), good);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 4)));
  expect_checkpoints_finite(dir);
}

// The same check at a logged step, and a resume from a checkpoint that holds an inf is refused.
TEST(RunSafety, NonFiniteWeightsStopAtALoggedStepAndAreNotResumed) {
  const std::string dir = test::fresh_dir("nonfinite_log");
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 6;
  j["train"]["checkpoint_every"] = 100;
  const std::string msg = diverged_message(j, "");
  EXPECT_NE(msg.find("training diverged at step 1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("none: no checkpoint was written"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/ckpt"));

  // A checkpoint with one inf (as an older linac could write) is refused as a resume point.
  const std::string ok_dir = test::fresh_dir("nonfinite_resume");
  j = test::tiny_train_config(ok_dir);
  j["train"]["steps"] = 3;
  ASSERT_EQ(run_training(Config::from_json(j, "n"), ""), 0);
  const CheckpointReader reader(test::latest_checkpoint_path(ok_dir));
  Model model(Config::from_json(reader.data().config, "c").model, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  reader.load_params(model.params(), true);
  model.params().m(1).data<float>()[3] = INFINITY;
  const std::string bad = ok_dir + "/bad.h5";
  save_checkpoint(bad, model.params(), reader.data());
  j["train"]["steps"] = 5;
  const std::string refused = test::user_error_message([&] { run_training(Config::from_json(j, "n"), bad); });
  EXPECT_NE(refused.find(bad + ": holds 1 non-finite"), std::string::npos) << refused;
}

// The step a diverged run's message says it ended at.
int64_t diverged_step(const std::string& msg) {
  const std::string at = "training diverged at step ";
  return msg.rfind(at, 0) == 0 ? std::stoll(msg.substr(at.size())) : 0;
}

// A tiny run in `dir` whose gradients turn non-finite: lr * weight_decay = 10 multiplies every
// tensor by -9 per step, finite weights whose products overflow within a dozen steps. Checkpoints
// at every step, three skipped steps in a row end it; returns its config and its message.
std::pair<json, std::string> run_into_non_finite_steps(const std::string& dir, int64_t keep_last) {
  json j = test::tiny_train_config(dir);
  j["train"].update({{"steps", 40},
                     {"lr", 10},
                     {"min_lr", 10},
                     {"warmup_steps", 0},
                     {"weight_decay", 1},
                     {"decay_norms_and_embeddings", true},
                     {"checkpoint_every", 1},
                     {"keep_last", keep_last},
                     {"eval_every", 0},
                     {"max_bad_steps", 3}});
  try {
    run_training(Config::from_json(j, "n"), "");
  } catch (const Diverged& e) {
    return {j, e.what()};
  }
  ADD_FAILURE() << "the run did not diverge";
  return {j, ""};
}

// A run whose gradients turn non-finite skips its updates, so the checkpoints written during the
// skipped steps (and the one just before the first of them) hold the weights that gave those
// steps their non-finite values, and a resume replays them bit for bit whatever the lr. The
// message names the newest checkpoint before that, and a resume from it with a lower lr trains
// on where one from the next checkpoint fails again. With train.keep_last too small to keep it,
// the message says so instead of naming a file that is gone.
TEST(RunSafety, NonFiniteStepsNameTheCheckpointBeforeThem) {
  const std::string dir = test::fresh_dir("bad_steps");
  auto [j, msg] = run_into_non_finite_steps(dir, 100);
  const int64_t first_bad = diverged_step(msg) - 2;  // the first of the three skipped steps
  ASSERT_GE(first_bad, 3) << msg;
  EXPECT_NE(msg.find("3 steps in a row had a non-finite loss or gradient norm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the last checkpoint before them is " + checkpoint_path(dir, first_bad - 2) + " (step " +
                     std::to_string(first_bad - 2) + ") (lower train.lr or raise train.adam_eps, then resume from it)"),
            std::string::npos)
      << msg;
  ASSERT_TRUE(fs::exists(checkpoint_path(dir, first_bad + 1)));  // written during the skipped steps

  // From the checkpoint named, with a lower lr, the steps go on finite (one skip would end it);
  // from the next one they do not.
  j["train"].update(
      {{"lr", 1e-3}, {"min_lr", 1e-3}, {"max_bad_steps", 1}, {"steps", first_bad + 2}, {"checkpoint_every", 100}});
  for (const int64_t from : {first_bad - 2, first_bad - 1}) {
    j["train"]["out_dir"] = test::fresh_dir("bad_steps_from_" + std::to_string(from - first_bad + 2));
    const Config cfg = Config::from_json(j, "n");
    if (from == first_bad - 2)
      EXPECT_EQ(run_training(cfg, checkpoint_path(dir, from)), 0);
    else
      EXPECT_THROW(run_training(cfg, checkpoint_path(dir, from)), Diverged);
  }

  const std::string kept = test::fresh_dir("bad_steps_keep");
  msg = run_into_non_finite_steps(kept, 2).second;
  EXPECT_NE(msg.find("the last checkpoint before them is none left: " + checkpoint_path(kept, first_bad - 2) +
                     " (step " + std::to_string(first_bad - 2) +
                     ") was removed to keep train.keep_last (2) newer ones (lower train.lr or raise "
                     "train.adam_eps, then resume from an earlier one or start over)"),
            std::string::npos)
      << msg;
}

// A run that diverges through the CLI: exit status 3 and one `linac train: error:` line.
// lr * weight_decay = 100 multiplies every matrix by -99 per step, so the weights overflow f32
// within ~20 steps whatever the data.
TEST(RunSafety, DivergedRunExitsWithItsOwnStatus) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("diverge");
  json j = test::tiny_train_config(base + "/run");
  j["train"]["steps"] = 60;
  j["train"]["lr"] = 10;
  j["train"]["min_lr"] = 10;
  j["train"]["weight_decay"] = 10;
  j["train"]["grad_clip"] = 0;
  j["train"]["warmup_steps"] = 0;
  j["train"]["eval_every"] = 0;
  j["train"]["checkpoint_every"] = 5;
  std::string out;
  EXPECT_EQ(test::run_linac("train " + write_cfg(base, j), out), 3) << out;
  EXPECT_NE(out.find("\nlinac train: error: training diverged at step "), std::string::npos) << out;
  EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  // Said once on the console (the error line, not a log line too), and kept in train.log.
  const size_t first = out.find("training diverged at step ");
  EXPECT_EQ(out.find("training diverged at step ", first + 1), std::string::npos) << out;
  std::ifstream log(base + "/run/train.log");
  const std::string logged((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(logged.find("training diverged at step "), std::string::npos) << logged;
  expect_checkpoints_finite(base + "/run");
}

// A dataset like tiny_dataset() but with other words, so its SentencePiece model differs.
std::string other_tokenizer_dataset(const std::string& base) {
  const std::string dir = base + "/other_text";
  fs::create_directories(dir);
  for (int f = 0; f < 20; ++f) {
    std::ofstream out(dir + "/other" + std::to_string(f) + ".txt");
    for (int s = 0; s < 80; ++s) out << "quartz " << (s * 7 + f) % 13 << " zephyr wobbles; lynx " << s % 5 << "!\n\n";
  }
  return test::prepare_small_dataset(dir, base + "/other.h5");
}

TEST(RunSafety, ARefusedRunChangesNothingOnDisk) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("refused"), dir = base + "/run";
  json j = test::tiny_train_config(dir);
  j["train"]["steps"] = 2;
  const std::string cfg = write_cfg(base, j);
  std::string out;
  ASSERT_EQ(test::run_linac("train " + cfg, out), 0) << out;
  const std::string config_before = test::file_bytes(dir + "/config.json");
  ASSERT_FALSE(config_before.empty());
  const std::string too_long =
      " --set data.seq_len=100000 --set train.micro_batch=1 --set train.global_batch_tokens=100000";
  auto expect_refused = [&](const std::string& args, const std::string& what) {
    std::string o;
    EXPECT_EQ(test::run_linac(args, o), 2) << args << ": " << o;
    EXPECT_EQ(std::count(o.begin(), o.end(), '\n'), 1) << o;
    EXPECT_NE(o.find(what), std::string::npos) << o;
  };
  // Resuming with a config its data refuses: the run's config.json is the run's, not the refused one's.
  expect_refused("train " + cfg + " --resume auto" + too_long, "the checkpoint's data.seq_len (32) differs");
  EXPECT_EQ(test::file_bytes(dir + "/config.json"), config_before);
  // The loader's position counts sequences: at another length it would name other tokens.
  expect_refused("train " + cfg + " --resume auto --set data.seq_len=16",
                 "the checkpoint's data.seq_len (32) differs from the 16 given by --set data.seq_len, so the run "
                 "cannot continue its data order; refusing to resume");
  EXPECT_EQ(test::file_bytes(dir + "/config.json"), config_before);
  // A fresh run refused after its lock was taken leaves no directory behind, nor the parents it made.
  expect_refused("train " + cfg + " --set train.out_dir=" + base + "/new/a/b" + too_long, "fewer than seq_len + 1");
  EXPECT_FALSE(fs::exists(base + "/new"));
  EXPECT_TRUE(fs::exists(base));
  // The ids of data with another tokenizer mean other tokens: refused for --resume as for init_from, and by eval.
  const std::string ckpt = test::latest_checkpoint_path(dir), other = other_tokenizer_dataset(base);
  expect_refused(
      "train " + cfg + " --set data.path=" + other + " --set train.out_dir=" + base + "/other --resume " + ckpt,
      "has another SentencePiece model than data.path");
  EXPECT_FALSE(fs::exists(base + "/other"));
  expect_refused("eval --checkpoint " + ckpt + " --data " + other, "its SentencePiece model is not");
  // A run already past train.steps.
  expect_refused("train " + cfg + " --resume auto --set train.steps=1",
                 "error: --set train.steps: 1 is below the step of");
  // A model config that differs names where.
  expect_refused("train " + cfg + " --resume auto --set model.mixer.window=8",
                 "the checkpoint's model config differs at model.mixer.window (layer 0, attention) from the one given "
                 "by --set model.mixer.window; refusing to resume");
  // A checkpoint of another run into a directory with its own checkpoints would mix the two runs
  // and prune this one's.
  const std::string other_run = base + "/other_run";
  json k = test::tiny_train_config(other_run);
  k["train"]["steps"] = 1;
  ASSERT_EQ(test::run_linac("train " + write_cfg(base + "/other_text", k), out), 0) << out;
  const std::string listing = test::file_bytes(dir + "/ckpt/latest");
  expect_refused(
      "train " + cfg + " --set train.keep_last=1 --resume " + test::latest_checkpoint_path(other_run),
      "holds checkpoints of its own run, and --resume " + test::latest_checkpoint_path(other_run) + " is outside it");
  EXPECT_EQ(test::file_bytes(dir + "/ckpt/latest"), listing);
  EXPECT_TRUE(fs::exists(ckpt));
}

// A run records its resolved config as out_dir/config.json. A config file the user keeps there
// (comments, only the keys they set) is not overwritten: refused before anything is written. The
// record itself is a config the run may be resumed from, --set included. A ckpt/latest that is
// not a file (the run renames a new one over it at every checkpoint) is refused at the start.
TEST(RunSafety, TheRunsConfigRecordNeverReplacesTheUsersConfig) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("config_record"), mine = base + "/mine";
  fs::create_directories(mine);
  json j = test::tiny_train_config(".");
  j["train"]["steps"] = 2;
  const std::string users = "// my experiment\n" + j.dump(2) + "\n";
  std::ofstream(mine + "/config.json") << users;
  std::string out;
  EXPECT_EQ(test::run_linac("train config.json", out, "cd " + mine + ";"), 2) << out;
  EXPECT_NE(out.find("config.json is train.out_dir's config.json, where the run records the config it resolves"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::file_bytes(mine + "/config.json"), users);
  EXPECT_EQ(std::distance(fs::directory_iterator(mine), fs::directory_iterator()), 1);  // nothing else written

  const std::string run = base + "/run";
  json k = test::tiny_train_config(run);
  k["train"]["steps"] = 2;
  ASSERT_EQ(test::run_linac("train " + write_cfg(base, k), out), 0) << out;
  ASSERT_EQ(test::run_linac("train " + run + "/config.json --resume auto --set train.steps=3", out), 0) << out;
  EXPECT_EQ(CheckpointReader(test::latest_checkpoint_path(run)).data().state.step, 3);
  EXPECT_EQ(json::parse(test::file_bytes(run + "/config.json"))["train"]["steps"], 3);

  fs::create_directories(base + "/latest_dir/ckpt/latest");
  EXPECT_EQ(test::run_linac("train " + write_cfg(base, k) + " --set train.out_dir=" + base + "/latest_dir", out), 2)
      << out;
  EXPECT_NE(out.find(base + "/latest_dir/ckpt/latest is not a regular file"), std::string::npos) << out;
  EXPECT_TRUE(fs::is_directory(base + "/latest_dir/ckpt/latest"));
}

// A console pipe whose reader leaves (linac train ... | head -1) no longer kills the run with
// SIGPIPE before its checkpoints: it trains to the end, its log in train.log.
TEST(RunSafety, AClosedConsolePipeDoesNotStopTheRun) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("closed_pipe"), dir = base + "/run";
  const std::string cfg = write_cfg(base, test::tiny_train_config(dir));
  const std::string cmd = std::string(std::getenv("LINAC_BIN")) + " train " + cfg + " 2>&1 | head -c 1 >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(test::latest_checkpoint_path(dir), dir + "/ckpt/step_000006.h5");
  EXPECT_NE(test::file_bytes(dir + "/train.log").find("done: 6 steps"), std::string::npos);
}

// SIGTERM while the run still sets up (a larger model's initialisation) stops it after its first
// step with a checkpoint, exit 0, as during training; it used to end the process on the spot.
TEST(RunSafety, StopSignalDuringSetUpCheckpointsAfterTheFirstStep) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string base = test::fresh_dir("stop_setup"), dir = base + "/run";
  json j = test::tiny_train_config(dir);
  j["model"]["d_model"] = 384;
  j["model"]["n_layers"] = 4;
  j["model"]["n_heads"] = 4;
  const pid_t pid = start_linac({"train", write_cfg(base, j)}, base + "/out.txt");
  // train.log appears as the run opens its directory, before the model is built.
  for (int i = 0; i < 2000 && !fs::exists(dir + "/train.log"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << test::file_bytes(base + "/out.txt");
  EXPECT_EQ(CheckpointReader(test::latest_checkpoint_path(dir)).data().state.step, 1)
      << test::file_bytes(base + "/out.txt");
}

TEST(RunSafety, UnsoundAdamSettingsAreRefused) {
  json j = test::tiny_train_config("x");
  j["train"]["adam_eps"] = 0;
  EXPECT_NE(test::user_error_message([&] { Config::from_json(j, "c.json"); }).find("train.adam_eps"),
            std::string::npos);
  j["train"]["adam_eps"] = 1e-8;
  j["train"]["beta2"] = 0;
  const std::string msg = test::user_error_message([&] { Config::from_json(j, "c.json"); });
  EXPECT_NE(msg.find("train.beta2: must exceed train.beta1^2 = 0.81 (got 0)"), std::string::npos) << msg;
  j["train"]["beta2"] = 0.8;
  EXPECT_NE(test::user_error_message([&] { Config::from_json(j, "c.json"); }).find("train.beta2"), std::string::npos);
  j["train"]["beta2"] = 0.82;
  EXPECT_NO_THROW(Config::from_json(j, "c.json"));
  j["train"]["beta1"] = 0;  // sign-like updates g / (|g| + eps): bounded
  j["train"]["beta2"] = 0;
  EXPECT_NO_THROW(Config::from_json(j, "c.json"));
}

}  // namespace
}  // namespace linac::test_run_safety
