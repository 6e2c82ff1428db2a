// linac import --format hf against export: a random linac checkpoint exported and imported again
// has the same model config and every parameter bit for bit (tied and untied, MHA, GQA and MQA,
// with and without Llama 3 RoPE scaling, with an embedded SentencePiece model); a Hugging Face
// folder written here by hand (F32, F16 with subnormals, BF16; one file or sharded) imports and
// exports back to exactly its values. Each refusal names its field, tensor or file; damaged
// safetensors and weights holding inf or NaN are refused; the CLI's exit codes; generate --prompt-ids on a checkpoint
// without a tokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "data/token_dataset.h"
#include "export/hf_llama.h"
#include "export/hf_llama_import.h"
#include "export/safetensors.h"
#include "model/model.h"
#include "model/param_store.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_hf_import {
namespace {

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

// ---- linac -> hf -> linac ----------------------------------------------------------------------

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

// A checkpoint of random weights (norm gains included, so nothing is a constant).
std::string random_checkpoint(const std::string& path, const json& j, const std::string& tokenizer) {
  const Config cfg = Config::from_json(j, "test");
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  const ParamStore& ps = model.params();
  for (int i = 0; i < ps.count(); ++i) test::fill_random(ps.master(i), 100 + static_cast<uint64_t>(i));
  save_checkpoint(path, ps, {cfg.to_json(), {}, tokenizer});
  return path;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HfImport, ExportThenImportIsBitExact) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string sp = TokenDataset(test::tiny_dataset()).tokenizer_bytes();
  struct Case {
    bool tied;
    int64_t kv_heads;
    bool scaled, tokenizer;
  };
  for (const Case c : {Case{false, 4, false, true}, Case{true, 2, true, false}, Case{false, 1, true, false},
                       Case{true, 4, false, false}, Case{false, 2, false, false}}) {
    SCOPED_TRACE(testing::Message() << "tied " << c.tied << " kv_heads " << c.kv_heads << " scaled " << c.scaled);
    const std::string dir = test::fresh_dir("hf_roundtrip");
    const json j = linac_config(c.tied, c.kv_heads, c.scaled);
    const std::string src = random_checkpoint(dir + "/src.h5", j, c.tokenizer ? sp : "");
    run_ok("export --format hf --checkpoint " + src + " --out " + dir + "/hf");
    const json hf = json::parse(test::file_bytes(dir + "/hf/config.json"));
    EXPECT_EQ(hf["num_key_value_heads"], c.kv_heads);
    EXPECT_EQ(hf.contains("rope_scaling"), c.scaled);
    if (c.scaled) {
      EXPECT_EQ(hf["rope_scaling"]["rope_type"], "llama3");
    }
    run_ok("import --format hf " + dir + "/hf --out " + dir + "/back.h5");

    const CheckpointReader back(dir + "/back.h5");
    EXPECT_EQ(back.data().config["model"], Config::from_json(j, "test").to_json()["model"]);
    EXPECT_EQ(back.data().config["data"]["seq_len"], 128);
    EXPECT_EQ(back.data().state.step, 0);
    EXPECT_FALSE(back.has_optimizer());
    EXPECT_EQ(back.data().tokenizer, c.tokenizer ? sp : "");
    EXPECT_TRUE(same_bits(test::read_all_f32(src, "params"), test::read_all_f32(dir + "/back.h5", "params")));

    // And back out: the same folder, byte for byte.
    run_ok("export --format hf --checkpoint " + dir + "/back.h5 --out " + dir + "/hf2");
    EXPECT_TRUE(test::file_bytes(dir + "/hf/model.safetensors") == test::file_bytes(dir + "/hf2/model.safetensors"));
    EXPECT_EQ(test::file_bytes(dir + "/hf/config.json"), test::file_bytes(dir + "/hf2/config.json"));
  }
}

// ---- hf -> linac -> hf ---------------------------------------------------------------------------

