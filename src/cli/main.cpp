// linac command line: one subcommand per verb (see README "CLI").
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/comm.h"
#include "config/json_reader.h"
#include "core/error.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "linac: train and compare efficient-attention language models\n\n"
               "usage: linac <command> [options]   (linac <command> --help for details)\n\n"
               "commands:\n");
  for (const auto& c : linac::cli::commands()) std::fprintf(f, "  %-9s %s\n", c.name, c.summary);
}

// Prints `linac CMD: KIND: MESSAGE` (`linac: KIND: MESSAGE` for an empty CMD) as one line,
// whatever the message quotes (a key or value from a config may hold a newline), ends an mpirun
// job with the same status, returns it.
int error_exit(const char* cmd, const std::string& who, const char* kind, std::string msg, int status) {
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  std::fprintf(stderr, "linac%s%s%s: %s: %s\n", *cmd ? " " : "", cmd, who.c_str(), kind, msg.c_str());
  std::fflush(stderr);
  linac::abort_job_if_distributed(status);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails a write with EFBIG instead of killing the process
  // mid-write, so the writers remove their temp files and say why, as for a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  // Likewise a pipe whose reader left (linac ... | head): the write fails with EPIPE, a training
  // run goes on into train.log, and a command's failed output is its one error line.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    if (argc >= 2 && (std::fflush(stdout) != 0 || std::ferror(stdout)))
      return error_exit("", "", "error", std::string("cannot write to standard output: ") + std::strerror(errno),
                        linac::kExitUserError);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  for (const auto& c : linac::cli::commands()) {
    if (name != c.name) continue;
    // In an mpirun job every message names its rank, and a failing rank ends the whole job.
    const std::string who = linac::launched_by_mpi() ? " (rank " + std::to_string(linac::launcher_rank()) + ")" : "";
    try {
      if (!c.uses_ranks) linac::require_one_process(std::string("linac ") + c.name);
      const int status = c.run(argc - 1, argv + 1);
      // Output lost to a full disk or a closed stdout is a failed write like any other.
      if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw linac::UserError(std::string("cannot write to standard output: ") + std::strerror(errno));
      return status;
    } catch (const linac::UserError& e) {
      return error_exit(c.name, who, "error", e.what(), linac::kExitUserError);
    } catch (const linac::Diverged& e) {
      return error_exit(c.name, who, "error", e.what(), linac::kExitDiverged);
    } catch (const std::bad_alloc&) {
      return error_exit(c.name, who, "error", linac::out_of_memory_message("host", 0, 0), linac::kExitUserError);
    } catch (const std::exception& e) {
      return error_exit(c.name, who, "internal error", e.what(), linac::kExitBug);
    }
  }
  // One line, as every other user error: the commands to choose from, the nearest one if any.
  std::vector<std::string> names;
  std::string list;
  for (const auto& c : linac::cli::commands()) {
    names.push_back(c.name);
    list += (list.empty() ? "" : ", ") + names.back();
  }
  const std::string near = linac::closest(name, names);
  return error_exit("", "", "error",
                    "unknown command '" + name + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
                        " (commands: " + list + "; linac --help)",
                    linac::kExitUserError);
}
