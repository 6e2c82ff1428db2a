// metrics.jsonl: one JSON object per line, appended by rank 0 (other ranks hold a log that
// writes nothing). Metrics are a convenience: a failed write (a full disk) is reported once
// through `warn` and training goes on; checkpoints have their own checks.
//
// One record per step, whatever the run went through: a run that continues from step S (a fresh
// run: S = 0) first drops the records of the steps after S, which it is about to run again (a run
// killed after its last checkpoint, or a resume from an earlier checkpoint), a line a killed
// writer left unfinished, and any line that is not a record with an integer step (edited or
// damaged), by writing what it keeps to a temp file and renaming it over the old one.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "config/json_reader.h"

namespace linac {

class MetricsLog {
 public:
  // Opens out_dir/metrics.jsonl for appending when `writer`, after keeping only the complete
  // records of steps up to resume_step; UserError when it cannot.
  MetricsLog(const std::string& out_dir, bool writer, int64_t resume_step,
             std::function<void(const std::string&)> warn);
  // Appends `rec` (nothing for a null record) and flushes.
  void write(const json& rec);
  // What was dropped when the log was opened.
  struct Dropped {
    int64_t later = 0;                // records of steps after resume_step
    bool unfinished = false;          // a last line without its newline
    std::vector<int64_t> unreadable;  // line numbers (from 1) of lines that are no step's record
    bool any() const { return later > 0 || unfinished || !unreadable.empty(); }
  };
  const Dropped& dropped() const { return dropped_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool writer_;
  std::ofstream file_;
  std::function<void(const std::string&)> warn_;
  bool warned_ = false;
  Dropped dropped_;
};

}  // namespace linac
