// The subcommand table of the CLI. Each command lives in cmd_<name>.cpp.
#pragma once

#include <vector>

namespace linac::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  // argv[0] is the command name
  bool uses_ranks = false;            // under mpirun each rank takes its part (else one process is required)
};

const std::vector<Command>& commands();

int cmd_prepare(int argc, char** argv);
int cmd_train(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_import(int argc, char** argv);

}  // namespace linac::cli
