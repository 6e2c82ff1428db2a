// Op-level benchmarks for `linac bench --op NAME`.
#pragma once

#include <string>

#include "cli/args.h"

namespace linac::cli {

// Times NAME's forward and backward; prints a table (or JSON). UserError for an unknown op.
int bench_op(Args& args, const std::string& name);

}  // namespace linac::cli
