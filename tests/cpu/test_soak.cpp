// Soak: `linac train` killed at 20 random moments (SIGKILL; every fourth a SIGTERM, which
// checkpoints and stops) and resumed each time with --resume auto must end with the same
// checkpoint, bit for bit, as a run that was never interrupted.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>

#include "core/rng.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace linac::test_soak {
namespace {

constexpr int64_t kSteps = 60;

// The step of the checkpoint ckpt/latest names (0 when there is none yet).
int64_t latest_step(const std::string& out_dir) {
  std::ifstream f(out_dir + "/ckpt/latest");
  std::string name;
  std::getline(f, name);
  return name.size() > 5 ? std::atoll(name.c_str() + 5) : 0;
}

// Starts `linac train cfg --resume auto` with its output appended to `log`.
pid_t start_training(const std::string& cfg, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    const char* bin = std::getenv("LINAC_BIN");
    execl(bin, bin, "train", cfg.c_str(), "--resume", "auto", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string write_config(const std::string& dir) {
  json j = test::tiny_train_config(dir + "/run");
  j["train"]["steps"] = kSteps;
  j["train"]["checkpoint_every"] = 2;
  j["train"]["keep_last"] = 3;
  j["train"]["eval_every"] = 0;
  const std::string path = dir + "/cfg.json";
  std::ofstream(path) << j.dump(2);
  return path;
}

// Everything a checkpoint holds, with the run directory taken out of its config.
std::vector<std::string> contents_without_out_dir(const std::string& path) {
  std::vector<std::string> c = test::checkpoint_contents(path);
  json cfg = json::parse(c[0]);
  cfg["train"].erase("out_dir");
  c[0] = cfg.dump();
  return c;
}

TEST(Soak, KilledAndResumedTrainingEndsBitIdentical) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ref = test::fresh_dir("soak_ref"), soak = test::fresh_dir("soak");
  const std::string ref_cfg = write_config(ref), soak_cfg = write_config(soak);

  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  waitpid(start_training(ref_cfg, ref + "/out.txt"), &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "reference run failed, see " << ref << "/out.txt";
  const auto t1 = std::chrono::steady_clock::now();
  waitpid(start_training(ref_cfg, ref + "/out.txt"), &st, 0);  // nothing left to train: start-up only
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "reference resume failed, see " << ref << "/out.txt";
  const auto us = [](auto d) { return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(d).count()); };
  const double startup_us = us(std::chrono::steady_clock::now() - t1), train_us = std::max(1.0, us(t1 - t0) - startup_us);

  Rng rng{99, 1, 0};
  int killed = 0;
  for (int k = 0; k < 20; ++k) {
    const pid_t pid = start_training(soak_cfg, soak + "/out.txt");
    // Kill during start-up or within twice this attempt's share of the remaining training, so the
    // kills spread over the whole run.
    const double remaining = static_cast<double>(kSteps - latest_step(soak + "/run")) / kSteps;
    const double window = startup_us + train_us * remaining * 2 / (20 - k);
    usleep(static_cast<useconds_t>(rng.below(static_cast<uint64_t>(window) + 1)));
    kill(pid, k % 4 == 3 ? SIGTERM : SIGKILL);
    waitpid(pid, &st, 0);
    killed += WIFSIGNALED(st);
    ASSERT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << "run " << k << " failed, see " << soak << "/out.txt";
  }
  EXPECT_GT(killed, 5) << "most runs should have been killed mid-way";
  waitpid(start_training(soak_cfg, soak + "/out.txt"), &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "final resume failed, see " << soak << "/out.txt";
  EXPECT_TRUE(contents_without_out_dir(checkpoint_path(ref + "/run", kSteps)) ==
              contents_without_out_dir(checkpoint_path(soak + "/run", kSteps)))
      << "the interrupted run ended with different parameters, moments or state";
}

}  // namespace
}  // namespace linac::test_soak
