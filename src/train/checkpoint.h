// Checkpoints (HDF5). Layout, all parameters fp32 in PyTorch's [out, in] convention:
//   /config                 JSON of the resolved run config (variable-length string)
//   /params/<name>          master weights, shapes as in README "Checkpoints"
//   /optim/m/<name>, /optim/v/<name>   AdamW moments (absent in weights-only files)
//   /state                  attributes: step, updates, tokens_seen, world_size, seed,
//                           format_version; dataset /state/loader [world_size, k] int64
//   /tokenizer              uint8 SentencePiece model bytes (when the run had one)
// save() writes `<path>.tmp-<pid>`, fsyncs it and renames it over `path`, then fsyncs the
// directory: a crash at any point leaves either the old file or the complete new one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/param_store.h"

namespace linac {

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

// Reads config, state and tokenizer (no parameters).
CheckpointData read_checkpoint_meta(const std::string& path);
// Loads parameters (and the optimizer moments when `with_optimizer` and present) into `params`,
// refusing with a UserError when a name or shape differs from the model's.
void load_checkpoint_params(const std::string& path, ParamStore& params, bool with_optimizer);

// Files of a run directory: <out_dir>/ckpt/step_000123.h5 and <out_dir>/ckpt/latest.
std::string checkpoint_path(const std::string& out_dir, int64_t step);
// The newest complete checkpoint named by ckpt/latest ("" when none).
std::string latest_checkpoint(const std::string& out_dir);
// Points ckpt/latest at `path` (atomically) and deletes all but the newest `keep_last`.
void publish_checkpoint(const std::string& out_dir, const std::string& path, int64_t keep_last);

}  // namespace linac
