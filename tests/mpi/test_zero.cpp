// ZeRO-1/2 and resume across world sizes on 2 CPU ranks (`mpirun -np 2`): ZeRO-1 trains exactly
// like plain data parallelism (bit for bit without clipping; losses and gradient norms within
// 1e-12 with it, the norm then being summed from shards) and like one process; ZeRO-2, which sums
// each micro-batch over the ranks into the owners' accumulators, bit for bit with one micro-batch
// per step and within 1e-12 with two; the checkpoints hold whole tensors, so a run continues on
// another number of ranks, with ZeRO on or off, with the same data order (2 -> 1 -> 2 ranks
// equals 2 ranks throughout).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/model.h"
#include "mpi_run.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_zero {
namespace {

using test::run_shell;
using test::write_config;
using Zero = test::MpiTest;

json fp64_config(const std::string& out_dir, double grad_clip) {
  json j = test::tiny_train_config(out_dir);
  j["train"]["precision"] = "fp64";
  j["train"]["micro_batch"] = 2;  // 2 ranks x 2 sequences x 2 micro-batches x 32 tokens = 256
  j["train"]["grad_clip"] = grad_clip;
  j["train"]["bucket_mb"] = 0.02;  // several buckets, some of them split between the two shards
  return j;
}

// Logged losses within loss_tol and gradient norms within norm_tol (relative), step by step.
void expect_logs_close(const std::string& a_dir, const std::string& b_dir, double loss_tol, double norm_tol,
                       const std::string& what) {
  const auto a = test::logged_steps(a_dir), b = test::logged_steps(b_dir);
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (const auto& [step, ref] : b) {
    ASSERT_TRUE(a.count(step)) << what << ": step " << step;
    EXPECT_NEAR(a.at(step).first, ref.first, loss_tol * std::fabs(ref.first)) << what << ": loss at step " << step;
    EXPECT_NEAR(a.at(step).second, ref.second, norm_tol * std::fabs(ref.second)) << what << ": grad norm at step " << step;
  }
}

TEST_F(Zero, EqualsPlainDataParallelBitForBitWithoutClipping) {
  const std::string dir = test::fresh_dir("zero_plain");
  const std::string cfg = write_config(dir, fp64_config(dir + "/plain", 0.0));
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.zero=1 --set train.out_dir=" + dir + "/zero"), out), 0)
      << out;
  EXPECT_NE(out.find("with ZeRO-1"), std::string::npos) << out;
  for (const char* g : {"params", "optim/m", "optim/v"})
    EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/zero", 6), g), test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), g))
        << g;
  // Identical weights give identical losses; the norm is summed from shards, so it agrees to rounding.
  expect_logs_close(dir + "/zero", dir + "/plain", 0.0, 1e-12, "ZeRO-1 vs plain");
  // Overlapped (buckets reduced during the backward) and not: the same sums.
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.zero=1 --set train.overlap_comm=false --set train.out_dir=" +
                                    dir + "/zero_flat"),
                      out),
            0)
      << out;
  EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/zero_flat", 6), "params"),
            test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), "params"));
}

TEST_F(Zero, ClippedNormFromShardsMatchesPlainAndOneProcess) {
  const std::string dir = test::fresh_dir("zero_clip");
  const std::string cfg = write_config(dir, fp64_config(dir + "/plain", 0.05));  // every step clips
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.zero=1 --set train.out_dir=" + dir + "/zero"), out), 0)
      << out;
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + dir + "/one", out), 0)
      << out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.zero=2 --set train.out_dir=" + dir + "/zero2"), out), 0)
      << out;
  for (const auto& [step, v] : test::logged_steps(dir + "/plain")) EXPECT_GT(v.second, 0.05) << "step " << step << " clips";
  for (const char* zero : {"zero", "zero2"}) {
    SCOPED_TRACE(zero);
    expect_logs_close(dir + "/" + zero, dir + "/plain", 1e-12, 1e-12, "ZeRO vs plain");
    expect_logs_close(dir + "/" + zero, dir + "/one", 1e-12, 1e-12, "ZeRO vs one process");
    for (const char* g : {"params", "optim/m", "optim/v"}) {
      const auto z = test::read_all_f32(test::checkpoint_at(dir + "/" + zero, 6), g);
      EXPECT_LT(test::worst_rel_diff(z, test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), g)), 1e-6) << g;
      EXPECT_LT(test::worst_rel_diff(z, test::read_all_f32(test::checkpoint_at(dir + "/one", 6), g)), 1e-6) << g;
    }
  }
}

