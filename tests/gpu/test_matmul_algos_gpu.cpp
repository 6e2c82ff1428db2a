// GEMM algorithm tuning and tables on the GPU (matmul/matmul_algos.h, train/gemm_algo_table.h):
// every candidate a tuning round runs computes the product (against the CPU reference in
// double); the choices name each tuned problem with the calls it made and are what the plans run
// afterwards; an algorithm cuBLASLt refuses and a table from another cuBLASLt are one UserError
// each; `linac bench --tune-gemms` writes a table that covers the problems it tuned and that
// training then runs with, bit for bit on rerun and resume.
#include <algorithm>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "matmul/matmul.h"
#include "matmul/matmul_algos.h"
#include "test_util.h"
#include "train/gemm_algo_table.h"
#include "train_fixture.h"

namespace linac::test_matmul_algos_gpu {
namespace {

// One problem: bf16 or f32 operands on the GPU, the reference product in double.
struct Problem {
  int64_t batch, m, n, k;
  bool ta, tb;
  DType ab, c;
  OwnedTensor a, b, out, want;
};

Problem make_problem(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType ab, DType c,
                     uint64_t seed) {
  Problem p{batch, m, n, k, ta, tb, ab, c, {}, {}, {}, {}};
  auto dims = [&](int64_t r, int64_t cols) {
    return batch > 0 ? std::vector<int64_t>{batch, r, cols} : std::vector<int64_t>{r, cols};
  };
  p.a = to(test::random_tensor(dims(ta ? k : m, ta ? m : k), DType::F64, seed), Device::CUDA, ab);
  p.b = to(test::random_tensor(dims(tb ? n : k, tb ? k : n), DType::F64, seed + 1), Device::CUDA, ab);
  p.out = OwnedTensor(c, Device::CUDA, dims(m, n));
  const OwnedTensor a64 = to(p.a, Device::CPU, DType::F64), b64 = to(p.b, Device::CPU, DType::F64);
  p.want = OwnedTensor(DType::F64, Device::CPU, dims(m, n));
  if (batch > 0)
    matmul_batched(Ctx{}, a64, ta, b64, tb, p.want);
  else
    matmul(Ctx{}, a64, ta, b64, tb, p.want);
  return p;
}

void run(const Ctx& ctx, Problem& p) {
  test::poison(p.out);
  if (p.batch > 0)
    matmul_batched(ctx, p.a, p.ta, p.b, p.tb, p.out);
  else
    matmul(ctx, p.a, p.ta, p.b, p.tb, p.out);
}

double rel_error(Problem& p) { return test::rel_error(to_doubles(p.out), to_doubles(p.want)); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

TEST(MatmulAlgosGpu, TuningRunsEveryCandidateCorrectlyAndInstallsTheChoice) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  std::vector<Problem> ps;
  ps.push_back(make_problem(0, 97, 131, 513, false, true, DType::BF16, DType::BF16, 10));
  ps.push_back(make_problem(3, 50, 70, 64, true, false, DType::BF16, DType::F32, 20));
  ps.push_back(make_problem(0, 33, 40, 300, false, false, DType::F32, DType::F32, 30));
  const double tol[] = {1e-2, 1e-4, 1e-5};
  const std::string names[] = {"M=97 N=131 K=513 batch=1 trans_a=0 trans_b=1 A/B bf16 C bf16",
                               "M=50 N=70 K=64 batch=3 trans_a=1 trans_b=0 A/B bf16 C f32",
                               "M=33 N=40 K=300 batch=1 trans_a=0 trans_b=0 A/B f32 C f32"};
  constexpr int kMost = kGemmTuneCandidates + kGemmTuneScreened;
  constexpr int64_t kRounds = 5 * kMost;  // >= kGemmTuneMinCalls + 1 per candidate
  gemm_tuning_start();
  for (int64_t r = 0; r < kRounds; ++r)
    for (size_t i = 0; i < ps.size(); ++i) {
      run(gctx.ctx(), ps[i]);
      gctx.synchronize();
      ASSERT_LT(rel_error(ps[i]), tol[i]) << names[i] << ", call " << r << " (candidate " << r % kMost << " or fewer)";
    }
  const std::vector<GemmAlgoChoice> choices = gemm_tuning_finish();
  ASSERT_EQ(choices.size(), ps.size()) << "one choice per problem that ran while tuning";
  const std::vector<GemmAlgoChoice> in_use = gemm_algos_in_use();
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto c =
        std::find_if(choices.begin(), choices.end(), [&](const auto& x) { return starts_with(x.problem, names[i]); });
    ASSERT_NE(c, choices.end()) << names[i];
    EXPECT_EQ(c->calls, kRounds);
    EXPECT_GE(c->candidate, 0);
    EXPECT_LT(c->candidate, kMost);
    // The heuristic's first choice at least, and kGemmTuneScreened configurations it does not rank
    // (cuBLASLt accepts hundreds for each of these problems).
    EXPECT_GE(c->candidates, 1 + kGemmTuneScreened) << c->problem;
    EXPECT_LE(c->candidates, kMost) << c->problem;
    EXPECT_GT(c->heuristic_us, 0);
    EXPECT_LE(c->chosen_us, c->heuristic_us);
    if (c->candidate > 0)
      EXPECT_LT(c->chosen_us,
                (c->candidate < kGemmTuneCandidates ? kGemmTuneMargin : kGemmTuneScreenMargin) * c->heuristic_us);
    const auto u = std::find_if(in_use.begin(), in_use.end(), [&](const auto& x) { return x.problem == c->problem; });
    ASSERT_NE(u, in_use.end());
    EXPECT_EQ(u->algo, c->algo) << c->problem << ": the plan does not run the chosen algorithm";
    // After tuning: the chosen algorithm, the product, the same bits call after call.
    run(gctx.ctx(), ps[i]);
    const std::vector<double> first = to_doubles(ps[i].out);
    EXPECT_LT(rel_error(ps[i]), tol[i]);
    run(gctx.ctx(), ps[i]);
    EXPECT_EQ(to_doubles(ps[i].out), first);
  }
  gemm_algos_clear();
}

TEST(MatmulAlgosGpu, RefusedAlgorithmIsAUserErrorNamingTheTable) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  Problem p = make_problem(0, 61, 75, 129, false, false, DType::BF16, DType::BF16, 40);
  run(gctx.ctx(), p);
  const std::vector<GemmAlgoChoice> in_use = gemm_algos_in_use();
  const auto u = std::find_if(in_use.begin(), in_use.end(), [](const auto& x) {
    return starts_with(x.problem, "M=61 N=75 K=129 batch=1 trans_a=0 trans_b=0 A/B bf16 C bf16");
  });
  ASSERT_NE(u, in_use.end());
  GemmAlgoChoice bad = *u;
  bad.algo.fill(~uint64_t{0});
  try {
    gemm_algos_install({bad}, "bad_table.json");
    ADD_FAILURE() << "an algorithm cuBLASLt refuses was installed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_table.json: cuBLASLt refuses the algorithm given for " + u->problem),
              std::string::npos)
        << e.what();
  }
  gemm_algos_clear();
  run(gctx.ctx(), p);
  EXPECT_LT(rel_error(p), 1e-2);
}

