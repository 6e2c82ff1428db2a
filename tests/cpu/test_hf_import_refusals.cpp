// What linac import --format hf and export refuse, each with one line naming its field, tensor or
// file: Llama configs linac cannot represent, models export cannot write, tensors that do not fit,
// damaged safetensors, weights holding inf or NaN (no checkpoint written, an existing --out left
// as it was); the CLI's exit codes; generate --prompt-ids on a checkpoint without a tokenizer.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "export/hf_llama.h"
#include "export/hf_llama_import.h"
#include "hf_fixture.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_hf_import_refusals {
namespace {

using namespace test::hf;

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
}  // namespace linac::test_hf_import_refusals