// ZeRO-2 with the LM head untied (its gradient group staged too), overlapped or not, two micro-batches
// per step and one: the same training as plain data parallelism.
TEST_F(Zero, Zero2EqualsPlainDataParallel) {
  const std::string dir = test::fresh_dir("zero2_plain");
  json j = fp64_config(dir + "/plain", 0.0);
  j["model"]["tie_embeddings"] = false;
  const std::string cfg = write_config(dir, j);
  std::string out;
  for (const char* micro : {"2", "4"}) {
    SCOPED_TRACE(std::string("micro_batch ") + micro);
    const std::string plain = dir + "/plain_" + micro, set = " --set train.micro_batch=" + std::string(micro);
    ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + set + " --set train.out_dir=" + plain), out), 0) << out;
    for (const char* overlap : {"true", "false"}) {
      SCOPED_TRACE(std::string("overlap_comm ") + overlap);
      const std::string zero = dir + "/zero2_" + micro + "_" + overlap;
      ASSERT_EQ(run_shell(mpirun(2, "train " + cfg + set + " --set train.zero=2 --set train.overlap_comm=" + overlap +
                                        " --set train.out_dir=" + zero),
                          out),
                0)
          << out;
      EXPECT_NE(out.find("with ZeRO-2"), std::string::npos) << out;
      // One micro-batch: every element is the same sum of two ranks' gradients. Two: the first
      // micro-batch is summed over the ranks before the second is added, a different rounding.
      const bool exact = std::string(micro) == "4";
      expect_logs_close(zero, plain, exact ? 0.0 : 1e-12, 1e-12, "ZeRO-2 vs plain");
      for (const char* g : {"params", "optim/m", "optim/v"}) {
        const auto z = test::read_all_f32(test::checkpoint_at(zero, 6), g),
                   p = test::read_all_f32(test::checkpoint_at(plain, 6), g);
        if (exact)
          EXPECT_EQ(z, p) << g;
        else
          EXPECT_LT(test::worst_rel_diff(z, p), 1e-6) << g;
      }
    }
  }
  // `bench` counts the staged groups (the head's and the two blocks') with the buckets; the head's
  // and block 1's wait for block 0's comm window.
  ASSERT_EQ(run_shell(mpirun(2, "bench " + cfg + " --set train.zero=2 --steps 1 --warmup 0 --json"), out), 0) << out;
  const json r = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(r["gradient_groups"], 3) << out;
  EXPECT_EQ(r["bucket_starts"]["windows"].get<int64_t>() + r["bucket_starts"]["ready"].get<int64_t>() +
                r["bucket_starts"]["after_backward"].get<int64_t>(),
            r["buckets"].get<int64_t>())
      << out;
  EXPECT_GE(r["bucket_starts"]["windows"].get<int64_t>(), 2) << out;
}

// Keeps only the checkpoints up to `step` and points `latest` at it, as if the run had stopped there.
void roll_back(const std::string& out_dir, int64_t step, int64_t last) {
  for (int64_t s = step + 3; s <= last; s += 3) fs::remove_all(test::checkpoint_at(out_dir, s));
  publish_checkpoint(out_dir, test::checkpoint_at(out_dir, step), 5);
}