// A tensor of a hand-written folder: its stored bytes and the f32 values they mean.
struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<float> values;
};

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
std::string write_hf_folder(const std::string& dir, const json& cfg, const std::vector<HfTensor>& tensors,
                            int shards = 1) {
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

TEST(HfImport, HandWrittenFoldersImportAndExportExactly) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  struct Case {
    std::string dtype;
    int shards;
    bool tied;
    int64_t kv_heads;
    bool scaled;
  };
  for (const Case& c :
       {Case{"BF16", 1, false, 2, true}, Case{"F16", 2, true, 4, false}, Case{"F32", 3, false, 1, false}}) {
    SCOPED_TRACE(c.dtype);
    const std::string dir = test::fresh_dir("hf_by_hand");
    const json cfg = hf_config(c.tied, c.kv_heads, c.scaled);
    const std::vector<HfTensor> tensors = hf_tensors(cfg, c.dtype);
    write_hf_folder(dir + "/in", cfg, tensors, c.shards);

    const HfLlamaImport imp = import_hf_llama(dir + "/in");
    const ModelConfig& m = imp.cfg.model;
    EXPECT_EQ(m.d_model, 64);
    EXPECT_EQ(m.ffn_hidden, 96);
    EXPECT_EQ(m.vocab_size, 97);
    EXPECT_EQ(m.tie_embeddings, c.tied);
    EXPECT_EQ(m.norm_eps, 1e-6);
    EXPECT_EQ(m.mixer.value("kv_heads", int64_t(4)), c.kv_heads);
    EXPECT_EQ(m.mixer.contains("rope_scaling"), c.scaled);
    EXPECT_EQ(imp.cfg.data.seq_len, kHfImportMaxSeqLen);
    EXPECT_TRUE(imp.tokenizer.empty());
    // Each linac parameter holds its Hugging Face tensors' rows in order (this test's own table,
    // not the views export and import share).
    const ParamStore& ps = imp.model->params();
    auto expect_rows = [&](const std::string& ours, const std::vector<std::string>& parts) {
      std::vector<float> want;
      for (const std::string& p : parts)
        for (const HfTensor& t : tensors)
          if (t.name == p) want.insert(want.end(), t.values.begin(), t.values.end());
      const Tensor w = ps.master(ps.find(ours));
      ASSERT_EQ(static_cast<size_t>(w.numel()), want.size()) << ours;
      EXPECT_EQ(0, std::memcmp(w.ptr, want.data(), w.nbytes())) << ours << " differs";
    };
    expect_rows("embed.weight", {"model.embed_tokens.weight"});
    expect_rows("norm_f.weight", {"model.norm.weight"});
    EXPECT_EQ(ps.find("head.weight") >= 0, !c.tied);
    if (!c.tied) expect_rows("head.weight", {"lm_head.weight"});
    for (int l = 0; l < 2; ++l) {
      const std::string o = "layers." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
      expect_rows(o + "attn.wqkv",
                  {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"});
      expect_rows(o + "attn.wo", {h + "self_attn.o_proj.weight"});
      expect_rows(o + "mlp.w13", {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"});
      expect_rows(o + "mlp.w2", {h + "mlp.down_proj.weight"});
      expect_rows(o + "norm1.weight", {h + "input_layernorm.weight"});
      expect_rows(o + "norm2.weight", {h + "post_attention_layernorm.weight"});
    }

    run_ok("import --format hf " + dir + "/in --out " + dir + "/m.h5");
    run_ok("export --format hf --checkpoint " + dir + "/m.h5 --out " + dir + "/out");
    const SafetensorsFile out(dir + "/out/model.safetensors");
    EXPECT_EQ(out.entries().size(), tensors.size());
    for (const HfTensor& t : tensors) {
      ASSERT_TRUE(out.entries().count(t.name)) << t.name;
      EXPECT_EQ(out.entries().at(t.name).dtype, "F32");
      EXPECT_EQ(out.entries().at(t.name).shape, t.shape) << t.name;
      const OwnedTensor v = out.read_f32(t.name);
      EXPECT_EQ(0, std::memcmp(v->ptr, t.values.data(), v->nbytes())) << t.name << " differs";
    }
    const json back = json::parse(test::file_bytes(dir + "/out/config.json"));
    for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings"})
      EXPECT_EQ(back[k], cfg[k]) << k;
    if (c.scaled) {
      EXPECT_EQ(back["rope_scaling"], cfg["rope_scaling"]);
    }
  }
}

TEST(HfImport, ReaderReadsTheWritersFilesAsF32) {
  const std::string path = test::fresh_dir("st_reader") + "/x.safetensors";
  const OwnedTensor a = test::random_tensor({3, 5}, DType::F32, 1), b = test::random_tensor({7}, DType::BF16, 2);
  const OwnedTensor e = test::random_tensor({2, 2}, DType::F64, 3), i(DType::I32, Device::CPU, {2});
  write_safetensors(path,
                    {{"a", a}, {"b", b}, {"e", e}, {"i", i}, {"empty", OwnedTensor(DType::F32, Device::CPU, {0, 4})}},
                    {{"k", "v"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(f.entries().size(), 5u);
  for (const auto& [name, want] :
       std::vector<std::pair<std::string, const Tensor*>>{{"a", &a.t}, {"b", &b.t}, {"e", &e.t}}) {
    const OwnedTensor got = f.read_f32(name);
    EXPECT_EQ(got->dims(), want->dims()) << name;
    const std::vector<double> w = to_doubles(*want), g = to_doubles(got);
    for (size_t k = 0; k < w.size(); ++k) EXPECT_EQ(g[k], static_cast<double>(static_cast<float>(w[k]))) << name << k;
  }
  EXPECT_EQ(f.read_f32("empty")->numel(), 0);
  EXPECT_THROW(f.read_f32("i"), UserError);
}

// ---- refusals ------------------------------------------------------------------------------------

std::string config_error(const json& hf) {
  try {
    hf_llama_import_config(hf, "config.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfImport, ConfigsLinacCannotRepresentAreRefusedNamingTheField) {
  const json ok = hf_config(false, 2, true);
  EXPECT_EQ(config_error(ok), "(accepted)");
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"attention_bias", true}}, "config.json: attention_bias:"},
      {{{"mlp_bias", true}}, "config.json: mlp_bias:"},
      {{{"model_type", "mistral"}}, "config.json: model_type: "},
      {{{"model_type", "qwen2"}}, "'qwen2'"},
      {{{"architectures", {"LlamaForSequenceClassification"}}}, "config.json: architectures:"},
      {{{"hidden_act", "gelu"}}, "config.json: hidden_act:"},
      {{{"head_dim", 32}}, "config.json: head_dim:"},
      {{{"num_key_value_heads", 3}}, "config.json: num_key_value_heads: must divide"},
      {{{"num_attention_heads", 5}}, "config.json: num_attention_heads: must divide hidden_size"},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}, "config.json: rope_scaling.rope_type:"},
      {{{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}}, "config.json: rope_scaling.type: "},
      {{{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}}}, "'dynamic'"},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 4.0}}}}, "rope_scaling.low_freq_factor: is required"},
      // The range named is the one linac's own config takes (a factor below 1 would shrink the context).
      {{{"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 0.5},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192}}}},
       "config.json: rope_scaling.factor: must be in [1, 1e+06], got 0.5"},
  };
  for (const auto& [patch, want] : cases) {
    json j = ok;
    if (patch.contains("rope_scaling")) j.erase("rope_scaling");  // replaced, not merged
    j.merge_patch(patch);
    const std::string e = config_error(j);
    EXPECT_NE(e.find(want), std::string::npos) << patch.dump() << " -> " << e;
  }
  json defaults = {{"model_type", "llama"},  {"hidden_size", 64},       {"num_attention_heads", 4},
                   {"num_hidden_layers", 1}, {"intermediate_size", 32}, {"vocab_size", 50}};
  const Config c = hf_llama_import_config(defaults, "config.json");  // transformers' defaults for the rest
  EXPECT_EQ(c.model.tie_embeddings, false);
  EXPECT_EQ(c.model.mixer["rope_base"], 10000.0);
  EXPECT_FALSE(c.model.mixer.contains("kv_heads"));
  EXPECT_EQ(c.data.seq_len, 2048);
  // transformers 5 keeps rope_theta and the scaling in rope_parameters.
  defaults["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                                 {"factor", 8.0},           {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  const Config v5 = hf_llama_import_config(defaults, "config.json");
  EXPECT_EQ(v5.model.mixer["rope_base"], 500000.0);
  EXPECT_EQ(v5.model.mixer["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(v5.model.mixer["rope_scaling"]["original_max_position_embeddings"], 64);
  // Both blocks: taken when they agree, refused when each version of transformers would build
  // another model; a block whose type and rope_type disagree; rope_theta in rope_base's range.
  json both = defaults;
  both["rope_scaling"] = both["rope_parameters"];
  both["rope_scaling"].erase("rope_theta");
  both["rope_theta"] = 500000.0;
  EXPECT_EQ(config_error(both), "(accepted)");
  both["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_NE(config_error(both).find("config.json: rope_scaling: and rope_parameters describe different RoPE"),
            std::string::npos)
      << config_error(both);
  json two_types = defaults;
  two_types["rope_parameters"]["type"] = "linear";
  EXPECT_NE(config_error(two_types).find("rope_parameters.type: disagrees with rope_type"), std::string::npos)
      << config_error(two_types);
  for (const double theta : {0.0, 1e13}) {
    json t = defaults;
    t.erase("rope_parameters");
    t["rope_theta"] = theta;
    EXPECT_NE(config_error(t).find("config.json: rope_theta: must be in [1, 1e+12]"), std::string::npos)
        << config_error(t);
  }
  defaults["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 500000.0}, {"factor", 8.0}};
  EXPECT_NE(config_error(defaults).find("config.json: rope_parameters.rope_type: "), std::string::npos);
}

std::string export_error(const ModelConfig& c) {
  try {
    check_hf_llama_exportable(c, "ckpt");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfImport, ExportRefusesLayersThatDifferInKvHeadsOrRope) {
  ModelConfig c;
  c.n_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.layers = {"attention", "other"};
  c.mixers = {{"other", {{"type", "attention"}, {"kv_heads", 2}}}};
  EXPECT_NE(export_error(c).find("different kv_heads (layer 'other')"), std::string::npos) << export_error(c);
  c.mixers = {{"other", {{"type", "attention"}, {"rope_base", 500000.0}}}};
  EXPECT_NE(export_error(c).find("different rope_base or rope_scaling"), std::string::npos) << export_error(c);
  c.mixers = {{"other", {{"type", "attention"}, {"rope_scaling", {{"type", "llama3"}}}}}};
  EXPECT_NE(export_error(c).find("different rope_base or rope_scaling"), std::string::npos) << export_error(c);
  c.layers.clear();
  c.mixers = json::object();
  c.mixer = {{"kv_heads", 2}, {"rope_scaling", {{"type", "llama3"}}}};
  EXPECT_EQ(export_error(c), "(accepted)");
}

std::string import_error(const std::string& dir) {
  try {
    import_hf_llama(dir);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfImport, TensorsThatDoNotFitAreRefusedNamingTheTensor) {
  const std::string dir = test::fresh_dir("hf_bad_tensors");
  const json cfg = hf_config(false, 2, false);
  const std::vector<HfTensor> good = hf_tensors(cfg, "BF16");
  int n = 0;
  auto expect = [&](const std::vector<HfTensor>& t, const json& c, const std::string& want) {
    const std::string d = write_hf_folder(dir + "/" + std::to_string(n++), c, t);
    const std::string e = import_error(d);
    EXPECT_NE(e.find(want), std::string::npos) << want << " -> " << e;
  };
  std::vector<HfTensor> t = good;
  t.push_back(random_hf_tensor("model.layers.0.self_attn.q_proj.bias", {64}, "BF16", 1));
  expect(t, cfg, "tensor 'model.layers.0.self_attn.q_proj.bias': linac's Llama has no bias terms");
  t = good;
  t.erase(t.begin() + 5);
  expect(t, cfg, "tensor '" + good[5].name + "' (shape ");
  t = good;
  t[3] = random_hf_tensor(good[3].name, {good[3].shape[0] + 16, 64}, "BF16", 2);
  expect(t, cfg, "tensor '" + good[3].name + "': expected shape [" + std::to_string(good[3].shape[0]) + ", 64]");
  t = good;
  t.push_back(random_hf_tensor("model.extra.weight", {4}, "BF16", 3));
  expect(t, cfg, "unexpected tensor 'model.extra.weight'");
  t = good;
  t.push_back(random_hf_tensor("model.layers.1.self_attn.rotary_emb.inv_freq", {8}, "F32", 4));
  expect(t, cfg, "(accepted)");
  t = good;
  t[0] = random_hf_tensor(good[0].name, good[0].shape, "I32", 5);
  expect(t, cfg, "tensor 'model.embed_tokens.weight': dtype I32, expected F32, F16, BF16 or F64");

  // Tied: a stored lm_head is fine when it is the embedding, refused when it is not.
  json tied = cfg;
  tied["tie_word_embeddings"] = true;
  t = good;
  HfTensor& head = *std::find_if(t.begin(), t.end(), [](const HfTensor& x) { return x.name == "lm_head.weight"; });
  expect(t, tied, "tensor 'lm_head.weight' differs from model.embed_tokens.weight");
  head.bytes = t[0].bytes;
  expect(t, tied, "(accepted)");
}

TEST(HfImport, DamagedSafetensorsAreRefusedNamingTheFile) {
  const std::string dir = test::fresh_dir("hf_damaged");
  const json cfg = hf_config(true, 4, false);
  const std::vector<HfTensor> good = hf_tensors(cfg, "F16");
  int n = 0;
  auto damaged = [&](const std::function<void(std::string&)>& harm, const std::string& want) {
    const std::string d = write_hf_folder(dir + "/" + std::to_string(n++), cfg, good);
    std::string bytes = test::file_bytes(d + "/model.safetensors");
    harm(bytes);
    std::ofstream(d + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
    const std::string e = import_error(d);
    EXPECT_NE(e.find(d + "/model.safetensors: "), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << want << " -> " << e;
  };
  uint64_t header = 0;
  std::memcpy(&header, test::file_bytes(write_hf_folder(dir + "/ok", cfg, good) + "/model.safetensors").data(), 8);
  EXPECT_EQ(import_error(dir + "/ok"), "(accepted)");
  damaged([](std::string& b) { b.resize(b.size() - 10); }, "(truncated file?)");
  damaged([](std::string& b) { b.resize(20); }, "header length");
  damaged([](std::string& b) { b.resize(5); }, "no header length");
  damaged([](std::string& b) { b[8] = '#'; }, "the header is not valid JSON");
  damaged([](std::string& b) { b += "xy"; }, "2 bytes follow the last tensor's data");
  damaged(
      [&](std::string& b) {  // the embedding's range moved up by 2 bytes: overlap and a gap
        json h = json::parse(b.substr(8, header));
        h["model.embed_tokens.weight"]["data_offsets"][0] =
            h["model.embed_tokens.weight"]["data_offsets"][0].get<uint64_t>() + 2;
        h["model.embed_tokens.weight"]["data_offsets"][1] =
            h["model.embed_tokens.weight"]["data_offsets"][1].get<uint64_t>() + 2;
        std::string text = h.dump();
        text.resize(header, ' ');
        b.replace(8, header, text);
      },
      "tensor 'model.embed_tokens.weight' starts at byte 2, expected 0");
  damaged(
      [&](std::string& b) {
        json h = json::parse(b.substr(8, header));
        h["model.norm.weight"]["shape"] = {65};
        std::string text = h.dump();
        text.resize(header, ' ');
        b.replace(8, header, text);
      },
      "tensor 'model.norm.weight': data_offsets");

  // A sharded folder whose index names a shard that is not there.
  const std::string d = write_hf_folder(dir + "/sharded", cfg, good, 2);
  fs::remove(d + "/model-00002-of-00002.safetensors");
  const std::string e = import_error(d);
  EXPECT_NE(e.find("model.safetensors.index.json: weight_map."), std::string::npos) << e;
  EXPECT_NE(e.find("shard 'model-00002-of-00002.safetensors' does not exist"), std::string::npos) << e;
  EXPECT_NE(import_error(dir + "/missing").find("not a directory"), std::string::npos);
}

// A weight holding inf or NaN is refused naming the tensor and how many values; the CLI writes no
// checkpoint and leaves an existing --out as it was, --force included.
TEST(HfImport, NonFiniteWeightsAreRefusedNamingTheTensor) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("hf_nonfinite");
  const json cfg = hf_config(false, 2, false);
  const std::vector<HfTensor> good = hf_tensors(cfg, "BF16");
  auto with_bf16 = [&](const std::string& name, const std::vector<std::pair<size_t, uint16_t>>& values) {
    std::vector<HfTensor> t = good;
    HfTensor& x = *std::find_if(t.begin(), t.end(), [&](const HfTensor& h) { return h.name == name; });
    for (const auto& [i, bits] : values) std::memcpy(&x.bytes[2 * i], &bits, 2);
    return t;
  };
  const std::string nan = write_hf_folder(dir + "/nan", cfg, with_bf16("model.norm.weight", {{3, 0x7FC0}}));
  const std::string inf =
      write_hf_folder(dir + "/inf", cfg, with_bf16("model.layers.1.mlp.up_proj.weight", {{0, 0x7F80}, {17, 0xFF80}}));
  EXPECT_EQ(import_error(nan),
            nan + "/model.safetensors: tensor 'model.norm.weight' holds 1 non-finite value (inf or NaN)");
  EXPECT_EQ(import_error(inf), inf +
                                   "/model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds 2 non-finite "
                                   "values (inf or NaN)");

  const std::string ck = dir + "/m.h5";
  std::string out;
  EXPECT_EQ(test::run_linac("import --format hf " + nan + " --out " + ck, out), 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("linac import: error: " + nan + "/model.safetensors: tensor 'model.norm.weight' holds 1"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(ck));
  run_ok("import --format hf " + write_hf_folder(dir + "/good", cfg, good) + " --out " + ck);
  const std::string first = test::file_bytes(ck);
  expect_one_line_user_error("import --force --format hf " + inf + " --out " + ck);
  EXPECT_EQ(test::file_bytes(ck), first);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 4u) << "a temporary file was left in " << dir;  // nan, inf, good, m.h5
}

// ---- the CLI ------------------------------------------------------------------------------------------

TEST(HfImport, CliExitCodesAndGenerateFromIds) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("hf_cli");
  const json cfg = hf_config(false, 2, true);
  const std::string in = write_hf_folder(dir + "/in", cfg, hf_tensors(cfg, "BF16"));
  std::ofstream(in + "/tokenizer.json") << "{}";
  const std::string ck = dir + "/m.h5";
  std::string out;
  ASSERT_EQ(test::run_linac("import --format hf " + in + " --out " + ck, out), 0) << out;
  EXPECT_NE(out.find("tokenizer.json, which linac does not use"), std::string::npos) << out;
  const std::string first = test::file_bytes(ck);
  expect_one_line_user_error("import --format hf " + in + " --out " + ck);  // exists, no --force
  EXPECT_EQ(test::file_bytes(ck), first);
  expect_one_line_user_error("import " + in + " --out " + dir + "/x.h5");
  expect_one_line_user_error("import --format gguf " + in + " --out " + dir + "/x.h5");
  expect_one_line_user_error("import --format hf --out " + dir + "/x.h5");
  expect_one_line_user_error("import --format hf " + in);
  expect_one_line_user_error("import --format hf " + dir + "/nothing --out " + dir + "/x.h5");
  EXPECT_FALSE(fs::exists(dir + "/x.h5"));
  // A refused folder leaves an existing --out as it was, --force included.
  json bad = cfg;
  bad["attention_bias"] = true;
  const std::string bad_dir = write_hf_folder(dir + "/bad", bad, hf_tensors(cfg, "BF16"));
  expect_one_line_user_error("import --force --format hf " + bad_dir + " --out " + ck);
  EXPECT_EQ(test::file_bytes(ck), first);
  ASSERT_EQ(test::run_linac("import --force --format hf " + in + " --out " + ck, out), 0) << out;
  // info --json's model section is the checkpoint's: what a fine-tuning config starts from.
  ASSERT_EQ(test::run_linac("info " + ck + " --json", out), 0) << out;
  EXPECT_EQ(json::parse(out.substr(out.find('{')))["model"], CheckpointReader(ck).data().config["model"]) << out;
  // --force never replaces a file of the folder being read, nor export the checkpoint it reads;
  // an empty --out is no path.
  const std::string weights = test::file_bytes(in + "/model.safetensors");
  for (const std::string name : {"model.safetensors", "config.json"}) {
    expect_one_line_user_error("import --force --format hf " + in + " --out " + in + "/" + name);
    EXPECT_EQ(test::file_bytes(in + "/model.safetensors"), weights) << name;
  }
  expect_one_line_user_error("import --format hf " + in + " --out ''");
  fs::create_directories(dir + "/self");
  fs::copy_file(ck, dir + "/self/model.safetensors");  // a checkpoint under the name export writes
  expect_one_line_user_error("export --force --checkpoint " + dir + "/self/model.safetensors --out " + dir + "/self");
  EXPECT_EQ(test::file_bytes(dir + "/self/model.safetensors"), test::file_bytes(ck));
  // A target that is no file is refused before any file moves.
  fs::create_directories(dir + "/blocked/model.safetensors");
  expect_one_line_user_error("export --force --checkpoint " + ck + " --out " + dir + "/blocked");
  EXPECT_FALSE(fs::exists(dir + "/blocked/linac_config.json"));

  const std::string gen = "generate --checkpoint " + ck + " --device cpu --temperature 0 --max-new-tokens 6";
  ASSERT_EQ(test::run_linac(gen + " --json --prompt-ids 0,5,96,12", out), 0) << out;
  const json j = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["prompt_tokens"], json({0, 5, 96, 12}));
  const auto toks = j["sequences"][0]["tokens"].get<std::vector<int64_t>>();
  ASSERT_EQ(toks.size(), 6u);
  for (int64_t t : toks) EXPECT_TRUE(t >= 0 && t < 97) << t;
  EXPECT_TRUE(j["sequences"][0]["text"].is_null());
  const auto logits = j["prompt_last_logits"].get<std::vector<float>>();
  ASSERT_EQ(logits.size(), 97u);
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), toks[0]);
  // Without --json the text is the ids.
  ASSERT_EQ(test::run_linac(gen + " --prompt-ids 0,5,96,12", out), 0) << out;
  std::string ids;
  for (int64_t t : toks) ids += (ids.empty() ? "" : " ") + std::to_string(t);
  EXPECT_EQ(out.substr(0, ids.size() + 1), ids + "\n") << out;
  expect_one_line_user_error(gen + " --prompt-ids 1,97");
  expect_one_line_user_error(gen + " --prompt-ids 1,-2");
  expect_one_line_user_error(gen + " --prompt-ids 1,x");
  expect_one_line_user_error(gen + " --prompt hello");
  expect_one_line_user_error(gen + " --prompt-ids 1 --stop-at-eos");
  expect_one_line_user_error(gen + " --prompt-ids 1 --prompt hi");
}

}  // namespace
}  // namespace linac::test_hf_import
