// Checkpoints (HDF5), in one of two layouts that CheckpointReader reads alike:
//
// Single file, <out_dir>/ckpt/step_000123.h5 (a run of one process, linac import):
//   /config                 JSON of the resolved run config (fixed-length string; variable-length
//                           in format 2)
//   /params/<name>          master weights, fp32, shapes as in docs/training.md "Parameter names"
//   /buffers/<name>         non-gradient model state (Transformer-VQ's codebook statistics)
//   /optim/m/<name>, /optim/v/<name>   AdamW moments (absent in weights-only files)
//   /state                  attributes: step, updates, tokens_seen, world_size, seed,
//                           format_version; dataset /state/loader [world_size, k] int64
//   /tokenizer              uint8 SentencePiece model bytes (when the run had one)
//
// Sharded, the directory <out_dir>/ckpt/step_000123/ (a run of several ranks): rank r wrote
// rank_0000r.h5 in parallel with the others, holding its piece of the flat parameter layout: under
// ZeRO the shard it owns, otherwise an equal split (rank 0 also the replicated group, /config,
// /state/loader, /buffers and /tokenizer). A piece of a tensor is a 1-D dataset under the tensor's
// name holding its flattened elements [start, start + count). manifest.json, written last, lists
// the files with their content hashes and, for every tensor, its shape and pieces (file, start,
// count) in order; its own "hash" covers the rest of it. The directory is renamed into place after
// the manifest is synced, so a checkpoint directory is complete or absent.
//
// Integrity (train/checkpoint_file.h): every dataset carries its content hash and every file a
// hash over all of them; CheckpointReader verifies all of it, so a damaged, truncated or
// incomplete checkpoint is a UserError naming the file and the reason.
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

struct CheckpointFile;

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

// An open checkpoint, a single file or a sharded directory, whose structure (every file's list of
// contents and /state, the manifest) and small datasets verified when it was opened.
class CheckpointReader {
 public:
  // Throws a UserError naming `path` when it is missing, not a checkpoint, truncated, incomplete
  // or fails verification. `verify_tensors`: also read every tensor and check its hash (a
  // multi-rank resume instead splits that work over the ranks: verify_tensors(part, parts)).
  explicit CheckpointReader(const std::string& path, bool verify_tensors = true);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const { return path_; }
  const CheckpointData& data() const { return data_; }
  bool has_optimizer() const;
  // A whole tensor's values ("params/<name>", "optim/m/<name>", "buffers/<name>", ...; assembled
  // from its pieces), verified against the hashes.
  std::vector<float> read_tensor(const std::string& name) const;
  // Checks the bytes of every `parts`-th tensor piece starting at `part` (UserError on a mismatch).
  void verify_tensors(int part, int parts) const;

  // Loads parameters (and the optimizer moments when `with_optimizer` and the store has them)
  // into `params`, refusing with a UserError when a name or shape differs from the model's. Each
  // rank reads only the pieces overlapping what it holds (all of it, or under ZeRO its shard), so
  // a checkpoint resumes at any world size. The compute copy is the caller's
  // (ParamStore::refresh_compute, TrainStep::sync_weights).
  void load_params(ParamStore& params, bool with_optimizer) const;

 private:
  struct Piece {
    size_t file;
    int64_t start, count;
  };
  struct TensorEntry {
    std::vector<uint64_t> dims;
    std::vector<Piece> pieces;  // in order, covering [0, numel)
  };
  void open_sharded();
  std::vector<float> read_piece(const std::string& name, const Piece& p) const;
  std::string path_;
  std::vector<CheckpointFile> files_;
  CheckpointData data_;
  std::map<std::string, TensorEntry> tensors_;
};

// Paths in a run directory: <out_dir>/ckpt/step_000123.h5 (single file), <out_dir>/ckpt/step_000123
// (sharded) and <out_dir>/ckpt/latest, which names the newest published one.
std::string checkpoint_path(const std::string& out_dir, int64_t step);
std::string sharded_checkpoint_path(const std::string& out_dir, int64_t step);
// True when `path` looks like a checkpoint: an HDF5 or .h5 file, or a directory with a manifest.json.
bool is_checkpoint_path(const std::string& path);
// True when <out_dir>/ckpt holds a `latest` file or any checkpoint.
bool has_checkpoints(const std::string& out_dir);
// Opens one candidate checkpoint (throws a UserError when it does not verify).
using CheckpointOpener = std::function<std::unique_ptr<CheckpointReader>(const std::string& path)>;
// The newest checkpoint of out_dir that verifies: the one ckpt/latest names when it verifies,
// else the others newest first. Each one skipped is passed to `warn` with the reason. Returns
// null when out_dir holds no checkpoint at all; throws a UserError listing what was tried when it
// holds some but none verifies. `open` defaults to a fully verifying CheckpointReader.
std::unique_ptr<CheckpointReader> newest_intact_checkpoint(const std::string& out_dir,
                                                           const std::function<void(const std::string&)>& warn,
                                                           const CheckpointOpener& open = nullptr);
// Points ckpt/latest at `path` (atomically) and deletes all but the newest `keep_last` checkpoints.
void publish_checkpoint(const std::string& out_dir, const std::string& path, int64_t keep_last);

}  // namespace linac
