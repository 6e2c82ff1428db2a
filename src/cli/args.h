// Small option parser shared by the subcommands: `--name value`, `--name=value`, repeated
// options, boolean flags and positionals. What a command does not read is a UserError naming
// it (finish): an unknown option, a `-x`, a positional the command takes none of, and an option
// given twice that the command reads once (a second --checkpoint must not quietly win).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace linac::cli {

class Args {
 public:
  // argv[0] is the command name; `usage` is printed for --help; `switches` are the boolean
  // options (they never take the next word as their value).
  Args(int argc, char** argv, std::string usage, std::vector<std::string> switches = {});

  // True when --help/-h was given; the caller prints usage() and returns 0.
  bool help() const { return help_; }
  const std::string& usage() const { return usage_; }

  std::optional<std::string> get(const std::string& name);          // UserError when given twice
  std::vector<std::string> get_all(const std::string& name);        // every occurrence
  std::string get_or(const std::string& name, const std::string& def);
  int64_t get_int(const std::string& name, int64_t def);
  double get_double(const std::string& name, double def);
  bool flag(const std::string& name);                               // a switch was given
  // The positionals; a command that never asks takes none (finish refuses them).
  std::vector<std::string> positionals();

  // Throws UserError for any option no get/flag call asked for, a single-dash word, and
  // positionals when positionals() was not called.
  void finish() const;

 private:
  struct Opt {
    std::string name;
    std::optional<std::string> value;
    bool used = false;
  };
  std::string cmd_, usage_;
  std::vector<Opt> opts_;
  std::vector<std::string> positionals_, dashed_;
  bool positionals_read_ = false;
  bool help_ = false;
};

// "2048,8192" -> {2048, 8192}; UserError naming `option` unless all are integers >= min.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option, int64_t min = 1);

}  // namespace linac::cli
