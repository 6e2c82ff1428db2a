#include "train/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace fs = std::filesystem;

namespace linac {
namespace {

// Whether a line of the log is a whole record of a step up to `last`.
bool keep(const std::string& line, int64_t last) {
  const json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!rec.is_object()) return false;
  const auto step = rec.find("step");
  return step != rec.end() && step->is_number_integer() && step->get<int64_t>() <= last;
}

// Rewrites `path` with only the records keep() accepts (through path.tmp-PID, which a killed
// rewrite leaves for remove_stale_temp_files); returns how many lines it dropped.
int64_t trim(const std::string& path, int64_t last) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::string kept;
  int64_t dropped = 0;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    // A last line without its newline is one a killed writer did not finish.
    const std::string line = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (end != std::string::npos && keep(line, last))
      kept += line + "\n";
    else
      ++dropped;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (dropped == 0) return 0;
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out << kept << std::flush;
  if (!out) throw UserError("cannot write " + tmp + ": " + std::strerror(errno));
  out.close();
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw UserError("cannot replace " + path + " with " + tmp + ": " + std::strerror(errno));
  return dropped;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& out_dir, bool writer, int64_t resume_step,
                       std::function<void(const std::string&)> warn)
    : path_((fs::path(out_dir) / "metrics.jsonl").string()), writer_(writer), warn_(std::move(warn)) {
  if (!writer_) return;
  dropped_ = trim(path_, resume_step);
  file_.open(path_, std::ios::app);
  if (!file_) throw UserError("cannot open " + path_ + " for appending");
}

void MetricsLog::write(const json& rec) {
  if (!writer_ || rec.is_null()) return;
  file_ << rec.dump() << "\n" << std::flush;
  if (!file_ && !warned_) {
    warn_("writing " + path_ + " failed (disk full?); training continues without metrics");
    warned_ = true;
  }
}

}  // namespace linac
