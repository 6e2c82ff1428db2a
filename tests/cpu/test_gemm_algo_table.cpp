// The GEMM algorithm table's file (train/gemm_algo_table.h): what is written is read back field
// for field; a damaged or foreign file is one UserError naming the file and the field; a failed
// write leaves the file that was there; `linac train` with a table it cannot read exits 2 in one
// line before it creates out_dir; `linac bench`'s tuning options are checked in one line each.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/gpu.h"
#include "core/rng.h"
#include "train/gemm_algo_table.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_gemm_algo_table {
namespace {

GemmAlgoTable random_table(uint64_t seed) {
  Rng rng{seed, 1, 2};
  GemmAlgoTable t;
  t.env = {"NVIDIA Test GPU", 130001 + static_cast<int64_t>(rng.below(100))};
  for (int i = 0; i < 3; ++i) {
    GemmAlgoChoice c;
    c.problem = "M=" + std::to_string(1 + rng.below(5000)) + " N=" + std::to_string(1 + rng.below(5000)) + " K=7";
    for (uint64_t& w : c.algo) w = (static_cast<uint64_t>(rng.below(1u << 31)) << 33) ^ rng.below(1u << 31);
    c.algo[7] = ~uint64_t{0};  // all 64 bits survive the file
    c.candidate = static_cast<int>(rng.below(16));
    c.heuristic_us = 10 + 0.001 * static_cast<double>(rng.below(100000));
    c.chosen_us = c.heuristic_us * 0.9;
    c.calls = 1 + static_cast<int64_t>(rng.below(1000));
    c.candidates = 1 + static_cast<int>(rng.below(16));
    t.choices.push_back(c);
  }
  return t;
}

std::string error_of(const std::string& path) {
  try {
    read_gemm_algo_table(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(GemmAlgoTable, WrittenIsReadBack) {
  const std::string path = test::fresh_dir("gemm_algo_table") + "/algos.json";
  const GemmAlgoTable t = random_table(7);
  write_gemm_algo_table(path, t);
  const GemmAlgoTable r = read_gemm_algo_table(path);
  EXPECT_EQ(r.env.gpu, t.env.gpu);
  EXPECT_EQ(r.env.cublaslt_version, t.env.cublaslt_version);
  ASSERT_EQ(r.choices.size(), t.choices.size());
  for (size_t i = 0; i < t.choices.size(); ++i) {
    EXPECT_EQ(r.choices[i].problem, t.choices[i].problem);
    EXPECT_EQ(r.choices[i].algo, t.choices[i].algo);
    EXPECT_EQ(r.choices[i].candidate, t.choices[i].candidate);
    EXPECT_DOUBLE_EQ(r.choices[i].heuristic_us, t.choices[i].heuristic_us);
    EXPECT_DOUBLE_EQ(r.choices[i].chosen_us, t.choices[i].chosen_us);
    EXPECT_EQ(r.choices[i].calls, t.choices[i].calls);
    EXPECT_EQ(r.choices[i].candidates, t.choices[i].candidates);
  }
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename(), "algos.json") << "a temp file was left";
}

TEST(GemmAlgoTable, DamagedFilesNameTheFileAndField) {
  const std::string dir = test::fresh_dir("gemm_algo_table_bad");
  const std::string good = dir + "/good.json";
  write_gemm_algo_table(good, random_table(11));
  std::ifstream in(good);
  const json j = json::parse(in);
  struct Case {
    std::string name, text, expect;
  };
  auto with = [&](const std::function<void(json&)>& edit) {
    json k = j;
    edit(k);
    return k.dump();
  };
  const std::vector<Case> cases = {
      {"missing", "", "cannot read the GEMM algorithm table"},
      {"not_json", "{\"format\": ", "not a JSON object"},
      {"foreign", R"({"format": "something else", "version": 1})", "not a GEMM algorithm table"},
      {"newer", with([](json& k) { k["version"] = 2; }), "not a GEMM algorithm table"},
      {"no_gpu", with([](json& k) { k.erase("gpu"); }), ": 'gpu' must be a string"},
      {"version_string", with([](json& k) { k["cublaslt_version"] = "13"; }), "'cublaslt_version' must be an integer"},
      {"choices_object", with([](json& k) { k["choices"] = json::object(); }), "'choices' must be an array"},
      {"short_algo", with([](json& k) { k["choices"][1]["algo"].erase(0); }),
       "choices[1]: 'algo' must be an array of 8"},
      {"bad_hex", with([](json& k) { k["choices"][2]["algo"][3] = "0x00000000000000zz"; }),
       "choices[2]: 'algo' must be an array of 8"},
      {"no_problem", with([](json& k) { k["choices"][0].erase("problem"); }), "choices[0]: 'problem' must be a string"},
      {"calls_float", with([](json& k) { k["choices"][0]["calls"] = 1.5; }), "choices[0]: 'calls' must be an integer"},
      {"format_number", with([](json& k) { k["format"] = 1; }), "not a GEMM algorithm table"},
      {"version_text", with([](json& k) { k["version"] = "1"; }), "not a GEMM algorithm table"},
      {"version_fraction", with([](json& k) { k["version"] = 1.5; }), "not a GEMM algorithm table"},
      {"candidate_huge", with([](json& k) { k["choices"][0]["candidate"] = 99999999999; }),
       "choices[0]: 'candidate' must be a candidate's index, got 99999999999"},
      {"candidates_negative", with([](json& k) { k["choices"][2]["candidates"] = -1; }),
       "choices[2]: 'candidates' must be a count of timed candidates, got -1"},
      {"candidates_text", with([](json& k) { k["choices"][0]["candidates"] = "16"; }),
       "choices[0]: 'candidates' must be a count of timed candidates, got \"16\""},
      {"calls_negative", with([](json& k) { k["choices"][1]["calls"] = -3; }),
       "choices[1]: 'heuristic_us', 'chosen_us' and 'calls' must not be negative"},
  };
  for (const Case& c : cases) {
    const std::string path = dir + "/" + c.name + ".json";
    if (c.name != "missing") std::ofstream(path) << c.text;
    const std::string err = error_of(path);
    EXPECT_NE(err.find(path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
  }
  EXPECT_EQ(error_of(good), "");
}

// Tables written before the count of timed candidates was kept still read (the count 0).
TEST(GemmAlgoTable, TableWithoutCandidateCountReads) {
  const std::string path = test::fresh_dir("gemm_algo_table_old") + "/algos.json";
  write_gemm_algo_table(path, random_table(13));
  json j = json::parse(std::ifstream(path));
  for (json& c : j["choices"]) c.erase("candidates");
  std::ofstream(path) << j.dump();
  const GemmAlgoTable r = read_gemm_algo_table(path);
  ASSERT_EQ(r.choices.size(), 3u);
  for (const GemmAlgoChoice& c : r.choices) EXPECT_EQ(c.candidates, 0);
}

// Coverage counts the planned problems the table names, and of those the ones it changes.
TEST(GemmAlgoTable, CoverageCountsNamedAndChangedProblems) {
  GemmAlgoTable t = random_table(5);  // problems p0, p1, p2
  t.choices[0].candidate = 2;
  t.choices[1].candidate = 0;
  t.choices[2].candidate = 1;
  std::vector<GemmAlgoChoice> in_use(4);
  in_use[0].problem = t.choices[0].problem;
  in_use[1].problem = t.choices[1].problem;
  in_use[2].problem = "M=1 N=2 K=3 not in the table";
  in_use[3].problem = "M=4 N=5 K=6 not in the table";
  const GemmAlgoCoverage c = gemm_algo_coverage(t, in_use);
  EXPECT_EQ(c.planned, 4);
  EXPECT_EQ(c.named, 2);
  EXPECT_EQ(c.changed, 1);
  bool warning = true;
  EXPECT_EQ(describe_gemm_algo_coverage("t.json", c, warning),
            "t.json names 2 of the 4 GEMM problems run so far; 1 of them run another algorithm than cuBLASLt's first "
            "choice");
  EXPECT_FALSE(warning);
  const GemmAlgoCoverage none = gemm_algo_coverage(t, {in_use[2], in_use[3]});
  EXPECT_EQ(none.named, 0);
  EXPECT_NE(describe_gemm_algo_coverage("t.json", none, warning).find("t.json names none of the 2 GEMM problems"),
            std::string::npos);
  EXPECT_TRUE(warning);
}

// A write that cannot finish (the path is a directory) is an error and leaves that path as it was.
TEST(GemmAlgoTable, FailedWriteLeavesWhatWasThere) {
  const std::string dir = test::fresh_dir("gemm_algo_table_write");
  const std::string target = dir + "/taken";
  fs::create_directory(target);
  std::ofstream(target + "/keep") << "x";
  EXPECT_THROW(write_gemm_algo_table(target, random_table(3)), UserError);
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_TRUE(fs::exists(target + "/keep"));
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  EXPECT_EQ(n, 1u) << "a temp file was left";
}

TEST(GemmAlgoTable, TrainRefusesAnUnreadableTableBeforeWriting) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("gemm_algo_table_train");
  const std::string cfg = dir + "/cfg.json";
  json c = test::tiny_train_config(dir + "/run");
  c["train"]["gemm_algos"] = dir + "/absent.json";
  std::ofstream(cfg) << c.dump(2);
  std::string out;
  EXPECT_EQ(test::run_linac("train " + cfg, out), 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find(dir + "/absent.json: cannot read the GEMM algorithm table"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir + "/run")) << "out_dir was created";
}

// Tuning needs one GPU; its options are checked before anything runs.
TEST(GemmAlgoTable, BenchTuningOptionsAreOneLineErrors) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("gemm_algo_table_bench");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {"--tune-steps 4", "--tune-steps needs --tune-gemms FILE"},
      {"--tune-gemms " + dir + "/t.json --tune-steps 0", "--tune-steps must be >= 1"},
      {"--tune-gemms " + dir + "/t.json --set train.gemm_algos=" + dir + "/t.json",
       "--tune-gemms tunes from cuBLASLt's heuristic: drop train.gemm_algos"},
      {"--set train.gemm_algos=" + dir + "/absent.json", dir + "/absent.json: cannot read the GEMM algorithm table"},
      {"--tune-gemms " + dir + "/no/t.json", "--tune-gemms " + dir + "/no/t.json: no directory " + dir + "/no"},
      {"--tune-gemms " + dir, "--tune-gemms " + dir + ": is a directory"},
  };
  if (!gpu_available()) cases.push_back({"--tune-gemms " + dir + "/t.json", "--tune-gemms runs on one GPU"});
  for (const Case& c : cases) {
    std::string out;
    EXPECT_EQ(test::run_linac("bench " + cfg + " --steps 1 " + c.args, out), 2) << c.args << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << c.args << ": " << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.args << ": " << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/t.json"));
}

}  // namespace
}  // namespace linac::test_gemm_algo_table
