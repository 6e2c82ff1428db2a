// Data parallelism on the CPU through `mpirun -np 2`: equivalence with one process, rank
// agreement, exact resume and failure handling. Runs the linac binary (LINAC_BIN).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "mpi_run.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/run_lock.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_dist {
namespace {

using test::kMpiEnv;
using test::run_shell;
using test::write_config;
class Dist : public test::MpiTest {
 protected:
  std::string check_two_ranks_equal_one(const std::string& dir, const std::string& packing) const;
};

// Two ranks with micro-batch B equal one process with micro-batch 2B: the loader hands rank r
// rows [rB, (r+1)B) of the same global batch. In fp64 the results agree to rounding (the sum
// of gradients is grouped differently), so fp32 checkpoints are identical or 1 ulp apart.
// Trains the tiny config in fp64 with `packing` on two ranks of 2 sequences and on one process of
// 4 (2 x 2 x 2 micro-batches x 32 tokens = 256 per step) under dir; returns the one-process run's
// directory after checking that the two end within 1e-6.
std::string Dist::check_two_ranks_equal_one(const std::string& dir, const std::string& packing) const {
  json j = test::tiny_train_config(dir + "/two");
  j["train"]["precision"] = "fp64";
  j["train"]["micro_batch"] = 2;
  j["data"]["packing"] = packing;
  const std::string cfg = write_config(dir, j);
  std::string out;
  EXPECT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  EXPECT_NE(out.find("2 rank(s) via mpi"), std::string::npos) << out;
  EXPECT_NE(out.find("in 2 files"), std::string::npos) << out;
  EXPECT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + dir + "/one", out), 0)
      << out;
  EXPECT_LT(test::worst_rel_diff(test::read_all_f32(test::checkpoint_at(dir + "/two", 6), "params"),
                                  test::read_all_f32(test::checkpoint_at(dir + "/one", 6), "params")),
            1e-6)
      << "2 ranks vs 1 process";
  return dir + "/one";
}

TEST_F(Dist, TwoRanksEqualOneProcessWithTheSameGlobalBatch) {
  const std::string dir = test::fresh_dir("dp_equiv");
  check_two_ranks_equal_one(dir, "stream");
  const CheckpointData meta = CheckpointReader(test::checkpoint_at(dir + "/two", 6)).data();
  EXPECT_EQ(meta.state.world_size, 2);
  ASSERT_EQ(meta.state.loader.size(), 2u);
}

// Document packing (data.packing "document") keeps that equivalence: each rank computes its rows'
// document bounds from its own tokens. The documents matter: stream packing ends elsewhere.
TEST_F(Dist, DocumentPackingTwoRanksEqualOneProcess) {
  const std::string documents = check_two_ranks_equal_one(test::fresh_dir("dp_documents"), "document");
  const std::string stream = check_two_ranks_equal_one(test::fresh_dir("dp_stream"), "stream");
  EXPECT_GT(test::worst_rel_diff(test::read_all_f32(test::checkpoint_at(stream, 6), "params"),
                                  test::read_all_f32(test::checkpoint_at(documents, 6), "params")),
            1e-6)
      << "document packing trained like stream packing";
}

// Transformer-VQ's codebooks: the statistics are summed over ranks before the EMA update, so two
// ranks end with the codebook one process computes from the same global batch.
TEST_F(Dist, TwoRanksUpdateTheCodebookLikeOneProcess) {
  const std::string dir = test::fresh_dir("dp_vq");
  json j = test::tiny_train_config(dir + "/two");
  j["model"] = {{"arch", "transformer_vq"}, {"n_layers", 2},   {"d_model", 32},     {"n_heads", 1},
                {"vocab_size", 300},        {"head_bias", true}, {"final_norm", false},
                {"mixer", {{"dk", 8}, {"dv", 32}, {"codebook", 16}, {"block", 8}, {"beta", 0.01}}}};
  j["train"]["precision"] = "fp64";
  j["train"]["micro_batch"] = 2;
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + dir + "/one", out), 0)
      << out;
  for (const char* g : {"buffers", "params"}) {
    const auto a = test::read_all_f32(test::checkpoint_at(dir + "/two", 6), g);
    const auto b = test::read_all_f32(test::checkpoint_at(dir + "/one", 6), g);
    ASSERT_FALSE(a.empty()) << g;
    EXPECT_LT(test::worst_rel_diff(a, b), 1e-6) << g << ": 2 ranks vs 1 process";
  }
}

