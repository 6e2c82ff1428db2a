// ZeRO-1 over NCCL on 2 GPUs (bf16): the same updates as plain data parallelism, bit for bit
// without clipping, with the reductions overlapped (a reduce per bucket owner on the
// high-priority stream) or not (one reduce-scatter); its checkpoint continues on one GPU with
// the same data order. ZeRO-2 (gradients staged per block and reduced to their owners in every
// micro-batch): bit for bit with one micro-batch per step, overlapped or not, and with two (the
// accumulators copied into the slots, micro-batches summed over the ranks one at a time) within
// bf16 rounding. Needs 2 GPUs and mpirun.
#include <filesystem>

#include "mpi_run.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace linac::test_zero_gpu {
namespace {

TEST(ZeroGpu, TwoGpusEqualPlainDataParallelAndResumeOnOne) {
  LINAC_SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  if (!test::have_linac_binary() || !test::have_mpirun()) GTEST_SKIP() << "needs the linac binary and mpirun";
  const std::string dir = test::fresh_dir("zero_gpu");
  json j = test::two_gpu_train_config(dir + "/plain");
  const std::string cfg = test::write_config(dir, j);
  const std::string mpirun = std::string(test::kMpiEnv) + "NCCL_NVLS_ENABLE=0 timeout 300 mpirun -np 2 " +
                             std::getenv("LINAC_BIN") + " train " + cfg;
  std::string out;
  ASSERT_EQ(test::run_shell(mpirun, out), 0) << out;
  for (const char* overlap : {"true", "false"}) {
    SCOPED_TRACE(std::string("overlap_comm ") + overlap);
    const std::string zero_dir = dir + "/zero_" + overlap;
    ASSERT_EQ(test::run_shell(mpirun + " --set train.zero=1 --set train.overlap_comm=" + overlap +
                                  " --set train.out_dir=" + zero_dir,
                              out),
              0)
        << out;
    EXPECT_NE(out.find("via nccl with ZeRO-1"), std::string::npos) << out;
    for (const char* g : {"params", "optim/m", "optim/v"})
      EXPECT_EQ(test::read_all_f32(test::checkpoint_at(zero_dir, 6), g), test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), g))
          << g;
  }
  const std::string one_micro = " --set train.micro_batch=4 --set train.out_dir=" + dir + "/plain_one";
  ASSERT_EQ(test::run_shell(mpirun + one_micro, out), 0) << out;
  for (const char* overlap : {"true", "false"}) {
    SCOPED_TRACE(std::string("ZeRO-2, overlap_comm ") + overlap);
    const std::string zero_dir = dir + "/zero2_" + overlap;
    ASSERT_EQ(test::run_shell(mpirun + " --set train.micro_batch=4 --set train.zero=2 --set train.overlap_comm=" +
                                  overlap + " --set train.out_dir=" + zero_dir,
                              out),
              0)
        << out;
    EXPECT_NE(out.find("via nccl with ZeRO-2"), std::string::npos) << out;
    for (const char* g : {"params", "optim/m", "optim/v"})
      EXPECT_EQ(test::read_all_f32(test::checkpoint_at(zero_dir, 6), g),
                test::read_all_f32(test::checkpoint_at(dir + "/plain_one", 6), g))
          << g;
  }
  const std::string two_micro = dir + "/zero2_two_micro";
  ASSERT_EQ(test::run_shell(mpirun + " --set train.zero=2 --set train.out_dir=" + two_micro, out), 0) << out;
  for (const char* g : {"params", "optim/m"}) {
    const auto z = test::read_all_f32(test::checkpoint_at(two_micro, 6), g);
    const auto p = test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), g);
    EXPECT_LT(test::rel_error(std::vector<double>(z.begin(), z.end()), std::vector<double>(p.begin(), p.end())), 1e-2)
        << g << ": bf16 tolerance";
  }
  // The ZeRO-1 checkpoint at step 3 continues on one GPU (two micro-batches of 2 per step).
  const std::string moved = dir + "/zero_true";
  std::filesystem::remove_all(test::checkpoint_at(moved, 6));
  publish_checkpoint(moved, test::checkpoint_at(moved, 3), 5);
  ASSERT_EQ(test::run_linac("train " + cfg + " --set train.out_dir=" + moved + " --resume auto", out), 0) << out;
  EXPECT_NE(out.find("written by 2 rank(s), continued on 1: same data order"), std::string::npos) << out;
  // A loader row per rank that wrote the checkpoint, the same on every rank (it counts global
  // samples): the one-GPU continuation's row is each of the two-GPU run's.
  const auto moved_rows = CheckpointReader(test::checkpoint_at(moved, 6)).data().state.loader;
  const auto plain_rows = CheckpointReader(test::checkpoint_at(dir + "/plain", 6)).data().state.loader;
  ASSERT_EQ(moved_rows.size(), 1u);
  ASSERT_EQ(plain_rows.size(), 2u);
  for (const auto& row : plain_rows) EXPECT_EQ(moved_rows[0], row);
  const auto a = test::read_all_f32(test::checkpoint_at(moved, 6), "params");
  const auto b = test::read_all_f32(test::checkpoint_at(dir + "/plain", 6), "params");
  EXPECT_LT(test::rel_error(std::vector<double>(a.begin(), a.end()), std::vector<double>(b.begin(), b.end())), 1e-2)
      << "bf16 tolerance";
}

}  // namespace
}  // namespace linac::test_zero_gpu
