// Sharded, asynchronous checkpoints of multi-rank runs (train/checkpoint_writer.h) on CPU ranks:
// the layout on 2 and 3 ranks, with and without ZeRO; asynchronous files equal to synchronous
// ones; a job SIGKILLed while a checkpoint is being written resumes (--resume auto) from the
// newest complete one and ends bit for bit where an uninterrupted job ends; SIGTERM waits for the
// write in flight; a damaged shard makes --resume auto skip that checkpoint; resume across world
// sizes (2 -> 1, 1 -> 3 ranks) keeps the data order, loads every tensor exactly, and continues to
// within rounding of an unmoved run (the world size regroups the gradient sums).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <thread>

#include "mpi_run.h"
#include "test_util.h"
#include "data/hdf5_util.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/checkpoint_file.h"
#include "train/checkpoint_writer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_sharded_checkpoint {
namespace {

using test::run_shell;
using test::write_config;
using ShardedCheckpoint = test::MpiTest;

// The tiny config with 384 tokens per step: 12 sequences of 32, which 1, 2 and 3 ranks divide.
json config(const std::string& out_dir, int64_t steps) {
  json j = test::tiny_train_config(out_dir);
  j["train"]["global_batch_tokens"] = 384;
  j["train"]["micro_batch"] = 2;
  j["train"]["steps"] = steps;
  j["train"]["eval_every"] = 0;
  return j;
}

// The ckpt/*.tmp-* entries of a run directory.
std::vector<std::string> temp_entries(const std::string& out_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(out_dir) / "ckpt", ec))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// `sh -c cmd` in a process group of its own.
struct Job {
  pid_t pid = -1;
  explicit Job(const std::string& cmd) {
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid, pid);
  }
  int wait() {
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Job() {  // a failed test: whatever mpirun still runs ends with it
    if (pid > 0) {
      kill(-pid, SIGTERM);
      wait();
    }
  }
};

// Polls `cond` every 20 ms for up to a minute.
bool eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 3000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A checkpoint's state, tokenizer, parameters and moments (checkpoint_contents without the
// config, whose out_dir differs between runs), compared by hash to keep failures readable.
std::vector<uint64_t> contents(const std::string& path) {
  std::vector<uint64_t> out;
  const std::vector<std::string> all = test::checkpoint_contents(path);
  for (size_t i = 1; i < all.size(); ++i) out.push_back(std::hash<std::string>{}(all[i]));
  return out;
}

// Leaves out_dir as if its run had stopped after the checkpoint of `step` (of 3, 6, 9).
void roll_back(const std::string& out_dir, int64_t step) {
  for (int64_t s = step + 3; s <= 9; s += 3) fs::remove_all(test::checkpoint_at(out_dir, s));
  publish_checkpoint(out_dir, test::checkpoint_at(out_dir, step), 5);
}

bool logged(const std::string& out_dir, int64_t step) { return test::logged_steps(out_dir).count(step) > 0; }

// Rank `rank` of a 2-rank job runs with `env`; rank r writes its pid to `pids`.r (mpirun gives the
// ranks process groups of their own: a test kills them by pid).
std::string two_ranks_with(const std::string& bin, int rank, const std::string& env, const std::string& pids,
                           const std::string& args) {
  return std::string(test::kMpiEnv) + "mpirun -np 2 --oversubscribe bash -c 'echo $$ > " + pids +
         ".$OMPI_COMM_WORLD_RANK; [ $OMPI_COMM_WORLD_RANK = " + std::to_string(rank) + " ] && export " + env + "; exec " +
         bin + " " + args + "' > /dev/null 2>&1";
}

pid_t rank_pid(const std::string& pids, int rank) {
  std::ifstream f(pids + "." + std::to_string(rank));
  pid_t pid = 0;
  f >> pid;
  return pid;
}

TEST_F(ShardedCheckpoint, TwoAndThreeRanksWriteOneFilePerRankAndAManifest) {
  const std::string dir = test::fresh_dir("sharded_layout");
  const std::string cfg = write_config(dir, config(dir + "/sync", 6));
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.checkpoint_async=false"), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + dir + "/async"), out), 0) << out;
  EXPECT_NE(out.find("in 2 files"), std::string::npos) << out;
  for (const char* run : {"/sync", "/async"}) {
    const std::string ck = sharded_checkpoint_path(dir + run, 6);
    for (const char* f : {"manifest.json", "rank_00000.h5", "rank_00001.h5"}) EXPECT_TRUE(fs::exists(ck + "/" + f)) << ck << f;
    EXPECT_EQ(test::latest_checkpoint_path(dir + run), ck);
    EXPECT_TRUE(temp_entries(dir + run).empty());
  }
  // Writing in the background changes nothing in the files' contents.
  EXPECT_EQ(contents(sharded_checkpoint_path(dir + "/sync", 6)),
            contents(sharded_checkpoint_path(dir + "/async", 6)));
  // Under ZeRO-1 and ZeRO-2 on 3 ranks each rank writes the shard it owns; the tensors equal plain
  // data parallelism's to rounding (the clipped norm is summed from shards; ZeRO-2 sums each
  // micro-batch over the ranks).
  ASSERT_EQ(run_shell(mpirun(3, "train " + cfg + " --set train.out_dir=" + dir + "/plain3"), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(3, "train " + cfg + " --set train.zero=1 --set train.out_dir=" + dir + "/zero3"), out), 0)
      << out;
  ASSERT_EQ(run_shell(mpirun(3, "train " + cfg + " --set train.zero=2 --set train.out_dir=" + dir + "/zero2_3"), out), 0)
      << out;
  const std::string zero3 = sharded_checkpoint_path(dir + "/zero3", 6);
  EXPECT_TRUE(fs::exists(zero3 + "/rank_00002.h5"));
  for (const char* g : {"params", "optim/m", "optim/v"})
    for (const char* run : {"/zero3", "/zero2_3"})
      EXPECT_LT(test::worst_rel_diff(test::read_all_f32(sharded_checkpoint_path(dir + run, 6), g),
                                     test::read_all_f32(sharded_checkpoint_path(dir + "/plain3", 6), g)),
                1e-4)
          << g << run;
  // Every command that takes a checkpoint takes a sharded one.
  EXPECT_EQ(test::run_linac("eval --checkpoint " + zero3 + " --json", out), 0) << out;
  EXPECT_EQ(test::run_linac("info " + zero3, out), 0) << out;
}

