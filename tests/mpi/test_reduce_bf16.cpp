// Gradients reduced in bf16 (train.reduce_dtype) on 2 CPU ranks. GradReducer driven by hand on
// each rank, as its buckets and ZeRO-2 groups would be by a backward of two micro-batches (this test
// program re-run as the ranks): every element ends as the bf16 sum NCCL makes of two ranks' values,
// round(round(a) + round(b)), under plain data parallelism and ZeRO-1 (of the accumulated
// gradients) and ZeRO-2 (of each micro-batch's, added in f32), overlapped or not. Then training:
// close to the f32 reduction but not equal to it, and ZeRO-1 and ZeRO-2 bit for bit equal to plain
// data parallelism with the same bf16 sums.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "comm/comm.h"
#include "comm/grad_reducer.h"
#include "model/param_store.h"
#include "mpi_run.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_reduce_bf16 {
namespace {

using test::kMpiEnv;
using test::run_shell;
using test::write_config;

// Runs the current test as 2 MPI ranks of this program; each passes it on its own.
void run_as_two_ranks() {
  if (!test::have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string out;
  const std::string filter = std::string(t->test_suite_name()) + "." + t->name();
  ASSERT_EQ(run_shell(std::string(kMpiEnv) + "timeout 300 mpirun -np 2 --oversubscribe " + self +
                          " --gtest_color=no --gtest_filter=" + filter,
                      out),
            0)
      << out;
  size_t passed = 0;
  for (size_t at = 0; (at = out.find("[  PASSED  ] 1 test.", at)) != std::string::npos; ++at) ++passed;
  EXPECT_EQ(passed, 2u) << out;
}

// Rank r's gradient of element j of parameter id in micro-batch mb: magnitudes over two decades,
// every bit of an f32 significand in use, so rounding to bf16 moves nearly every value.
float grad_value(int rank, int mb, int id, int64_t j) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(j) + 1.3 * id + 0.71 * mb + 2.1 * rank) *
                            std::pow(10.0, -1.0 - static_cast<double>((j + id) % 3)) * (1 + rank));
}

