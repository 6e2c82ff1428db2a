// linac generate and linac export end to end on a tiny trained checkpoint: greedy and seeded
// generation repeat, the streamed text is the JSON's, the log-probabilities of generated tokens
// are the full forward's, batches draw per sequence; safetensors and hf exports read back through
// an independent reader in this file (header JSON, dtypes, offsets, values); bad input is one
// line and exit 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/buffer.h"
#include "export/hf_llama.h"
#include "export/safetensors.h"
#include "model/model.h"
#include "model/param_store.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_cli_generate {
namespace {

// A checkpoint of the tiny transformer after 3 steps (once per process and tying).
const std::string& tiny_checkpoint(bool tied) {
  static std::string path[2];
  std::string& p = path[tied ? 1 : 0];
  if (p.empty()) {
    const std::string dir = test::fresh_dir(tied ? "gen_ckpt_tied" : "gen_ckpt");
    json j = test::tiny_train_config(dir);
    j["train"]["steps"] = 3;
    j["model"]["tie_embeddings"] = tied;
    if (run_training(Config::from_json(j, "tiny"), "") != 0) throw std::runtime_error("tiny training failed");
    p = test::latest_checkpoint_path(dir);
  }
  return p;
}

json generate_json(const std::string& args) {
  std::string out;
  const int rc = test::run_linac("generate --checkpoint " + tiny_checkpoint(false) + " --json " + args, out);
  EXPECT_EQ(rc, 0) << out;
  return json::parse(out.substr(out.find('{')));
}

void expect_one_line_user_error(const std::string& args) {
  std::string out;
  EXPECT_EQ(test::run_linac(args, out), 2) << args << ": " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << args << ": " << out;
  EXPECT_NE(out.find(": error: "), std::string::npos) << args << ": " << out;
}

// ---- an independent safetensors reader -----------------------------------------------------

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct StFile {
  json metadata;
  std::map<std::string, StTensor> tensors;
};

StFile read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), {});
  EXPECT_GE(all.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(all[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  EXPECT_LE(8 + n, all.size());
  const json h = json::parse(all.substr(8, n));
  const std::string data = all.substr(8 + n);
  StFile out;
  uint64_t expect_begin = 0;
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      out.metadata = it.value();
      continue;
    }
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    by_offset.push_back({b, it.key()});
    StTensor t{it.value()["dtype"], it.value()["shape"].get<std::vector<int64_t>>(), {}};
    int64_t numel = 1;
    for (int64_t s : t.shape) numel *= s;
    const uint64_t elem = t.dtype == "F64" ? 8 : t.dtype == "BF16" ? 2 : 4;
    EXPECT_EQ(e - b, static_cast<uint64_t>(numel) * elem) << it.key();
    EXPECT_LE(e, data.size()) << it.key();
    t.bytes = data.substr(b, e - b);
    out.tensors[it.key()] = t;
  }
  std::sort(by_offset.begin(), by_offset.end());
  for (const auto& [b, name] : by_offset) {  // back to back, no gaps or overlaps, whole data used
    EXPECT_EQ(b, expect_begin) << name;
    expect_begin = b + out.tensors[name].bytes.size();
  }
  EXPECT_EQ(expect_begin, data.size());
  return out;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.ptr), t.nbytes()); }

// ---- generate --------------------------------------------------------------------------------

