// A file of cuBLASLt algorithm choices: what `linac bench --tune-gemms FILE` measured, read by
// `linac bench --gemm-algos FILE` and `train.gemm_algos` (docs/gemm_tuning.md has the format).
// It is valid for one GPU model and one cuBLASLt version, which it records.
#pragma once

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
// Reads `path` and installs its choices in this process (gemm_algos_install); a table made on
// another GPU model or cuBLASLt version is a UserError saying which.
void install_gemm_algo_table(const std::string& path);

}  // namespace linac
