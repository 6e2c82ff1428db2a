// Generation benchmark for `linac bench --generate CONFIG|CKPT`.
#pragma once

#include <string>

#include "cli/args.h"

namespace linac::cli {

// Times prefill and token-by-token decoding for each prompt length and batch; prints a table
// (or JSON).
int bench_generate(Args& args, const std::string& path);

}  // namespace linac::cli