TEST(CliGenerate, GreedyRepeatsAndScoresItsTokensAsTheForward) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const json a = generate_json("--prompt 'the cat' --temperature 0 --max-new-tokens 12");
  const json b = generate_json("--prompt 'the cat' --temperature 0 --max-new-tokens 12");
  EXPECT_EQ(a["sequences"], b["sequences"]);
  const auto prompt = a["prompt_tokens"].get<std::vector<int32_t>>();
  const auto gen = a["sequences"][0]["tokens"].get<std::vector<int32_t>>();
  const auto lp = a["sequences"][0]["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(gen.size(), 12u);
  ASSERT_EQ(lp.size(), 12u);

  // The full forward over prompt + generated tokens gives each generated token the same log-prob.
  const CheckpointReader reader(tiny_checkpoint(false));
  const Config cfg = Config::from_json(reader.data().config, "ckpt");
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  reader.load_params(model.params(), false);
  const int64_t T = static_cast<int64_t>(prompt.size() + gen.size()) - 1;
  model.reserve(1, T);
  OwnedTensor tokens(DType::I32, Device::CPU, {1, T}), targets(DType::I32, Device::CPU, {1, T});
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  for (int64_t t = 0; t < T; ++t) tokens->data<int32_t>()[t] = all[static_cast<size_t>(t)];
  for (size_t i = 0; i < gen.size(); ++i) {
    std::fill_n(targets->data<int32_t>(), T, -1);
    const int64_t pos = static_cast<int64_t>(prompt.size() + i) - 1;
    targets->data<int32_t>()[pos] = gen[i];
    EXPECT_NEAR(-model.forward_loss(tokens, targets), lp[i], 1e-4) << "token " << i;
  }
  // Greedy: the first token is the argmax of the prompt's logits.
  const auto logits = a["prompt_last_logits"].get<std::vector<float>>();
  ASSERT_EQ(static_cast<int64_t>(logits.size()), cfg.model.vocab_size);
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), gen[0]);
}

TEST(CliGenerate, SeededSamplingRepeatsAndBatchesDrawPerSequence) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string opts = "--prompt 'a dog' --temperature 1 --top-k 50 --top-p 0.95 --max-new-tokens 16";
  const json a = generate_json(opts + " --seed 3"), b = generate_json(opts + " --seed 3");
  const json c = generate_json(opts + " --seed 4");
  EXPECT_EQ(a["sequences"], b["sequences"]);
  EXPECT_NE(a["sequences"][0]["tokens"], c["sequences"][0]["tokens"]);
  const json batch = generate_json(opts + " --seed 3 --batch 3");
  ASSERT_EQ(batch["sequences"].size(), 3u);
  EXPECT_EQ(batch["sequences"][0]["tokens"], a["sequences"][0]["tokens"]);
  EXPECT_NE(batch["sequences"][1]["tokens"], batch["sequences"][0]["tokens"]);
}

TEST(CliGenerate, StreamedTextIsTheGeneratedText) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string prompt = test::fresh_dir("gen_prompt") + "/p.txt";
  std::ofstream(prompt) << "the cat sat";
  const std::string opts = " --prompt-file " + prompt + " --temperature 0 --max-new-tokens 10";
  const json j = generate_json(opts);
  std::string out;
  ASSERT_EQ(test::run_linac("generate --checkpoint " + tiny_checkpoint(false) + opts, out), 0) << out;
  const std::string text = j["sequences"][0]["text"];
  EXPECT_EQ(out.substr(0, text.size() + 1), text + "\n") << out;
}

TEST(CliGenerate, BadInputIsOneLineAndExit2) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ck = " --checkpoint " + tiny_checkpoint(false);
  expect_one_line_user_error("generate --prompt x");
  expect_one_line_user_error("generate" + ck);
  expect_one_line_user_error("generate" + ck + " --prompt x --prompt-file y");
  expect_one_line_user_error("generate" + ck + " --prompt-file /nonexistent/p.txt");
  expect_one_line_user_error("generate" + ck + " --prompt x --temperature -1");
  expect_one_line_user_error("generate" + ck + " --prompt x --top-p 1.5");
  expect_one_line_user_error("generate" + ck + " --prompt x --top-k -1");
  expect_one_line_user_error("generate" + ck + " --prompt x --batch 0");
  // What only a draw uses is refused under greedy decoding, not ignored.
  for (const char* draw : {" --top-k 5", " --top-p 0.5", " --seed 7"}) {
    expect_one_line_user_error("generate" + ck + " --prompt x --temperature 0" + draw);
    std::string out;
    test::run_linac("generate" + ck + " --prompt x --temperature 0" + draw, out);
    EXPECT_NE(out.find("applies to sampling, and --temperature 0 decodes greedily"), std::string::npos) << out;
  }
  expect_one_line_user_error("generate" + ck + " --prompt x --device tpu");
  expect_one_line_user_error("generate --checkpoint /nonexistent.h5 --prompt x");
  const std::string out = " --out " + test::fresh_dir("export_bad");
  expect_one_line_user_error("export" + ck + out + " --format onnx");
  expect_one_line_user_error("export" + ck);
  expect_one_line_user_error("export --format hf" + out);
}

