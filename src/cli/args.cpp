#include "cli/args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace linac::cli {

Args::Args(int argc, char** argv, std::string usage, std::vector<std::string> switches)
    : cmd_(argv[0]), usage_(std::move(usage)) {
  auto is_switch = [&](const std::string& n) {
    for (const auto& s : switches)
      if (s == n) return true;
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
    } else if (a.rfind("--", 0) == 0 && a.size() > 2) {
      Opt o;
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        o.name = a.substr(2, eq - 2);
        o.value = a.substr(eq + 1);
      } else {
        o.name = a.substr(2);
        if (!is_switch(o.name) && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) o.value = argv[++i];
      }
      opts_.push_back(o);
    } else if (a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1]))) {
      dashed_.push_back(a);  // -j: not an option of ours, and never a file or value meant here
    } else {
      positionals_.push_back(a);
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) {
  const std::vector<std::string> all = get_all(name);
  if (all.size() > 1)
    throw UserError("option --" + name + " is given " + std::to_string(all.size()) + " times ('" + all[0] + "', '" +
                    all[1] + "'" + (all.size() > 2 ? ", ..." : "") + "); give it once");
  if (all.empty()) return std::nullopt;
  return all[0];
}

std::vector<std::string> Args::get_all(const std::string& name) {
  std::vector<std::string> out;
  for (auto& o : opts_) {
    if (o.name != name) continue;
    o.used = true;
    if (!o.value) throw UserError("option --" + name + " needs a value");
    out.push_back(*o.value);
  }
  return out;
}

std::string Args::get_or(const std::string& name, const std::string& def) { return get(name).value_or(def); }

int64_t Args::get_int(const std::string& name, int64_t def) {
  auto v = get(name);
  if (!v) return def;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  const bool out_of_range = errno == ERANGE;  // say what was typed, never the clamped value
  if (end == v->c_str() || *end || out_of_range)
    throw UserError("option --" + name + " expects an integer, got '" + *v + "'" +
                    (out_of_range ? " (out of range)" : ""));
  return x;
}

double Args::get_double(const std::string& name, double def) {
  auto v = get(name);
  if (!v) return def;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end) throw UserError("option --" + name + " expects a number, got '" + *v + "'");
  return x;
}

bool Args::flag(const std::string& name) {
  bool seen = false;
  for (auto& o : opts_) {
    if (o.name != name) continue;
    o.used = true;
    seen = true;
    if (o.value) throw UserError("option --" + name + " takes no value");
  }
  return seen;
}

std::vector<std::string> Args::positionals() {
  positionals_read_ = true;
  return positionals_;
}

void Args::finish() const {
  // An option the usage names belongs to another form of the command (bench --op, --generate).
  const auto in_usage = [&](const std::string& name) {
    const std::string word = "--" + name;
    for (size_t at = usage_.find(word); at != std::string::npos; at = usage_.find(word, at + 1)) {
      const size_t end = at + word.size();
      if (end == usage_.size() || !(std::isalnum(static_cast<unsigned char>(usage_[end])) || usage_[end] == '-'))
        return true;
    }
    return false;
  };
  for (const auto& o : opts_)
    if (!o.used)
      throw UserError(in_usage(o.name) ? "--" + o.name + " does not apply to this form of 'linac " + cmd_ +
                                             "' (see --help for the one it belongs to)"
                                       : "unknown option --" + o.name + " for 'linac " + cmd_ + "' (see --help)");
  if (!dashed_.empty())
    throw UserError("unknown option " + dashed_[0] + " for 'linac " + cmd_ + "' (options begin with --; see --help)");
  if (!positionals_read_ && !positionals_.empty())
    throw UserError("unexpected argument '" + positionals_[0] + "' for 'linac " + cmd_ + "' (see --help)");
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option, int64_t min) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop || v < min || errno == ERANGE)
      throw UserError(option + ": expected " +
                      (min == 1 ? std::string("positive integers") : "integers >= " + std::to_string(min)) +
                      " separated by commas, got '" + text + "'");
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

}  // namespace linac::cli