// A job resumed from the uninterrupted job's step 3 is SIGKILLed while rank 1 has not written its
// shard of step 6 (the test stretches its write) and the step loop has run on to step 9: the temp
// directory is all that is left of step 6, --resume auto removes it and continues from step 3,
// and step 9 equals the uninterrupted job's bit for bit.
TEST_F(ShardedCheckpoint, KilledDuringAnAsynchronousWriteResumesBitIdentical) {
  const std::string dir = test::fresh_dir("sharded_kill");
  json j = config(dir + "/straight", 9);
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  const std::string killed = dir + "/killed";
  fs::create_directories(killed + "/ckpt");
  fs::copy(sharded_checkpoint_path(dir + "/straight", 3), sharded_checkpoint_path(killed, 3));
  publish_checkpoint(killed, sharded_checkpoint_path(killed, 3), 5);
  {
    Job job(two_ranks_with(bin_, 1, "LINAC_TEST_CHECKPOINT_DELAY_MS=600000", dir + "/pid",
                           "train " + cfg + " --set train.out_dir=" + killed + " --resume auto"));
    ASSERT_TRUE(eventually([&] { return logged(killed, 9); })) << "the step loop did not run on past step 6";
    const auto tmp = temp_entries(killed);
    ASSERT_EQ(tmp.size(), 1u);
    EXPECT_TRUE(fs::exists(tmp[0] + "/rank_00000.h5"));
    // Rank 1's file is laid out (on its step loop's thread) but holds no values or hashes yet.
    EXPECT_THROW(CheckpointFile::open(tmp[0] + "/rank_00001.h5", false), UserError);
    for (int r = 0; r < 2; ++r) kill(rank_pid(dir + "/pid", r), SIGKILL);  // as if the nodes went down
    job.wait();
  }
  EXPECT_FALSE(fs::exists(sharded_checkpoint_path(killed, 6)));
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + killed + " --resume auto"), out), 0) << out;
  EXPECT_NE(out.find("a temp file of a run killed while writing a checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from " + sharded_checkpoint_path(killed, 3) + " at step 3"), std::string::npos) << out;
  EXPECT_TRUE(temp_entries(killed).empty());
  EXPECT_EQ(contents(sharded_checkpoint_path(killed, 9)),
            contents(sharded_checkpoint_path(dir + "/straight", 9)));
}

// SIGTERM to one rank while a checkpoint is in flight: the job finishes that write, checkpoints
// where it stopped and exits 0, leaving no temp files.
TEST_F(ShardedCheckpoint, StopSignalWaitsForTheWriteInFlight) {
  const std::string dir = test::fresh_dir("sharded_term");
  json j = config(dir + "/run", 100000);
  j["train"]["checkpoint_every"] = 4;
  const std::string cfg = write_config(dir, j);
  Job job(two_ranks_with(bin_, 1, "LINAC_TEST_CHECKPOINT_DELAY_MS=1500", dir + "/pid", "train " + cfg));
  ASSERT_TRUE(eventually([&] { return !temp_entries(dir + "/run").empty() && rank_pid(dir + "/pid", 0) > 0; }));
  const pid_t rank0 = rank_pid(dir + "/pid", 0);
  kill(rank0, SIGTERM);
  EXPECT_EQ(job.wait(), 0);
  EXPECT_TRUE(temp_entries(dir + "/run").empty());
  EXPECT_TRUE(fs::exists(sharded_checkpoint_path(dir + "/run", 4) + "/manifest.json"));
  const std::string last = test::latest_checkpoint_path(dir + "/run");
  const int64_t stopped = CheckpointReader(last).data().state.step;
  EXPECT_GT(stopped, 4);
  EXPECT_EQ(last, sharded_checkpoint_path(dir + "/run", stopped));
}

