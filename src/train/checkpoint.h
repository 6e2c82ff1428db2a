// Checkpoints (HDF5). Layout, all parameters fp32 in PyTorch's [out, in] convention:
//   /config                 JSON of the resolved run config (variable-length string)
//   /params/<name>          master weights, shapes as in docs/training.md "Parameter names"
//   /optim/m/<name>, /optim/v/<name>   AdamW moments (absent in weights-only files)
//   /state                  attributes: step, updates, tokens_seen, world_size, seed,
//                           format_version; dataset /state/loader [world_size, k] int64
//   /tokenizer              uint8 SentencePiece model bytes (when the run had one)
// Integrity: every dataset carries an int64 attribute `hash` (content_hash of its stored bytes;
// of the UTF-8 text for /config), and the root carries `content_hash`, the hash of a manifest
// listing the /state attributes and every dataset's path, shape and hash. CheckpointReader, the
// only way to read a checkpoint, verifies all of it before handing anything out, so a damaged,
// truncated or incomplete file is a UserError naming the file and the reason.
// save() writes `<path>.tmp-<pid>`, fsyncs it and renames it over `path`, then fsyncs the
// directory: a crash at any point leaves either the old file or the complete new one. A failed
// write (disk full, ...) removes the temp file and is a UserError naming the file and the cause.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/param_store.h"

namespace linac {

namespace h5 {
class File;
}

struct TrainState {
  int64_t step = 0;         // optimizer steps taken (the next step's index)
  int64_t updates = 0;      // AdamW updates applied (skipped steps excluded)
  int64_t tokens_seen = 0;  // global tokens consumed
  int64_t world_size = 1;
  uint64_t seed = 0;
  std::vector<std::vector<int64_t>> loader;  // per rank: the loader's serialised state
};

struct CheckpointData {
  json config;
  TrainState state;
  std::string tokenizer;  // model bytes, may be empty
};

void save_checkpoint(const std::string& path, const ParamStore& params, const CheckpointData& data);

// An open checkpoint whose every dataset and /state attribute matched its checksums when it
// was opened; load_params verifies each tensor again as it reads it.
class CheckpointReader {
 public:
  // Throws a UserError naming `path` when it is missing, not HDF5, truncated, incomplete or
  // fails verification.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const { return path_; }
  const CheckpointData& data() const { return data_; }
  bool has_optimizer() const;

  // Loads parameters (and the optimizer moments when `with_optimizer` and the store has them)
  // into `params`, refusing with a UserError when a name or shape differs from the model's. A
  // ZeRO-1-sharded store keeps the part it holds (files do not depend on the world size); the
  // compute copy is the caller's (ParamStore::refresh_compute, TrainStep::sync_weights).
  void load_params(ParamStore& params, bool with_optimizer) const;

 private:
  struct Entry {
    std::vector<uint64_t> dims;
    uint64_t hash = 0;
  };
  std::string path_;
  std::unique_ptr<h5::File> file_;
  CheckpointData data_;
  std::map<std::string, Entry> datasets_;  // verified manifest: path -> shape and hash
};

// Files of a run directory: <out_dir>/ckpt/step_000123.h5 and <out_dir>/ckpt/latest.
std::string checkpoint_path(const std::string& out_dir, int64_t step);
// True when <out_dir>/ckpt holds a `latest` file or any step_*.h5 checkpoint.
bool has_checkpoints(const std::string& out_dir);
// The newest checkpoint of out_dir that verifies: the file ckpt/latest names when it verifies,
// else the step_*.h5 files newest first. Each one skipped is passed to `warn` with the reason.
// Returns null when out_dir holds no checkpoint at all; throws a UserError listing what was
// tried when it holds some but none verifies.
std::unique_ptr<CheckpointReader> newest_intact_checkpoint(const std::string& out_dir,
                                                           const std::function<void(const std::string&)>& warn);
// Points ckpt/latest at `path` (atomically) and deletes all but the newest `keep_last`.
void publish_checkpoint(const std::string& out_dir, const std::string& path, int64_t keep_last);

}  // namespace linac
