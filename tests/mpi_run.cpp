#include "mpi_run.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "train_fixture.h"

namespace linac::test {

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

namespace {
std::string ompi_base() { return "/tmp/linac_ompi_" + std::to_string(getpid()); }
// Removes the base, empty once OpenMPI has cleaned up after its jobs, when the test process ends.
const struct RemoveOmpiBase {
  ~RemoveOmpiBase() { rmdir(ompi_base().c_str()); }
} remove_ompi_base;
}  // namespace

const std::string kMpiEnv = "mkdir -p " + ompi_base() + " && OMPI_MCA_orte_tmpdir_base=" + ompi_base() +
                            " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1"
                            " OMP_WAIT_POLICY=passive ";

int run_shell(const std::string& cmd, std::string& out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out.clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string write_config(const std::string& dir, const json& j) {
  const std::string path = dir + "/cfg.json";
  std::ofstream(path) << j.dump(2);
  return path;
}

std::map<int64_t, std::pair<double, double>> logged_steps(const std::string& out_dir) {
  std::map<int64_t, std::pair<double, double>> out;
  std::ifstream f(out_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    if (j.contains("loss") && j.contains("grad_norm"))
      out[j["step"].get<int64_t>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
  }
  return out;
}

double worst_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1e-3, std::fabs(static_cast<double>(b[i]))));
  return worst;
}

void MpiTest::SetUp() {
  if (!have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  bin_ = std::getenv("LINAC_BIN");
}

std::string MpiTest::mpirun(int np, const std::string& args) const {
  return std::string(kMpiEnv) + "timeout 300 mpirun -np " + std::to_string(np) + " --oversubscribe " + bin_ + " " + args;
}

std::string MpiTest::mpirun_rank1(const std::string& args, const std::string& rank1, const std::string& rank0) const {
  return std::string(kMpiEnv) + "timeout 120 mpirun -np 2 --oversubscribe bash -c '" + bin_ + " " + args +
         " $( [ $OMPI_COMM_WORLD_RANK = 1 ] && echo " + rank1 + " || echo " + rank0 + " )'";
}

}  // namespace linac::test
