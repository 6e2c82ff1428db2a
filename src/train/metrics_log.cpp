#include "train/metrics_log.h"

#include <filesystem>

#include "core/error.h"

namespace linac {

MetricsLog::MetricsLog(const std::string& out_dir, bool writer, std::function<void(const std::string&)> warn)
    : path_((std::filesystem::path(out_dir) / "metrics.jsonl").string()), writer_(writer), warn_(std::move(warn)) {
  if (!writer_) return;
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