// 9 steps on 2 ranks straight vs 3 on 2 ranks, 3 on one process, 3 on 2 ranks with train.zero =
// zero_after (train.zero = zero otherwise): the same batches in the same steps, so losses agree to rounding and the
// final loader state and tokens seen are identical. fp32, whose checkpoints hold the run's exact state; the world size
// regroups the gradient sums, so results agree to f32 rounding (a batch out of place would move the losses by ~1e-2).
void check_two_one_two(const std::string& bin_cmd_2, int zero, int zero_after, const std::string& name) {
  const std::string dir = test::fresh_dir(name);
  json j = fp64_config(dir + "/straight", 1.0);
  j["train"]["precision"] = "fp32";
  j["train"]["steps"] = 9;
  j["train"]["zero"] = zero;  // ZeRO-2 groups its sums differently: the straight run sums like the segments
  const std::string cfg = write_config(dir, j);
  const std::string moved = dir + "/moved";
  std::string out;
  ASSERT_EQ(run_shell(bin_cmd_2 + "train " + cfg, out), 0) << out;
  ASSERT_EQ(run_shell(bin_cmd_2 + "train " + cfg + " --set train.out_dir=" + moved, out), 0) << out;
  roll_back(moved, 3, 9);
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.micro_batch=4 --set train.out_dir=" + moved + " --resume auto", out),
            0)
      << out;
  EXPECT_NE(out.find("written by 2 rank(s), continued on 1: same data order"), std::string::npos) << out;
  roll_back(moved, 6, 9);
  ASSERT_EQ(run_shell(bin_cmd_2 + "train " + cfg + " --set train.zero=" + std::to_string(zero_after) +
                          " --set train.out_dir=" + moved + " --resume auto",
                      out),
            0)
      << out;
  EXPECT_NE(out.find("written by 1 rank(s), continued on 2"), std::string::npos) << out;
  expect_logs_close(moved, dir + "/straight", 1e-5, 1e-5, "2 -> 1 -> 2 ranks vs 2 ranks");
  const CheckpointData a = CheckpointReader(test::checkpoint_at(moved, 9)).data();
  const CheckpointData b = CheckpointReader(test::checkpoint_at(dir + "/straight", 9)).data();
  EXPECT_EQ(a.state.loader, b.state.loader);
  EXPECT_EQ(a.state.tokens_seen, b.state.tokens_seen);
  EXPECT_EQ(a.state.updates, b.state.updates);
  for (const char* g : {"params", "optim/m", "optim/v"})
    EXPECT_LT(test::worst_rel_diff(test::read_all_f32(test::checkpoint_at(moved, 9), g),
                                   test::read_all_f32(test::checkpoint_at(dir + "/straight", 9), g)),
              1e-4)
        << g;
}

TEST_F(Zero, ResumeTwoOneTwoRanksWithZero) { check_two_one_two(mpirun(2, ""), 1, 0, "zero_212"); }
TEST_F(Zero, ResumeTwoOneTwoRanksWithoutZero) { check_two_one_two(mpirun(2, ""), 0, 1, "plain_212"); }
TEST_F(Zero, ResumeTwoOneTwoRanksWithZero2) { check_two_one_two(mpirun(2, ""), 2, 2, "zero2_212"); }

// Loader states that differ between ranks (not written by this loader) cannot continue exactly.
TEST_F(Zero, ResumeRefusesLoaderStatesThatDisagree) {
  const std::string dir = test::fresh_dir("zero_bad_loader");
  const json j = fp64_config(dir + "/run", 1.0);
  const std::string cfg = write_config(dir, j);
  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "train " + cfg), out), 0) << out;
  const std::string path = test::checkpoint_at(dir + "/run", 6);
  CheckpointReader r(path);
  CheckpointData d = r.data();
  d.state.loader[1][3] += 2;
  const Config c = Config::from_json(d.config, path);
  Model model(c.model, Ctx{}, {.precision = "fp64", .with_optimizer = true});
  r.load_params(model.params(), true);
  const std::string forged = dir + "/forged.h5";
  save_checkpoint(forged, model.params(), d);
  EXPECT_EQ(test::run_linac("train " + cfg + " --set train.steps=9 --set train.micro_batch=4 --set train.out_dir=" + dir +
                                "/next --resume " + forged,
                            out),
            2);
  EXPECT_NE(out.find("data loader states of ranks 0 and 1 differ"), std::string::npos) << out;
}

}  // namespace
}  // namespace linac::test_zero