// MQAR: the ranks split each global batch of generated sequences, scale by the global number of
// queries, and score disjoint shares of the test set whose sums are the one-process scores.
TEST_F(Dist, MqarTwoRanksEqualOneProcess) {
  const std::string dir = test::fresh_dir("dp_mqar");
  json j = test::tiny_train_config(dir + "/two");
  j["model"]["vocab_size"] = 64;
  j["data"] = json::parse(R"({"type": "mqar", "seq_len": 32,
      "mqar": {"train": [{"seq_len": 16, "pairs": 2, "count": 50}, {"seq_len": 32, "pairs": 7, "count": 30}],
               "test": [{"seq_len": 16, "pairs": 3, "count": 9}, {"seq_len": 48, "pairs": 11, "count": 5}]}})");
  j["train"]["precision"] = "fp64";
  j["train"]["micro_batch"] = 2;
  j["train"]["eval_every"] = 3;
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + dir + "/one", out), 0)
      << out;
  EXPECT_LT(test::worst_rel_diff(test::read_all_f32(test::checkpoint_at(dir + "/two", 6), "params"),
                                  test::read_all_f32(test::checkpoint_at(dir + "/one", 6), "params")),
            1e-6);
  auto val = [](const std::string& run) {
    std::vector<json> recs;
    std::ifstream f(run + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (json r = json::parse(line); r.contains("val_accuracy")) recs.push_back(r);
    return recs;
  };
  const auto two = val(dir + "/two"), one = val(dir + "/one");
  ASSERT_EQ(two.size(), 2u);
  ASSERT_EQ(one.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(two[i]["val_loss"].get<double>(), one[i]["val_loss"].get<double>(), 1e-9);
    EXPECT_EQ(two[i]["val_accuracy"], one[i]["val_accuracy"]);
    EXPECT_EQ(two[i]["val_slices"], one[i]["val_slices"]);
  }
}

// Overlapped reductions, bucket by bucket as the backward goes (most of them waiting for the
// next block's comm window, comm/grad_reducer.h), give the same bits as one reduction after the
// backward; `bench` counts where the buckets started.
TEST_F(Dist, BucketsInCommWindowsEqualOneReductionAfterTheBackward) {
  const std::string dir = test::fresh_dir("dp_windows");
  json j = test::tiny_train_config(dir + "/overlapped");
  j["train"]["micro_batch"] = 2;
  j["train"]["bucket_mb"] = 0.01;  // several buckets per block
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(
      run_shell(mpirun(2, "train " + cfg + " --set train.overlap_comm=false --set train.out_dir=" + dir + "/after"),
                out),
      0)
      << out;
  for (const char* g : {"params", "optim/m", "optim/v"})
    EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/overlapped", 6), g),
              test::read_all_f32(test::checkpoint_at(dir + "/after", 6), g))
        << g;

  ASSERT_EQ(run_shell(mpirun(2, "bench " + cfg + " --steps 1 --warmup 0 --json"), out), 0) << out;
  const json r = json::parse(out.substr(out.find('{')));
  const int64_t buckets = r["buckets"], windows = r["bucket_starts"]["windows"], ready = r["bucket_starts"]["ready"],
                after = r["bucket_starts"]["after_backward"];
  EXPECT_GT(buckets, 4) << out;
  EXPECT_EQ(windows + ready + after, buckets) << out;
  // The head's and block 1's buckets wait for block 0's window; block 0's and the embedding's
  // start when ready (nothing comes after them to hide behind).
  EXPECT_GT(windows, 0) << out;
  EXPECT_GT(ready, 0) << out;
  EXPECT_EQ(after, 0) << out;
}

TEST_F(Dist, ResumeWithTwoRanksIsBitIdentical) {
  const std::string dir = test::fresh_dir("dp_resume");
  json j = test::tiny_train_config(dir + "/a");
  j["train"]["micro_batch"] = 2;
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + dir + "/b"), out), 0) << out;
  fs::remove_all(test::checkpoint_at(dir + "/b", 6));
  publish_checkpoint(dir + "/b", test::checkpoint_at(dir + "/b", 3), 5);
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + dir + "/b --resume auto"), out), 0) << out;
  EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/a", 6), "params"),
            test::read_all_f32(test::checkpoint_at(dir + "/b", 6), "params"));
  EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/a", 6), "optim/v"),
            test::read_all_f32(test::checkpoint_at(dir + "/b", 6), "optim/v"));
}

