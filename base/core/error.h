// Two kinds of failure:
//  - Error: a bug or a library/runtime failure (CUDA, cuBLAS, NCCL, MPI, HDF5). Carries the
//    failing call and file:line.
//  - UserError: bad input from the user (config field, missing file, wrong shape). The CLI
//    prints its message as one line and exits with status 2.
//  - Diverged: a training run whose numbers stopped being finite (train.max_bad_steps non-finite
//    steps in a row, or inf/NaN in the weights or optimizer state). The CLI prints one error line
//    and exits with status 3: neither a bug nor bad input, but a run to restart differently.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace linac {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Diverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The exit statuses of the CLI.
inline constexpr int kExitBug = 1, kExitUserError = 2, kExitDiverged = 3;

[[noreturn]] void fail_at(const char* file, int line, const std::string& msg);

// The message of an allocation this machine cannot hold, a UserError's: the request (a model,
// batch or sequence too large for the machine) is the user's to change, not a bug. `where` is
// "host" or "GPU", `in_use` the bytes already allocated there (0 with `bytes` 0: a std::bad_alloc
// of unknown size).
std::string out_of_memory_message(const char* where, size_t bytes, size_t in_use);

}  // namespace linac

#define LINAC_FAIL(msg) ::linac::fail_at(__FILE__, __LINE__, (msg))

// Internal invariant; a violation is a bug in linac (or a caller passing inconsistent shapes).
#define LINAC_CHECK(cond, msg)                                                    \
  do {                                                                            \
    if (!(cond)) ::linac::fail_at(__FILE__, __LINE__, std::string("check `" #cond "` failed: ") + (msg)); \
  } while (0)
