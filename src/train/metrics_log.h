// metrics.jsonl: one JSON object per line, appended by rank 0 (other ranks hold a log that
// writes nothing). Metrics are a convenience: a failed write (a full disk) is reported once
// through `warn` and training goes on; checkpoints have their own checks.
#pragma once

#include <fstream>
#include <functional>
#include <string>

#include "config/json_reader.h"

namespace linac {

class MetricsLog {
 public:
  // Opens out_dir/metrics.jsonl for appending when `writer`; UserError when it cannot.
  MetricsLog(const std::string& out_dir, bool writer, std::function<void(const std::string&)> warn);
  // Appends `rec` (nothing for a null record) and flushes.
  void write(const json& rec);

 private:
  std::string path_;
  bool writer_;
  std::ofstream file_;
  std::function<void(const std::string&)> warn_;
  bool warned_ = false;
};

}  // namespace linac
