#include "hf_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "test_util.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test::hf {

void expect_one_line_user_error(const std::string& args) {
  std::string out;
  EXPECT_EQ(test::run_linac(args, out), 2) << args << ": " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << args << ": " << out;
  EXPECT_NE(out.find(": error: "), std::string::npos) << args << ": " << out;
}

void run_ok(const std::string& args) {
  std::string out;
  ASSERT_EQ(test::run_linac(args, out), 0) << args << ": " << out;
}

json linac_config(bool tied, int64_t kv_heads, bool scaled) {
  json mixer = {{"rope_base", 500000.0}};
  if (kv_heads != 4) mixer["kv_heads"] = kv_heads;
  if (scaled)
    mixer["rope_scaling"] = {{"type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 64}};
  return {{"model",
           {{"arch", "transformer"},
            {"n_layers", 2},
            {"d_model", 64},
            {"n_heads", 4},
            {"vocab_size", 300},
            {"ffn_hidden", 96},
            {"tie_embeddings", tied},
            {"norm_eps", 1e-5},
            {"init_std", 0.03},
            {"mixer", mixer}}},
          {"data", {{"seq_len", 128}}},
          {"train", {{"global_batch_tokens", 2048}}}};
}

// Random values of `dtype`; F16 from random bit patterns (subnormals and the largest exponents
// included), decoded here by the formula, independently of the reader.
HfTensor random_hf_tensor(const std::string& name, std::vector<int64_t> shape, const std::string& dtype,
                          uint64_t seed) {
  HfTensor t{name, dtype, shape, {}, {}};
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  const std::vector<double> r = test::random_values(n, seed, 0, 1);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "F32" || dtype == "I32") {  // I32: bytes of the right size, for the dtype refusal
      const float v = static_cast<float>(2 * r[i] - 1);
      t.values.push_back(v);
      t.bytes.append(reinterpret_cast<const char*>(&v), 4);
    } else if (dtype == "BF16") {
      const uint16_t h = float_to_bf16(static_cast<float>(2 * r[i] - 1)).bits;
      t.values.push_back(std::bit_cast<float>(static_cast<uint32_t>(h) << 16));
      t.bytes.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      auto h = static_cast<uint16_t>(r[i] * 65536);
      if (((h >> 10) & 0x1f) == 0x1f) h ^= 0x4000;  // no infinities or NaNs
      const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
      const double mag = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
      t.values.push_back(static_cast<float>(h & 0x8000 ? -mag : mag));
      t.bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return t;
}

json hf_config(bool tied, int64_t kv_heads, bool scaled) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", kv_heads},
            {"vocab_size", 97},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 8192},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", tied},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", "bfloat16"},
            {"use_cache", true},
            {"rope_scaling", nullptr}};
  if (scaled)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  return j;
}

std::vector<HfTensor> hf_tensors(const json& cfg, const std::string& dtype) {
  const int64_t d = cfg["hidden_size"], F = cfg["intermediate_size"], V = cfg["vocab_size"];
  const int64_t K = cfg["num_key_value_heads"].get<int64_t>() * d / cfg["num_attention_heads"].get<int64_t>();
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"model.embed_tokens.weight", {V, d}},
                                                                      {"model.norm.weight", {d}}};
  for (int l = 0; l < cfg["num_hidden_layers"]; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& [n, s] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"self_attn.q_proj.weight", {d, d}},
                                                                   {"self_attn.k_proj.weight", {K, d}},
                                                                   {"self_attn.v_proj.weight", {K, d}},
                                                                   {"self_attn.o_proj.weight", {d, d}},
                                                                   {"mlp.gate_proj.weight", {F, d}},
                                                                   {"mlp.up_proj.weight", {F, d}},
                                                                   {"mlp.down_proj.weight", {d, F}},
                                                                   {"input_layernorm.weight", {d}},
                                                                   {"post_attention_layernorm.weight", {d}}})
      shapes.push_back({p + n, s});
  }
  if (!cfg["tie_word_embeddings"].get<bool>()) shapes.push_back({"lm_head.weight", {V, d}});
  std::vector<HfTensor> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    out.push_back(random_hf_tensor(shapes[i].first, shapes[i].second, dtype, 7 + i));
  return out;
}

// Writes a safetensors file by hand (this file's own writer, for dtypes and damage ours has not).
void write_st(const std::string& path, const std::vector<HfTensor>& tensors) {
  json h = json::object();
  uint64_t off = 0;
  for (const HfTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << text;
  for (const HfTensor& t : tensors) f << t.bytes;
}

// A folder: config.json and the tensors in one file or in `shards` files with an index.
std::string write_hf_folder(const std::string& dir, const json& cfg, const std::vector<HfTensor>& tensors, int shards) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  if (shards == 1) {
    write_st(dir + "/model.safetensors", tensors);
    return dir;
  }
  json wm = json::object();
  for (int s = 0; s < shards; ++s) {
    const std::string name =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    std::vector<HfTensor> part;
    for (size_t i = static_cast<size_t>(s); i < tensors.size(); i += static_cast<size_t>(shards)) {
      part.push_back(tensors[i]);
      wm[tensors[i].name] = name;
    }
    write_st(dir + "/" + name, part);
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump();
  return dir;
}

}  // namespace linac::test::hf
