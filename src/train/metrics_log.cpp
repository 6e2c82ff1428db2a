#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "train/file_replace.h"

namespace fs = std::filesystem;

namespace linac {
namespace {

enum class Line { Kept, Later, Unreadable };

// A line of the log: a record of a step up to `last` (kept), of a later step, or not a record.
Line classify(const std::string& line, int64_t last) {
  const json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!rec.is_object()) return Line::Unreadable;
  const auto step = rec.find("step");
  if (step == rec.end() || !step->is_number_integer()) return Line::Unreadable;
  return step->get<int64_t>() <= last ? Line::Kept : Line::Later;
}

// Rewrites `path` with only the records of steps up to `last`; returns what it dropped.
MetricsLog::Dropped trim(const std::string& path, int64_t last) {
  MetricsLog::Dropped d;
  std::ifstream in(path, std::ios::binary);
  if (!in) return d;
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::string kept;
  int64_t number = 0;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    ++number;
    const std::string line = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (end == std::string::npos) {  // a last line without its newline: a killed writer's
      d.unfinished = true;
      break;
    }
    switch (classify(line, last)) {
      case Line::Kept:
        kept += line + "\n";
        break;
      case Line::Later:
        ++d.later;
        break;
      case Line::Unreadable:
        d.unreadable.push_back(number);
        break;
    }
    begin = end + 1;
  }
  if (d.any()) replace_file(path, kept, false);
  return d;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& out_dir, bool writer, int64_t resume_step,
                       std::function<void(const std::string&)> warn)
    : path_((fs::path(out_dir) / "metrics.jsonl").string()), writer_(writer), warn_(std::move(warn)) {
  if (!writer_) return;
  dropped_ = trim(path_, resume_step);
  file_.open(path_, std::ios::app);
  if (!file_) throw UserError("cannot open " + path_ + " for appending: " + std::strerror(errno));
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
