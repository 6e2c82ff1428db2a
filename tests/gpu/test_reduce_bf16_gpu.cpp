// Gradients reduced in bf16 over NCCL on 2 GPUs (train.reduce_dtype, bf16 compute): with two ranks
// every element is one rounding of the sum of the two ranks' bf16 values, whatever reduces it, so
// ZeRO-1 (a reduce per bucket owner, overlapped or not) and ZeRO-2 with one micro-batch per step
// equal plain data parallelism bit for bit, and so does NCCL's network transport
// (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, the links issue 48 measures). Close to the f32
// reduction, not equal to it. Needs 2 GPUs and mpirun.
#include "mpi_run.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace linac::test_reduce_bf16_gpu {
namespace {

std::vector<double> doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST(ReduceBf16Gpu, ZeroAndNetworkTransportEqualPlainBitForBitCloseToF32) {
  LINAC_SKIP_WITHOUT_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  if (!test::have_linac_binary() || !test::have_mpirun()) GTEST_SKIP() << "needs the linac binary and mpirun";
  const std::string dir = test::fresh_dir("reduce_bf16_gpu");
  json j = test::two_gpu_train_config(dir + "/f32");
  const std::string cfg = test::write_config(dir, j);
  // `net`: through NCCL's network transport, as between hosts.
  auto train = [&](const std::string& name, bool net, const std::string& sets) {
    const std::string env = net ? "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 " : "";
    const std::string pass = net ? "-x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE " : "";
    std::string out;
    EXPECT_EQ(test::run_shell(std::string(test::kMpiEnv) + "NCCL_NVLS_ENABLE=0 " + env + "timeout 300 mpirun -np 2 " +
                                  pass + std::getenv("LINAC_BIN") + " train " + cfg + " --set train.out_dir=" + dir +
                                  "/" + name + sets,
                              out),
              0)
        << out;
    EXPECT_NE(out.find("via nccl"), std::string::npos) << out;
  };
  auto read = [&](const std::string& name, const char* group) {
    return test::read_all_f32(test::checkpoint_at(dir + "/" + name, 6), group);
  };
  const std::string bf16 = " --set train.reduce_dtype=bf16";
  train("f32", false, "");
  train("bf16", false, bf16);
  train("bf16_net", true, bf16);
  for (const char* overlap : {"true", "false"})
    train(std::string("zero1_") + overlap, false, bf16 + " --set train.zero=1 --set train.overlap_comm=" + overlap);
  train("bf16_one", false, bf16 + " --set train.micro_batch=4");
  train("zero2_one", false, bf16 + " --set train.micro_batch=4 --set train.zero=2");
  for (const char* g : {"params", "optim/m", "optim/v"}) {
    SCOPED_TRACE(g);
    EXPECT_EQ(read("bf16_net", g), read("bf16", g)) << "network transport";
    EXPECT_EQ(read("zero1_true", g), read("bf16", g)) << "ZeRO-1, overlapped";
    EXPECT_EQ(read("zero1_false", g), read("bf16", g)) << "ZeRO-1, not overlapped";
    EXPECT_EQ(read("zero2_one", g), read("bf16_one", g)) << "ZeRO-2";
  }
  EXPECT_NE(read("bf16", "params"), read("f32", "params"));
  EXPECT_LT(test::rel_error(doubles(read("bf16", "params")), doubles(read("f32", "params"))), 1e-2) << "bf16 tolerance";
  const auto f32 = test::logged_steps(dir + "/f32"), bf = test::logged_steps(dir + "/bf16");
  ASSERT_EQ(bf.size(), f32.size());
  for (const auto& [step, ref] : f32)
    EXPECT_NEAR(bf.at(step).first, ref.first, 1e-2 * ref.first) << "loss, step " << step;
}

}  // namespace
}  // namespace linac::test_reduce_bf16_gpu
