// A file of cuBLASLt algorithm choices: what `linac bench --tune-gemms FILE` measured, read by
// `linac bench --gemm-algos FILE` and `train.gemm_algos` (docs/gemm_tuning.md has the format).
// It is valid for one GPU model and one cuBLASLt version, which it records.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "matmul/matmul_algos.h"

namespace linac {

struct GemmAlgoTable {
  GemmAlgoEnv env;
  std::vector<GemmAlgoChoice> choices;
};

// A UserError names the file and the field that is missing or malformed.
GemmAlgoTable read_gemm_algo_table(const std::string& path);
// Through a temp file renamed over `path`, so a failed write leaves what was there.
void write_gemm_algo_table(const std::string& path, const GemmAlgoTable& table);
// train.gemm_algos: "" is none. Otherwise reads and checks `path`; on the GPU (`gpu`) installs
// its choices in this process (gemm_algos_install) and returns the table, where one made on
// another GPU model or cuBLASLt version is a UserError saying which; on the CPU uses nothing.
std::optional<GemmAlgoTable> use_gemm_algo_table(const std::string& path, bool gpu);

// How much of a process's GEMM work a table covers: of the problems planned so far (`in_use`,
// gemm_algos_in_use()), how many it names and how many of those it gives another algorithm than
// the heuristic's first. A table tuned for other shapes (another micro-batch, precision or
// recompute setting) names none, and the run silently keeps the heuristic's choices: this is
// what tells.
struct GemmAlgoCoverage {
  int64_t planned = 0, named = 0, changed = 0;
};
GemmAlgoCoverage gemm_algo_coverage(const GemmAlgoTable& table, const std::vector<GemmAlgoChoice>& in_use);
// One line about it, naming `path`; `warning` is set when the table names none of the problems.
std::string describe_gemm_algo_coverage(const std::string& path, const GemmAlgoCoverage& c, bool& warning);

}  // namespace linac
