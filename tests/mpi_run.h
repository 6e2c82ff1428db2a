// Running the linac binary under `mpirun -np N` (CPU ranks, or one GPU per rank), for the data-
// parallel tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace linac::test {

bool have_mpirun();
// The environment of a test's mpirun, a shell prefix: OpenMPI refuses root without the first two
// (CI runs as root); one OpenMP thread per rank; and OpenMPI's session directories under a base of
// this test process's own, since tests run in parallel and one job's cleanup of the shared
// /tmp/ompi.<host>.<uid> could remove it while another job's mpirun was creating its directory there.
extern const std::string kMpiEnv;
// Runs a shell command; returns its exit status (128 + signal when killed), stdout+stderr in out.
int run_shell(const std::string& cmd, std::string& out);
// Writes j as dir/cfg.json and returns the path.
std::string write_config(const std::string& dir, const json& j);
// step -> loss and grad_norm of the last line logged for that step in out_dir/metrics.jsonl
// (a resumed run appends to the file, so later lines replace earlier ones).
std::map<int64_t, std::pair<double, double>> logged_steps(const std::string& out_dir);

// max_i |a_i - b_i| / max(1e-3, |b_i|) (sizes must agree).
double worst_rel_diff(const std::vector<float>& a, const std::vector<float>& b);

// Skips without the linac binary or mpirun; mpirun(np, args) is the command line of a job.
class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override;
  std::string mpirun(int np, const std::string& args) const;
  // A 2-rank job whose rank 1 runs `args rank1` and rank 0 `args rank0` (a shell per rank; 120 s,
  // for jobs that must end by themselves).
  std::string mpirun_rank1(const std::string& args, const std::string& rank1, const std::string& rank0 = "") const;
  std::string bin_;
};

}  // namespace linac::test
