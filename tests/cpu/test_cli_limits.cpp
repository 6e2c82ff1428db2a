// Requests larger than the machine: an allocation it cannot hold is the user's error (one line,
// exit 2), not a bug; a bench step whose batches cannot fit is refused before it is allocated
// piece by piece; eval's --batch never allocates more rows than the split has windows; a --set
// number beyond a double is named as such; a run whose model the host cannot hold exits 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/buffer.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_cli_limits {
namespace {

namespace fs = std::filesystem;

void expect_one_line_error(const std::string& args, const std::string& what) {
  std::string out;
  EXPECT_EQ(test::run_linac(args, out), 2) << args << ": " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find(": error: " + what), std::string::npos) << out;
}

TEST(CliLimits, AnAllocationTheMachineCannotHoldIsAUserError) {
  try {
    const Buffer b(size_t{1} << 62, Device::CPU);  // beyond any address space
    ADD_FAILURE() << "allocated 4 EiB";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("out of host memory: 4294967296.0 GiB more could not be allocated"),
              std::string::npos)
        << e.what();
  }
}

TEST(CliLimits, RequestsBeyondTheMachineAreRefusedInOneLine) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("cli_limits");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  expect_one_line_error("bench " + cfg + " --tokens-per-step 1000000000000 --steps 1 --warmup 0",
                        "--tokens-per-step 1000000000000: the step's token batches alone take 7450.6 GiB");
  expect_one_line_error("info " + cfg + " --set train.lr=1e999", "--set train.lr: 1e999 is a number too large");
}

// A run whose model the process cannot hold (an address space capped by ulimit -v, so that the
// host's allocator really fails mid set-up): one line naming the memory and exit 2, and the
// out_dir it would have made is not left behind.
TEST(CliLimits, ARunTheHostCannotHoldExitsWithOneLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory needs more address space than the cap leaves";
#endif
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("host_oom");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  std::string out;
  const std::string big = " --set model.d_model=4096 --set model.n_heads=32 --set model.n_layers=16";
  EXPECT_EQ(test::run_linac("train " + cfg + big, out, "ulimit -v 3000000;"), 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find(": error: out of host memory: "), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/run")) << out;
  // The tiny model trains under the same cap: what refused the first run was its size.
  EXPECT_EQ(test::run_linac("train " + cfg + " --set train.steps=1", out, "ulimit -v 3000000;"), 0) << out;
}

TEST(CliLimits, EvalBatchBeyondTheWindowsScoresTheSame) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("eval_batch", 1);
  auto eval = [&](const std::string& batch) {
    std::string out;
    EXPECT_EQ(test::run_linac("eval --json --checkpoint " + ckpt + " --batch " + batch, out), 0) << out;
    return json::parse(out.substr(out.find('{')));
  };
  const json few = eval("2"), many = eval("1000000000");  // 1e9 rows of 32 positions would be 256 GB of tokens
  EXPECT_EQ(many["tokens"], few["tokens"]);
  EXPECT_NEAR(many["loss"].get<double>(), few["loss"].get<double>(), 1e-6);  // f32 sums over other batch shapes
}

}  // namespace
}  // namespace linac::test_cli_limits
