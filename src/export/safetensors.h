// The safetensors format (https://huggingface.co/docs/safetensors), a writer and a reader:
//   [8 bytes: N, little-endian u64][N bytes: JSON header, space-padded to a multiple of 8][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (byte
// offsets into the data section, tensors stored back to back in the given order) and an optional
// "__metadata__" object of string values. Data is raw little-endian (this machine's order).
// The reader holds files to the format's rules (the tensors tile the data section exactly: no
// gaps, overlaps or bytes past the end; each one's size is its shape times its dtype's) and reads
// F32, F16 and BF16 tensors as f32, exactly, and F64 rounded to the nearest f32. Sharded
// checkpoints (Hugging Face's model.safetensors.index.json: {"weight_map": {tensor: shard file}})
// read as one set of tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"

namespace linac {

struct SafetensorsTensor {
  std::string name;
  Tensor data;  // contiguous, on the CPU: F32, F64, BF16 or I32
};

// The format's dtype name ("F32", "BF16", ...); UserError for a dtype it has none for here.
std::string safetensors_dtype(DType dt);

// Writes every tensor and the metadata to `path`; UserError when it cannot be written or two
// tensors share a name.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// One tensor of a file as its header describes it.
struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// An open safetensors file whose header passed validation (the constructor throws a UserError
// naming the file, and the tensor when one is at fault, for anything that breaks the format).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor `name` as a contiguous f32 CPU tensor; UserError for an integer or unknown dtype, or
  // when the file cannot be read (it changed since it was opened).
  OwnedTensor read_f32(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a Hugging Face model folder: DIR/model.safetensors.index.json's shards when
// the index exists, else DIR/model.safetensors. UserError when neither exists, for an index that
// is not {"weight_map": {name: file}}, a shard it names that is missing or damaged, and a tensor
// the index maps to a shard that lacks it or that a shard holds against the index.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& dir);

  // Tensor name -> the file holding it and its entry.
  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  const std::map<std::string, Located>& tensors() const { return tensors_; }
  // read_f32 of the file that holds `name` (which must be one of tensors()).
  OwnedTensor read_f32(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Located> tensors_;
};

}  // namespace linac