// --prompt-file takes a text file: a directory (once read as an empty prompt) and a binary file (a
// checkpoint given by mistake, once an internal error) are refused naming the file, as prepare
// refuses a binary input; neither is changed.
TEST(CliGenerate, PromptFileMustBeText) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ck = tiny_checkpoint(false), dir = test::fresh_dir("gen_prompt_file");
  const std::string ck_bytes = test::file_bytes(ck);
  const struct {
    std::string path, message;
  } cases[] = {{dir, "--prompt-file " + dir + " is a directory, not a text file"},
               {ck, "--prompt-file " + ck + ": not a text file (it holds NUL bytes)"}};
  for (const auto& c : cases) {
    std::string out;
    EXPECT_EQ(test::run_linac("generate --checkpoint " + ck + " --max-new-tokens 2 --prompt-file " + c.path, out), 2)
        << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_NE(out.find("linac generate: error: " + c.message), std::string::npos) << out;
  }
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_EQ(test::file_bytes(ck), ck_bytes);
  // A pipe gives its bytes once: the prompt read from one is the file's, not an empty one.
  const std::string text = dir + "/prompt.txt";
  std::ofstream(text) << "the cat sees the ball today.";
  auto prompt_tokens = [&](const std::string& prefix, const std::string& file) {
    std::string out;
    EXPECT_EQ(test::run_linac("generate --checkpoint " + ck + " --json --max-new-tokens 1 --prompt-file " + file, out,
                              prefix),
              0)
        << out;
    return json::parse(out.substr(out.find('{')))["prompt_tokens"];
  };
  const json from_file = prompt_tokens("", text);
  EXPECT_GT(from_file.size(), 4u) << from_file;
  EXPECT_EQ(prompt_tokens("cat " + text + " |", "/dev/stdin"), from_file);
}

// ---- export ----------------------------------------------------------------------------------

// Like `prepare`, export refuses an output that holds something unless --force is given; a
// refused or failed export leaves the directory as it was, and --force replaces only its own
// files.
TEST(CliExport, NonEmptyOutputNeedsForce) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("export_force");
  std::string out;
  ASSERT_EQ(test::run_linac("export --checkpoint " + tiny_checkpoint(false) + " --out " + dir, out), 0) << out;
  const std::string first = test::file_bytes(dir + "/model.safetensors");
  std::ofstream(dir + "/notes.txt") << "mine";
  for (const bool tied : {false, true}) {
    expect_one_line_user_error("export --checkpoint " + tiny_checkpoint(tied) + " --out " + dir);
    EXPECT_EQ(test::file_bytes(dir + "/model.safetensors"), first);
  }
  test::run_linac("export --checkpoint " + tiny_checkpoint(true) + " --out " + dir, out);
  EXPECT_NE(out.find("exists and is not empty (use --force"), std::string::npos) << out;
  ASSERT_EQ(test::run_linac("export --force --checkpoint " + tiny_checkpoint(true) + " --out " + dir, out), 0) << out;
  EXPECT_NE(test::file_bytes(dir + "/model.safetensors"), first);
  EXPECT_EQ(test::file_bytes(dir + "/notes.txt"), "mine");
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename().string().find(".export.tmp-") == 0 ? 100 : 1;
  EXPECT_EQ(entries, 4u) << "model.safetensors, linac_config.json, tokenizer.model, notes.txt and no staging folder";
  // A file as --out, and an export that fails while writing (a 1 KiB file size limit), change
  // nothing.
  expect_one_line_user_error("export --checkpoint " + tiny_checkpoint(false) + " --out " + dir + "/notes.txt");
  const std::string fresh = test::fresh_dir("export_full") + "/out";
  EXPECT_EQ(test::run_linac("export --checkpoint " + tiny_checkpoint(false) + " --out " + fresh, out, "ulimit -f 1;"),
            2)
      << out;
  EXPECT_FALSE(fs::exists(fresh)) << "a failed export left its directory behind";
}

