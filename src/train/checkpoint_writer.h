// Writing checkpoints (layouts in train/checkpoint.h): save_checkpoint, one file synchronously
// (linac import, tools), and CheckpointWriter, the training loop's.
//
// CheckpointWriter copies what this rank writes into host memory (pinned on a GPU run, allocated
// once: 12 bytes per parameter over the ranks), then writes it on a thread of its own while the
// step loop goes on; what the loop waits for is that copy. One checkpoint is in flight at a time
// (start() waits for the previous one). With one rank the thread writes step_N.h5 through a temp
// file renamed into place. With several, every rank writes its shard into
// ckpt/step_N.tmp-<rank 0's pid>/ at once; poll() and wait(), called by every rank at the same
// points, exchange the ranks' results (an MPI all-gather of four numbers), and once all are
// written rank 0 writes manifest.json, syncs it and renames the directory into place: a crash at any
// moment leaves the previous checkpoints intact, and `--resume auto` takes the newest complete
// one. Only then is the checkpoint published (ckpt/latest, keep_last).
//
// The step loop reads its dataset through HDF5, whose thread-safe build serialises every call with
// one global lock: a thread writing gigabytes through HDF5 would hold it for seconds at a time.
// So each file is laid out through HDF5 on the loop's thread (the datasets' storage allocated,
// milliseconds), and the thread writes the values with plain pwrite at the datasets' offsets,
// then adds the hashes (a short HDF5 call each). The library must still be thread-safe for those;
// without that the writer writes synchronously and says so.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "train/checkpoint.h"

namespace linac {

class Comm;
struct CheckpointStaging;

// Writes the single-file checkpoint `path` (a temp file, synced and renamed into place: a crash
// leaves the old file or the complete new one; a failed write removes the temp file and is a
// UserError naming the file and the cause). `params` must not be sharded.
void save_checkpoint(const std::string& path, const ParamStore& params, const CheckpointData& data);

// The flat range of `ps` that rank `rank` of `world` writes in a sharded checkpoint: the shard
// ZeRO gives it (whether or not `ps` is sharded), rank 0 also the replicated group before it.
std::pair<int64_t, int64_t> checkpoint_piece_range(const ParamStore& ps, int rank, int world);

class CheckpointWriter {
 public:
  struct Options {
    std::string out_dir;
    int64_t keep_last = 0;
    bool async = true;
  };
  // `ps` sizes the host copy. `info` receives one line per published checkpoint.
  CheckpointWriter(const ParamStore& ps, Comm& comm, Options opt, std::function<void(const std::string&)> info);
  // Joins the thread: a write in flight finishes its file, but is not published.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts the checkpoint of data.state.step from `ps` (its device work must be complete),
  // after waiting for the one in flight; without `async`, also waits for it. Returns its path.
  std::string start(const ParamStore& ps, const CheckpointData& data);
  // Publishes the checkpoint in flight once every rank has written its part.
  void poll();
  // Blocks until the checkpoint in flight is published. A failed write is a UserError.
  void wait();

 private:
  struct Job;
  bool finish(bool block);  // true when the job in flight was published (or none was)
  void place_sharded(const Job& job) const;
  static std::string shard_file_name(int rank);
  Comm& comm_;
  Options opt_;
  std::function<void(const std::string&)> info_;
  std::unique_ptr<CheckpointStaging> staging_;
  std::unique_ptr<Job> job_;
  int64_t tag_ = 0;  // rank 0's pid: names the temp directory of a sharded checkpoint on every rank
  // LINAC_TEST_CHECKPOINT_DELAY_MS: the thread waits that long before writing, so tests can land
  // a SIGKILL or a SIGTERM inside an asynchronous write.
  int64_t delay_ms_ = 0;
};

}  // namespace linac
