// One training run per directory: RunLock holds an exclusive advisory lock (flock) on
// <out_dir>/.lock for its lifetime. The kernel drops the lock when the holder exits, however it
// exits (SIGKILL included), so a crashed run never leaves a directory locked; the file itself
// stays and records the holder (pid and host) for the refusal message of a second run.
//
// Once the lock is held nothing else writes into the directory, so temp files left there by a
// killed writer (ckpt/*.tmp-PID: files of an interrupted checkpoint or `latest` update, directories
// of an interrupted sharded checkpoint; metrics.jsonl.tmp-PID: an interrupted rewrite of the
// metrics on resume) are stale: remove_stale_temp_files deletes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace linac {

class RunLock {
 public:
  // Creates out_dir (and parents) when missing, then takes the lock. Throws a UserError naming
  // the directory and the process holding it when another run has it, or naming the cause when
  // the directory or the lock file cannot be created; `key` begins those messages
  // ("cfg.json: train.out_dir").
  RunLock(const std::string& out_dir, const std::string& key);
  // Releases the lock. When this lock created the directory and the run never started (it was
  // refused while it set up: a config, its data or a checkpoint found wrong), removes the
  // directory with what the refused run wrote there (the lock file, its log).
  ~RunLock();
  // The run has started: the directory stays, whatever happens next.
  void keep() { keep_ = true; }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  static constexpr const char* kFileName = ".lock";

 private:
  std::string dir_;
  int fd_ = -1;
  bool created_dir_ = false, keep_ = false;
  std::vector<std::filesystem::path> created_;  // out_dir and the parents it made, innermost first
};

struct StaleFile {
  std::string path;
  uint64_t bytes = 0;
};

// Deletes <out_dir>/ckpt/*.tmp-* and <out_dir>/*.tmp-* (files and directories left by writers
// killed mid-write) and returns what it removed. Only call while holding the directory's RunLock.
std::vector<StaleFile> remove_stale_temp_files(const std::string& out_dir);

}  // namespace linac