TEST(CliExport, SafetensorsHoldEveryParameterUnderItsName) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("export_st");
  std::string out;
  ASSERT_EQ(test::run_linac("export --checkpoint " + tiny_checkpoint(false) + " --out " + dir, out), 0) << out;
  const StFile st = read_safetensors(dir + "/model.safetensors");
  const CheckpointReader reader(tiny_checkpoint(false));
  const Config cfg = Config::from_json(reader.data().config, "ckpt");
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  reader.load_params(model.params(), false);
  const ParamStore& ps = model.params();
  ASSERT_EQ(static_cast<int>(st.tensors.size()), ps.count() + ps.buffer_count());
  for (int i = 0; i < ps.count(); ++i) {
    const std::string& name = ps.spec(i).name;
    ASSERT_TRUE(st.tensors.count(name)) << name;
    const StTensor& t = st.tensors.at(name);
    EXPECT_EQ(t.dtype, "F32") << name;
    EXPECT_EQ(t.shape, ps.spec(i).shape) << name;
    EXPECT_TRUE(t.bytes == bytes_of(ps.master(i))) << name << " values differ";
  }
  EXPECT_EQ(json::parse(st.metadata["linac_config"].get<std::string>()), cfg.to_json());
  std::ifstream tm(dir + "/tokenizer.model", std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(tm)), {}), reader.data().tokenizer);
}

TEST(CliExport, HfLlamaFolderSplitsTheFusedProjections) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied);
    const std::string dir = test::fresh_dir(tied ? "export_hf_tied" : "export_hf");
    std::string out;
    ASSERT_EQ(test::run_linac("export --format hf --checkpoint " + tiny_checkpoint(tied) + " --out " + dir, out), 0)
        << out;
    const CheckpointReader reader(tiny_checkpoint(tied));
    const Config cfg = Config::from_json(reader.data().config, "ckpt");
    Model model(cfg.model, Ctx{}, {.precision = "fp32"});
    reader.load_params(model.params(), false);
    const ParamStore& ps = model.params();
    std::ifstream cf(dir + "/config.json");
    const json hf = json::parse(cf);
    EXPECT_EQ(hf["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(hf["hidden_size"], cfg.model.d_model);
    EXPECT_EQ(hf["intermediate_size"], cfg.model.ffn_dim());
    EXPECT_EQ(hf["num_hidden_layers"], cfg.model.n_layers);
    EXPECT_EQ(hf["num_attention_heads"], cfg.model.n_heads);
    EXPECT_EQ(hf["num_key_value_heads"], cfg.model.n_heads);
    EXPECT_EQ(hf["vocab_size"], cfg.model.vocab_size);
    EXPECT_EQ(hf["tie_word_embeddings"], tied);
    EXPECT_DOUBLE_EQ(hf["rms_norm_eps"].get<double>(), cfg.model.norm_eps);
    const StFile st = read_safetensors(dir + "/model.safetensors");
    const int64_t d = cfg.model.d_model, F = cfg.model.ffn_dim(), L = cfg.model.n_layers;
    EXPECT_EQ(static_cast<int64_t>(st.tensors.size()), 2 + 9 * L + (tied ? 0 : 1));
    EXPECT_EQ(st.tensors.count("lm_head.weight"), tied ? 0u : 1u);
    auto expect_rows = [&](const std::string& hf_name, const std::string& ours, int64_t r0, int64_t r1) {
      ASSERT_TRUE(st.tensors.count(hf_name)) << hf_name;
      const Tensor w = ps.master(ps.find(ours)).slice0(r0, r1);
      EXPECT_EQ(st.tensors.at(hf_name).shape, w.dims()) << hf_name;
      EXPECT_TRUE(st.tensors.at(hf_name).bytes == bytes_of(w)) << hf_name << " values differ";
    };
    const int64_t V = cfg.model.vocab_size;
    expect_rows("model.embed_tokens.weight", "embed.weight", 0, V);
    expect_rows("model.norm.weight", "norm_f.weight", 0, d);
    if (!tied) expect_rows("lm_head.weight", "head.weight", 0, V);
    for (int64_t l = 0; l < L; ++l) {
      const std::string o = "layers." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
      expect_rows(h + "self_attn.q_proj.weight", o + "attn.wqkv", 0, d);
      expect_rows(h + "self_attn.k_proj.weight", o + "attn.wqkv", d, 2 * d);
      expect_rows(h + "self_attn.v_proj.weight", o + "attn.wqkv", 2 * d, 3 * d);
      expect_rows(h + "self_attn.o_proj.weight", o + "attn.wo", 0, d);
      expect_rows(h + "mlp.gate_proj.weight", o + "mlp.w13", 0, F);
      expect_rows(h + "mlp.up_proj.weight", o + "mlp.w13", F, 2 * F);
      expect_rows(h + "mlp.down_proj.weight", o + "mlp.w2", 0, d);
      expect_rows(h + "input_layernorm.weight", o + "norm1.weight", 0, d);
      expect_rows(h + "post_attention_layernorm.weight", o + "norm2.weight", 0, d);
    }
  }
}