// A damaged shard (a flipped byte in rank 1's file) or manifest: --resume auto warns, skips that
// checkpoint and resumes from the one before, ending where an undamaged job ends.
TEST_F(ShardedCheckpoint, ADamagedShardIsDetectedAndSkipped) {
  const std::string dir = test::fresh_dir("sharded_damage");
  const std::string cfg = write_config(dir, config(dir + "/straight", 9));
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  for (const char* what : {"rank_00001.h5", "manifest.json"}) {
    const std::string run = dir + "/" + std::string(what).substr(0, 4);
    ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + run), out), 0) << out;
    roll_back(run, 6);
    const std::string ck = sharded_checkpoint_path(run, 6), file = ck + "/" + what;
    {
      // In the shard: a byte of the data of a piece rank 1 wrote; in the manifest: any byte.
      std::streamoff at = static_cast<std::streamoff>(fs::file_size(file)) * 3 / 4;
      if (std::string(what) == "rank_00001.h5") {
        std::ifstream mf(ck + "/manifest.json");
        const json m = json::parse(mf);
        std::string piece;
        for (const auto& [name, t] : m.at("tensors").items())
          if (t.at("pieces").back().at(0) == 1) piece = name;
        ASSERT_FALSE(piece.empty());
        const h5::File h = h5::File::open(file, false);
        const h5::Dataset ds = h5::Dataset::open(h.id(), piece);
        at = static_cast<std::streamoff>(H5Dget_offset(ds.id()) + 4 * (ds.size() / 2));
      }
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      const std::streamoff size = at;
      f.seekg(size);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(size);
      f.write(&c, 1);
    }
    EXPECT_THROW(CheckpointReader{sharded_checkpoint_path(run, 6)}, UserError) << what;
    ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + run + " --resume auto"), out), 0) << out;
    EXPECT_NE(out.find("skipping checkpoint " + sharded_checkpoint_path(run, 6)), std::string::npos) << out;
    EXPECT_NE(out.find("at step 3"), std::string::npos) << out;
    EXPECT_EQ(contents(sharded_checkpoint_path(run, 9)),
              contents(sharded_checkpoint_path(dir + "/straight", 9)))
        << what;
  }
}

// Logged losses within `tol` (relative), step by step.
void expect_losses_close(const std::string& a_dir, const std::string& b_dir, double tol) {
  const auto a = test::logged_steps(a_dir), b = test::logged_steps(b_dir);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, ref] : b) EXPECT_NEAR(a.at(step).first, ref.first, tol * std::fabs(ref.first)) << step;
}

// 2 ranks -> 1 process -> 3 ranks under ZeRO-1 against 2 ranks throughout (each segment resumes
// from a checkpoint of the 9-step run, so the schedule is the same): each resume keeps the data
// order, so the losses and the final state agree to rounding.
TEST_F(ShardedCheckpoint, ResumesAcrossWorldSizes) {
  const std::string dir = test::fresh_dir("sharded_worlds");
  const std::string cfg = write_config(dir, config(dir + "/straight", 9));
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  const std::string moved = dir + "/moved";
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + moved), out), 0) << out;
  roll_back(moved, 3);
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + moved + " --resume auto", out),
            0)
      << out;
  roll_back(moved, 6);
  EXPECT_NE(out.find("written by 2 rank(s), continued on 1: same data order"), std::string::npos) << out;
  ASSERT_EQ(run_shell(mpirun(3, "train " + cfg + " --set train.zero=1 --set train.out_dir=" + moved + " --resume auto"), out),
            0)
      << out;
  EXPECT_NE(out.find("written by 1 rank(s), continued on 3"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(sharded_checkpoint_path(moved, 9) + "/rank_00002.h5"));
  expect_losses_close(moved, dir + "/straight", 1e-5);
  const CheckpointData a = CheckpointReader(sharded_checkpoint_path(moved, 9)).data();
  const CheckpointData b = CheckpointReader(sharded_checkpoint_path(dir + "/straight", 9)).data();
  EXPECT_EQ(a.state.loader.at(0), b.state.loader.at(0));  // one global position, on 3 and on 2 ranks
  EXPECT_EQ(a.state.tokens_seen, b.state.tokens_seen);
  for (const char* g : {"params", "optim/m", "optim/v"})
    EXPECT_LT(test::worst_rel_diff(test::read_all_f32(sharded_checkpoint_path(moved, 9), g),
                                   test::read_all_f32(sharded_checkpoint_path(dir + "/straight", 9), g)),
              1e-4)
        << g;
  // Loading is exact at any world size: the 3-rank checkpoint loaded into one process and
  // written as one file holds the same values.
  const std::string one_file = dir + "/as_one.h5";
  {
    const CheckpointReader r(sharded_checkpoint_path(moved, 9));
    const Config c = Config::from_json(r.data().config, r.path());
    Model model(c.model, Ctx{}, {.precision = "fp32", .with_optimizer = true});
    r.load_params(model.params(), true);
    save_checkpoint(one_file, model.params(), r.data());
  }
  EXPECT_EQ(contents(one_file), contents(sharded_checkpoint_path(moved, 9)));
}

}  // namespace
}  // namespace linac::test_sharded_checkpoint