TEST(MatmulAlgosGpu, TableFromAnotherCublasLtIsRefused) {
  LINAC_SKIP_WITHOUT_GPU();
  const std::string path = test::fresh_dir("gemm_algos_version") + "/algos.json";
  GemmAlgoTable t{gemm_algo_env(), {}};
  write_gemm_algo_table(path, t);
  EXPECT_NO_THROW(use_gemm_algo_table(path, true));
  t.env.cublaslt_version += 1;
  write_gemm_algo_table(path, t);
  try {
    use_gemm_algo_table(path, true);
    ADD_FAILURE() << "a table from another cuBLASLt version was installed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": made on " + t.env.gpu + " with cuBLASLt " +
                                         std::to_string(t.env.cublaslt_version)),
              std::string::npos)
        << e.what();
  }
  gemm_algos_clear();
}

// The command line end to end: bench tunes the tiny model's GEMMs into a table; training with
// it runs those algorithms and stays bit-identical across a rerun and a resume.
TEST(MatmulAlgosGpu, BenchTunesATableThatTrainingRuns) {
  LINAC_SKIP_WITHOUT_GPU();
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("gemm_algos_bench");
  json cfg = test::tiny_train_config(dir + "/run");
  cfg["train"]["device"] = "cuda";
  cfg["train"]["precision"] = "bf16";
  cfg["model"]["d_model"] = 128;
  std::ofstream(dir + "/cfg.json") << cfg.dump(2);
  const std::string table = dir + "/algos.json";
  std::string out;
  ASSERT_EQ(test::run_linac("bench " + dir + "/cfg.json --steps 2 --tune-steps 40 --tune-gemms " + table, out), 0)
      << out;
  EXPECT_NE(out.find("table written to " + table), std::string::npos) << out;
  EXPECT_NE(out.find("GEMM algorithms from " + table), std::string::npos) << out;
  const GemmAlgoTable t = read_gemm_algo_table(table);
  ASSERT_GE(t.choices.size(), 4u) << out;
  for (const GemmAlgoChoice& c : t.choices) EXPECT_GE(c.calls, 40) << c.problem;
  // The table fits the shapes it was tuned on: a bench that reads it says it names every problem.
  ASSERT_EQ(test::run_linac("bench " + dir + "/cfg.json --steps 2 --set train.gemm_algos=" + table, out), 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(table + " names ([0-9]+) of the ([0-9]+) GEMM problems run so far")))
      << out;
  EXPECT_EQ(m[1].str(), m[2].str()) << out;
  EXPECT_GE(std::stoi(m[1].str()), 4) << out;

  cfg["train"]["gemm_algos"] = table;
  test::check_resume_is_bit_identical(cfg);
  const std::vector<GemmAlgoChoice> in_use = gemm_algos_in_use();
  int64_t matched = 0;
  for (const GemmAlgoChoice& c : t.choices) {
    const auto u = std::find_if(in_use.begin(), in_use.end(), [&](const auto& x) { return x.problem == c.problem; });
    if (u == in_use.end()) continue;
    ++matched;
    EXPECT_EQ(u->algo, c.algo) << c.problem << ": training did not run the table's algorithm";
  }
  EXPECT_GE(matched, static_cast<int64_t>(t.choices.size()) / 2) << "training planned few of the bench's problems";
  gemm_algos_clear();
}

}  // namespace
}  // namespace linac::test_matmul_algos_gpu