TEST(CliExport, HfNeedsTransformerPlusPlus) {
  ModelConfig c;
  c.arch = "gla";
  EXPECT_THROW(check_hf_llama_exportable(c, "x"), UserError);
  c.arch = "transformer";
  c.layers = {"attention", "sliding_window"};
  c.n_layers = 2;
  EXPECT_THROW(check_hf_llama_exportable(c, "x"), UserError);
  c.layers.clear();
  EXPECT_NO_THROW(check_hf_llama_exportable(c, "x"));
  // Llama's head has no bias, no scale and always the final norm: such a model would come back
  // with other logits.
  for (const auto& change : std::vector<std::function<void(ModelConfig&)>>{
           [](ModelConfig& m) { m.head_bias = true; }, [](ModelConfig& m) { m.logit_scale = 0.5; },
           [](ModelConfig& m) { m.final_norm = false; }}) {
    ModelConfig m = c;
    change(m);
    try {
      check_hf_llama_exportable(m, "x");
      ADD_FAILURE() << "exported a head Llama does not have";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("changes the LM head"), std::string::npos) << e.what();
    }
  }
}

TEST(Safetensors, WriterRoundTripsDtypesShapesAndMetadata) {
  const std::string dir = test::fresh_dir("st_unit");
  OwnedTensor a(DType::F32, Device::CPU, {3, 5}), b(DType::BF16, Device::CPU, {7}), c(DType::I32, Device::CPU, {2, 1, 3});
  OwnedTensor e(DType::F64, Device::CPU, {1});
  test::fill_random(a, 1, -1, 1);
  for (int64_t i = 0; i < 7; ++i) b->data<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + i);
  for (int64_t i = 0; i < 6; ++i) c->data<int32_t>()[i] = static_cast<int32_t>(i * 1000 - 2500);
  e->data<double>()[0] = -1.25;
  write_safetensors(dir + "/x.safetensors", {{"a", a}, {"b.bf", b}, {"c", c}, {"e", e}}, {{"k", "v\"q"}});
  const StFile st = read_safetensors(dir + "/x.safetensors");
  ASSERT_EQ(st.tensors.size(), 4u);
  EXPECT_EQ(st.metadata["k"], "v\"q");
  EXPECT_EQ(st.tensors.at("a").dtype, "F32");
  EXPECT_EQ(st.tensors.at("b.bf").dtype, "BF16");
  EXPECT_EQ(st.tensors.at("c").dtype, "I32");
  EXPECT_EQ(st.tensors.at("e").dtype, "F64");
  EXPECT_EQ(st.tensors.at("c").shape, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_TRUE(st.tensors.at("a").bytes == bytes_of(a));
  EXPECT_TRUE(st.tensors.at("b.bf").bytes == bytes_of(b));
  EXPECT_TRUE(st.tensors.at("c").bytes == bytes_of(c));
  EXPECT_TRUE(st.tensors.at("e").bytes == bytes_of(e));
  EXPECT_THROW(write_safetensors(dir + "/y.safetensors", {{"a", a}, {"a", b}}, {}), UserError);
}

}  // namespace
}  // namespace linac::test_cli_generate
