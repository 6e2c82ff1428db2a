// A writer of the safetensors format (https://huggingface.co/docs/safetensors), ours:
//   [8 bytes: N, little-endian u64][N bytes: JSON header, space-padded to a multiple of 8][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (byte
// offsets into the data section, tensors stored back to back in the given order) and an optional
// "__metadata__" object of string values. Data is raw little-endian (this machine's order).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

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

}  // namespace linac