// A job that must fail by itself: not 0, and not the 120 s timeout of mpirun_rank1.
void expect_failed_job(int rc, const std::string& out) {
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "the job hung until timeout: " << out;
}

TEST_F(Dist, FailingRankEndsTheJobNamingIt) {
  const std::string dir = test::fresh_dir("dp_fail");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["micro_batch"] = 2;
  const std::string cfg = write_config(dir, j);
  // Rank 1 is given a dataset that does not exist; rank 0 would wait for it forever.
  std::string out;
  expect_failed_job(run_shell(mpirun_rank1("train " + cfg, "--set data.path=/nonexistent/rank1.h5"), out), out);
  EXPECT_NE(out.find("(rank 1): error:"), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/rank1.h5"), std::string::npos) << out;
}

// A rank run with another setting (here --set train.seed on rank 1 only) is refused before
// anything is trained, the setting named, on every rank; nothing is written to out_dir. So is one
// with a setting the others lack.
TEST_F(Dist, RanksWithDifferentConfigsAreRefused) {
  const std::string dir = test::fresh_dir("dp_configs");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["micro_batch"] = 2;
  const std::string cfg = write_config(dir, j);
  std::string out;
  expect_failed_job(run_shell(mpirun_rank1("train " + cfg, "--set train.seed=999"), out), out);
  EXPECT_NE(out.find("train.seed differs between rank 0 and rank 1"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << out;
  EXPECT_TRUE(test::latest_checkpoint_path(dir + "/run").empty()) << out;
  // An optional setting on rank 1 only (the default stack spelled out): the ranks' lists of
  // settings differ in length, so none is named, and nothing hangs.
  expect_failed_job(run_shell(mpirun_rank1("train " + cfg, "--set model.layer_pattern=[\\\"attention\\\"]"), out), out);
  EXPECT_NE(out.find("rank 0 and rank 1 set different settings"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << out;
}

// Ranks that would start from different weights (each resumed from another run's checkpoint, the
// configuration the same) are refused when the run starts, by the hash of their parameters, before
// anything is trained or written.
TEST_F(Dist, RanksStartingFromDifferentWeightsAreRefused) {
  const std::string dir = test::fresh_dir("dp_weights");
  json j = test::tiny_train_config(dir + "/a");
  j["train"]["micro_batch"] = 2;
  j["train"]["steps"] = 3;
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + dir + "/b --set train.seed=7"), out), 0)
      << out;
  const std::string a = test::checkpoint_at(dir + "/a", 3), b = test::checkpoint_at(dir + "/b", 3);
  const std::string args = "train " + cfg + " --set train.steps=6 --set train.out_dir=" + dir + "/c --resume";
  expect_failed_job(run_shell(mpirun_rank1(args, b, a), out), out);
  EXPECT_NE(out.find("rank 1's parameters differ from rank 0's when the run starts (step 3)"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir + "/c/metrics.jsonl")) << out;
  EXPECT_TRUE(test::latest_checkpoint_path(dir + "/c").empty()) << out;
}

// Ranks whose parameters drift apart during a run (here rank 1's zeroed by the test hook just
// before the step-6 checkpoint) end the run at that checkpoint as diverged, naming the rank, with
// nothing of step 6 written, after the step-3 checkpoint still in flight is complete (an early
// version exited through MPI_Abort and lost it when the write was slow).
TEST_F(Dist, RanksThatDriftApartStopAtTheNextCheckpoint) {
  const std::string dir = test::fresh_dir("dp_drift");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["micro_batch"] = 2;
  j["train"]["steps"] = 9;
  j["train"]["checkpoint_every"] = 3;
  const std::string cfg = write_config(dir, j);
  // Each checkpoint write waits 2 s, so the step-3 one is still in flight at step 6.
  const std::string cmd = std::string(kMpiEnv) +
                          "LINAC_TEST_CHECKPOINT_DELAY_MS=2000 timeout 120 mpirun -np 2 --oversubscribe bash -c '"
                          "[ $OMPI_COMM_WORLD_RANK = 1 ] && export LINAC_TEST_DRIFT_AT_STEP=6; exec " +
                          bin_ + " train " + cfg + "'";
  std::string out;
  EXPECT_EQ(run_shell(cmd, out), kExitDiverged) << out;
  EXPECT_NE(out.find("training diverged at step 6: rank 1's parameters differ from rank 0's"), std::string::npos)
      << out;
  EXPECT_NE(out.find("the last checkpoint where the ranks agreed is " + test::checkpoint_at(dir + "/run", 3)),
            std::string::npos)
      << out;
  EXPECT_EQ(test::latest_checkpoint_path(dir + "/run"), test::checkpoint_at(dir + "/run", 3)) << out;
  EXPECT_FALSE(fs::exists(test::checkpoint_at(dir + "/run", 6))) << out;
}

TEST_F(Dist, KilledRankEndsTheJob) {
  const std::string dir = test::fresh_dir("dp_kill");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["micro_batch"] = 2;
  j["train"]["steps"] = 100000;  // far longer than the test waits
  j["train"]["checkpoint_every"] = 0;
  j["train"]["eval_every"] = 0;
  const std::string cfg = write_config(dir, j);
  // Rank 1 is SIGKILLed after 3 s (the shell execs into linac, so $$ is linac's pid).
  const std::string cmd = std::string(kMpiEnv) + "timeout 120 mpirun -np 2 --oversubscribe bash -c '" +
                          "[ $OMPI_COMM_WORLD_RANK = 1 ] && (sleep 3; kill -9 $$) & exec " + bin_ + " train " + cfg + "'";
  std::string out;
  expect_failed_job(run_shell(cmd, out), out);
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
}

// Rank 0 holds the run directory's lock for the job: a job into a directory another run holds
// ends on every rank with exit 2 and the holder named, and trains nothing there; once it is free
// the same job runs.
TEST_F(Dist, AJobIntoAHeldDirectoryIsRefused) {
  const std::string dir = test::fresh_dir("dp_lock");
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["steps"] = 2;
  const std::string cfg = write_config(dir, j);
  std::string out;
  {
    const RunLock held(dir + "/run", "train.out_dir");
    EXPECT_EQ(run_shell(mpirun(2, "train " + cfg), out), 2) << out;
    EXPECT_NE(out.find("is in use by another training run (pid " + std::to_string(::getpid())), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << out;
  }
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  EXPECT_FALSE(test::latest_checkpoint_path(dir + "/run").empty());
}

// The commands that run as one process refuse an mpirun job of more ranks (each rank would do the
// whole work, and prepare's or export's ranks would race on one output) and write nothing;
// with one rank they run.
TEST_F(Dist, OneProcessCommandsRefuseAJobOfTwoRanks) {
  const std::string dir = test::fresh_dir("dp_single");
  const std::string ckpt = test::tiny_checkpoint("dp_single_run", 2);
  const std::pair<std::string, std::string> cases[] = {
      {"eval --checkpoint " + ckpt + " --split val", "linac eval"},
      {"info " + ckpt, "linac info"},
      {"generate --checkpoint " + ckpt + " --prompt-ids 1,2 --max-new-tokens 2", "linac generate"},
      {"export --checkpoint " + ckpt + " --out " + dir + "/out", "linac export"},
      {"bench --generate " + ckpt + " --batch 1 --prompt-len 4 --gen-len 2", "linac bench --generate"},
      {"bench --op rmsnorm", "linac bench --op"},
  };
  for (const auto& [args, who] : cases) {
    std::string out;
    EXPECT_EQ(run_shell(mpirun(2, args), out), 2) << args << ": " << out;
    EXPECT_NE(out.find(who + " runs as one process, but the launcher started 2: run it without mpirun"),
              std::string::npos)
        << args << ": " << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/out"));
  std::string out;
  EXPECT_EQ(run_shell(mpirun(1, "export --checkpoint " + ckpt + " --out " + dir + "/out"), out), 0) << out;
  EXPECT_TRUE(fs::exists(dir + "/out/model.safetensors")) << out;
}

}  // namespace
}  // namespace linac::test_dist
