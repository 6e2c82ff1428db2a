// linac import --format hf against export: a random linac checkpoint exported and imported again
// has the same model config and every parameter bit for bit (tied and untied, MHA, GQA and MQA,
// with and without Llama 3 RoPE scaling, with an embedded SentencePiece model); a Hugging Face
// folder written here by hand (F32, F16 with subnormals, BF16; one file or sharded) imports and
// exports back to exactly its values. What import and export refuse: test_hf_import_refusals.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "data/token_dataset.h"
#include "export/hf_llama.h"
#include "export/hf_llama_import.h"
#include "export/safetensors.h"
#include "hf_fixture.h"
#include "model/model.h"
#include "model/param_store.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train_fixture.h"

namespace linac::test_hf_import {
namespace {

using namespace test::hf;

// ---- linac -> hf -> linac ----------------------------------------------------------------------

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

}  // namespace
}  // namespace linac::test_hf_import