// One backward of two micro-batches on this rank (train.zero `zero`, overlap on or off), then the
// reduced gradients this rank holds against the bf16 reference; true when some element's bf16 sum
// differs from the f32 one.
bool check_bf16_reduction(Comm& comm, int zero, bool overlap) {
  SCOPED_TRACE("zero " + std::to_string(zero) + (overlap ? ", overlapped" : ", not overlapped"));
  const int rank = comm.rank();
  ParamStore ps;
  const int norm = ps.add({"norm", {5}, Init::Ones, 0, false, {}, true});  // replicated
  const int bias = ps.add({"bias", {7}, Init::Zeros, 0, false, {}, true});
  const int a = ps.add({"a", {3, 16}, Init::Normal, 0.02, true});
  const int b = ps.add({"b", {4, 16}, Init::Normal, 0.02, true});
  const int c = ps.add({"c", {5, 13}, Init::Normal, 0.02, true});
  const int d = ps.add({"d", {2, 16}, Init::Normal, 0.02, true});
  const int e = ps.add({"e", {7, 9}, Init::Normal, 0.02, true});
  if (zero > 0) ps.shard(rank, comm.world(), zero == 2);
  ps.allocate(Device::CPU, DType::F32, DType::F32, true);
  const std::vector<std::vector<int>> groups = {{e, bias}, {norm, c, d}, {a, b}};  // backward order
  // 512-byte buckets: one or two parameters each, some of them split between the two shards.
  GradReducer red(ps, comm, Ctx{}, 512, overlap, groups, DType::BF16);
  EXPECT_GE(red.buckets(), zero == 2 ? 1u : 3u);  // under ZeRO-2 they cover the replicated group only

  ps.zero_grad(Ctx{});
  for (int mb = 0; mb < 2; ++mb) {
    red.start_micro_batch(mb == 0, mb == 1);
    for (const auto& ids : groups) {
      red.on_begin(ids);
      for (int id : ids) {
        float* g = ps.grad(id).data<float>();
        for (int64_t j = 0; j < ps.numel(id); ++j) g[j] += grad_value(rank, mb, id, j);
      }
      red.on_ready(ids, true);
    }
    red.window();
  }
  red.finish();

  // What NCCL's bf16 sum of two ranks gives: each rank's value rounded, their sum rounded.
  auto bf16_sum = [](float x, float y) { return round_bf16(round_bf16(x) + round_bf16(y)); };
  const int64_t repl = ps.replicated_numel(), shard = ps.shard_numel();
  const int64_t mine = repl + rank * shard;
  const std::vector<double> acc = zero == 2 ? to_doubles(ps.owned().back().grad) : std::vector<double>();
  const std::vector<double> flat = zero == 2 ? std::vector<double>() : to_doubles(ps.flat_grad());
  bool differs = false;
  int64_t checked = 0;
  for (int id : {norm, bias, a, b, c, d, e}) {
    const std::vector<double> repl_grad = ps.offset(id) < repl ? to_doubles(ps.grad(id)) : std::vector<double>();
    for (int64_t j = 0; j < ps.numel(id); ++j) {
      const int64_t at = ps.offset(id) + j;
      const bool owned = at < repl || zero == 0 || (at >= mine && at < mine + shard);
      if (!owned) continue;  // reduced to the other rank
      float g[2], want, exact;
      for (int r = 0; r < 2; ++r) g[r] = 0.f + grad_value(r, 0, id, j) + grad_value(r, 1, id, j);
      if (zero == 2 && at >= repl) {
        // Each micro-batch's sum, added in f32.
        want = bf16_sum(grad_value(0, 0, id, j), grad_value(1, 0, id, j)) +
               bf16_sum(grad_value(0, 1, id, j), grad_value(1, 1, id, j));
        exact = g[0] + g[1];
        EXPECT_EQ(acc[static_cast<size_t>(at - mine)], want) << ps.spec(id).name << "[" << j << "]";
      } else {
        want = bf16_sum(g[0], g[1]);
        exact = g[0] + g[1];
        const double got = at < repl ? repl_grad[static_cast<size_t>(j)] : flat[static_cast<size_t>(at)];
        EXPECT_EQ(got, want) << ps.spec(id).name << "[" << j << "]";
      }
      differs |= want != exact;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  return differs;
}

TEST(ReduceBf16, BucketsAndGroupsHoldTheBf16SumOfTwoRanks) {
  if (!launched_by_mpi()) {
    run_as_two_ranks();
    return;
  }
  const std::unique_ptr<Comm> comm = Comm::create(Device::CPU);
  ASSERT_EQ(comm->world(), 2);
  for (int zero : {0, 1, 2})
    for (bool overlap : {true, false}) EXPECT_TRUE(check_bf16_reduction(*comm, zero, overlap)) << "f32 sums";
}

using ReduceBf16Train = test::MpiTest;

TEST_F(ReduceBf16Train, CloseToF32AndZeroEqualsPlainBitForBit) {
  const std::string dir = test::fresh_dir("reduce_bf16");
  json j = test::tiny_train_config(dir + "/f32");
  j["train"]["micro_batch"] = 2;  // 2 ranks x 2 sequences x 2 micro-batches x 32 tokens = 256
  j["train"]["grad_clip"] = 0.0;  // the norm is summed from shards under ZeRO: no clipping, equal bits
  const std::string cfg = write_config(dir, j);
  auto train = [&](const std::string& name, const std::string& sets) {
    std::string out;
    EXPECT_EQ(run_shell(mpirun(2, "train " + cfg + " --set train.out_dir=" + dir + "/" + name + sets), out), 0) << out;
    return out;
  };
  const std::string bf16 = " --set train.reduce_dtype=bf16";
  train("f32", "");
  EXPECT_NE(train("bf16", bf16).find("2 rank(s) via mpi, gradients reduced in bf16"), std::string::npos);
  train("zero1", bf16 + " --set train.zero=1");
  // ZeRO-2 sums each micro-batch: equal to plain data parallelism with one micro-batch per step.
  train("bf16_one", bf16 + " --set train.micro_batch=4");
  train("zero2_one", bf16 + " --set train.micro_batch=4 --set train.zero=2");
  auto params = [&](const std::string& name) {
    return test::read_all_f32(test::checkpoint_at(dir + "/" + name, 6), "params");
  };

  const auto f32 = test::logged_steps(dir + "/f32"), bf = test::logged_steps(dir + "/bf16");
  ASSERT_EQ(f32.size(), 6u);
  ASSERT_EQ(bf.size(), f32.size());
  for (const auto& [step, ref] : f32) {
    // The first step's loss precedes any update: the same bits.
    EXPECT_NEAR(bf.at(step).first, ref.first, step == 1 ? 0.0 : 2e-4 * ref.first) << "loss at step " << step;
    EXPECT_NEAR(bf.at(step).second, ref.second, 2e-3 * ref.second) << "grad norm at step " << step;
  }
  const auto a = params("bf16"), b = params("f32");
  EXPECT_NE(a, b);
  EXPECT_LT(test::rel_error(std::vector<double>(a.begin(), a.end()), std::vector<double>(b.begin(), b.end())), 3e-3);
  for (const char* g : {"params", "optim/m", "optim/v"}) {
    EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/zero1", 6), g),
              test::read_all_f32(test::checkpoint_at(dir + "/bf16", 6), g))
        << "ZeRO-1 " << g;
    EXPECT_EQ(test::read_all_f32(test::checkpoint_at(dir + "/zero2_one", 6), g),
              test::read_all_f32(test::checkpoint_at(dir + "/bf16_one", 6), g))
        << "ZeRO-2 " << g;
  }

  std::string out;
  ASSERT_EQ(run_shell(mpirun(2, "bench " + cfg + bf16 + " --steps 1 --warmup 0 --json"), out), 0) << out;
  EXPECT_EQ(json::parse(out.substr(out.find('{')))["reduce_dtype"], "bf16") << out;
}

}  // namespace
}  // namespace linac::test_reduce_bf16
