// One HDF5 checkpoint file: a whole single-file checkpoint, or one rank's shard of a sharded
// checkpoint (train/checkpoint.h has both layouts). Every dataset carries an int64 attribute
// `hash` (content_hash of its stored bytes; of the UTF-8 text for /config) and the root carries
// `content_hash`, the hash of a manifest listing the /state attributes and every dataset's path,
// shape and hash: a file verifies as a whole, and its content_hash stands for all of it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace linac {

namespace h5 {
class File;
}

// A tensor to write: f32 values on the host, stored under `name` with `shape`.
struct HostTensor {
  std::string name;
  std::vector<uint64_t> shape;
  const float* data = nullptr;
};

// A checkpoint file whose datasets exist before their values: `path` is written with every
// dataset but the tensors' values and hashes, each tensor's storage allocated in one contiguous
// run at `offsets[i]`. fill_checkpoint_file then writes the values with plain pwrite, outside
// HDF5: a thread-safe HDF5 serialises every call with one lock, which a training loop's dataset
// reads share, so a background writer must not hold it for seconds.
struct CheckpointFileLayout {
  std::string path;
  std::vector<int64_t> state_attrs;
  std::vector<uint64_t> offsets;  // per tensor, in bytes from the start of the file
  std::map<std::string, std::vector<uint64_t>> dims;
  std::map<std::string, uint64_t> hashes;  // of the datasets written so far
};

// Creates (or truncates) `path`: the /state attributes of data.state; with `with_meta` also
// /config, /state/loader and /tokenizer; the tensors' datasets, allocated but not written.
CheckpointFileLayout create_checkpoint_file(const std::string& path, const CheckpointData& data, bool with_meta,
                                            const std::vector<HostTensor>& tensors);
// Writes the tensors' values (the same list create_checkpoint_file laid out), their hashes and the
// file's content_hash; returns the content_hash. Throws h5::Failure on an HDF5 or I/O error (its
// reason() the operating system's message, "No space left on device").
uint64_t fill_checkpoint_file(const CheckpointFileLayout& layout, const std::vector<HostTensor>& tensors);
// Both, one after the other.
uint64_t write_checkpoint_file(const std::string& path, const CheckpointData& data, bool with_meta,
                               const std::vector<HostTensor>& tensors);

// 0, or the errno of a failed open/fsync of a file or directory.
int sync_path(const std::string& path, bool directory);

// An open checkpoint file whose manifest, /state attributes and small datasets (/config,
// /state/loader, /tokenizer) verified; tensors are verified when read (read_verified).
struct CheckpointFile {
  struct Entry {
    std::vector<uint64_t> dims;
    uint64_t hash = 0;
  };
  std::string path;
  std::unique_ptr<h5::File> file;
  uint64_t file_hash = 0;  // its content_hash attribute
  CheckpointData data;  // config (when present), state, tokenizer
  std::map<std::string, Entry> datasets;  // path -> shape and hash, as the verified manifest lists them

  CheckpointFile();
  ~CheckpointFile();
  CheckpointFile(CheckpointFile&&) noexcept;
  CheckpointFile& operator=(CheckpointFile&&) noexcept;

  // Opens and verifies `path`; `need_config`: a file without /config is not a checkpoint. Throws
  // a UserError naming the file and what is wrong.
  static CheckpointFile open(const std::string& path, bool need_config);
  // Dataset `name` as f32 values (it must be float32), checked against its hash.
  std::vector<float> read_verified(const std::string& name) const;
};

}  // namespace linac
