// Fixtures of the Hugging Face import/export tests (tests/cpu/test_hf_import*.cpp): small linac
// and Llama configs of the same model, random Llama tensors in F32, F16 (subnormals included) or
// BF16 with the values they mean, and a safetensors writer of this file's own (for dtypes and
// damage the library's writer has not), one file or sharded with an index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace linac::test::hf {

// `linac ARGS` must fail with exit status 2 and one line "...: error: ..."; `linac ARGS` must succeed.
void expect_one_line_user_error(const std::string& args);
void run_ok(const std::string& args);

// A 2-layer linac Transformer++ (d 64, 4 heads, vocabulary 300) with kv_heads K/V heads, tied or
// not, with Llama 3 RoPE scaling or not.
json linac_config(bool tied, int64_t kv_heads, bool scaled);

// A tensor of a hand-written folder: its stored bytes and the f32 values they mean.
struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<float> values;
};

// Random values of `dtype` (F32, BF16, F16; I32 gives F32 bytes under that name); F16 from random
// bit patterns (subnormals and the largest exponents included), decoded here by the formula,
// independently of the reader.
HfTensor random_hf_tensor(const std::string& name, std::vector<int64_t> shape, const std::string& dtype, uint64_t seed);
// A Llama config.json of the same shape (vocabulary 97) and its tensors in `dtype`.
json hf_config(bool tied, int64_t kv_heads, bool scaled);
std::vector<HfTensor> hf_tensors(const json& cfg, const std::string& dtype);
// Writes a safetensors file by hand.
void write_st(const std::string& path, const std::vector<HfTensor>& tensors);
// A folder: config.json and the tensors in one file or in `shards` files with an index; returns dir.
std::string write_hf_folder(const std::string& dir, const json& cfg, const std::vector<HfTensor>& tensors,
                            int shards = 1);

}  // namespace linac::test::hf
