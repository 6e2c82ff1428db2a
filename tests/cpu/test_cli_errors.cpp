// What a new user hits on the command line: every shipped config, truncated and randomly edited,
// is either still valid or refused in one line with exit 2 (never an internal error or a crash);
// a directory as CONFIG; `--set` creating missing objects; a train.reduce_dtype it does not take;
// bf16 logits without bf16 precision;
// eval windows no longer than the tokens they score; every `bench --op` passes its option checks;
// an unknown command; --set on a checkpoint; integers beyond int64; arguments a command does not
// read; output that cannot be written.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/gpu.h"
#include "core/rng.h"
#include "mpi_run.h"
#include "test_util.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace linac::test_cli_errors {
namespace {

void expect_one_line_user_error(int rc, const std::string& out, const std::string& what) {
  EXPECT_EQ(rc, 2) << what << ": " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << what << ": " << out;
  EXPECT_NE(out.find(": error: "), std::string::npos) << what << ": " << out;
}

// One random edit: replace, delete or insert a few bytes, or duplicate a span.
std::string edit(const std::string& text, Rng& rng) {
  static const std::string kBytes = "{}[]\",:0123456789.-+eE ntfalsrux\\\n\x01\xff";
  std::string s = text;
  const size_t at = rng.below(s.size());
  const size_t len = 1 + rng.below(8);
  switch (rng.below(4)) {
    case 0:
      s[at] = kBytes[rng.below(kBytes.size())];
      break;
    case 1:
      s.erase(at, len);
      break;
    case 2:
      s.insert(at, 1, kBytes[rng.below(kBytes.size())]);
      break;
    default:
      s.insert(at, s.substr(rng.below(s.size()), len));
      break;
  }
  return s;
}

TEST(CliErrors, DamagedShippedConfigsAreRefusedInOneLine) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("config_fuzz");
  std::vector<fs::path> configs;
  for (const auto& e : fs::directory_iterator(fs::path(LINAC_TEST_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".json") configs.push_back(e.path());
  std::sort(configs.begin(), configs.end());
  ASSERT_FALSE(configs.empty());
  Rng rng{314, 1, 0};
  int refused = 0, runs = 0;
  for (const fs::path& cfg : configs) {
    std::ifstream in(cfg, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    std::string out;
    ASSERT_EQ(test::run_linac("info " + cfg.string(), out), 0) << cfg << " as shipped: " << out;
    std::vector<std::string> variants;
    const size_t body = text.rfind('}');  // cuts before the last brace are never valid JSON
    for (int i = 0; i < 4; ++i) variants.push_back(text.substr(0, rng.below(body)));
    for (int i = 0; i < 8; ++i) variants.push_back(edit(i % 2 ? edit(text, rng) : text, rng));
    for (size_t i = 0; i < variants.size(); ++i) {
      const std::string path = dir + "/" + cfg.stem().string() + "_" + std::to_string(i) + ".json";
      std::ofstream(path, std::ios::binary) << variants[i];
      const int rc = test::run_linac("info " + path, out);
      ++runs;
      if (i < 4 || rc != 0) {
        expect_one_line_user_error(rc, out, path);
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, runs / 2);
}

TEST(CliErrors, DirectoryAsConfigIsAUserError) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("config_dir");
  for (const std::string cmd : {"info ", "train ", "bench "}) {
    std::string out;
    expect_one_line_user_error(test::run_linac(cmd + dir, out), out, cmd);
    EXPECT_NE(out.find("is a directory"), std::string::npos) << out;
  }
}

// Every op of `bench --op` takes its defaults: without a GPU the one error is the missing device,
// never an option check that an op without heads (short_conv) once failed.
TEST(CliErrors, BenchOpDefaultsPassTheOptionChecks) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  if (gpu_available()) GTEST_SKIP() << "a GPU would run the benchmarks";
  for (const std::string op :
       {"attention", "attention_decode", "gla", "latte", "lightning", "short_conv", "taylor", "vq_attn"}) {
    std::string out;
    expect_one_line_user_error(test::run_linac("bench --op " + op, out), out, op);
    EXPECT_NE(out.find("bench --op needs a CUDA device"), std::string::npos) << op << ": " << out;
  }
}

// --doc-len is the attention, Taylor and VQ-attention ops' (a mean length of at least 1); the other
// ops refuse it.
TEST(CliErrors, BenchOpDocLen) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  std::string out;
  for (const std::string op : {"attention", "taylor", "vq_attn"}) {
    expect_one_line_user_error(test::run_linac("bench --op " + op + " --doc-len 0.5", out), out, op);
    EXPECT_NE(out.find("--doc-len must be at least 1"), std::string::npos) << op << ": " << out;
  }
  expect_one_line_user_error(test::run_linac("bench --op gla --doc-len 256", out), out, "gla");
  EXPECT_NE(out.find("doc-len"), std::string::npos) << out;
}

TEST(CliErrors, SetCreatesMissingObjectsAndStillRejectsUnknownKeys) {
  json doc = test::tiny_train_config("x");
  doc["model"].erase("mixer");
  apply_override(doc, "model.mixer.window=16");
  EXPECT_EQ(doc["model"]["mixer"], (json{{"window", 16}}));
  apply_override(doc, "train.new.deeper.key=true");
  EXPECT_EQ(doc["train"]["new"]["deeper"]["key"], true);
  try {
    Config::from_json(doc, "x.json");
    FAIL() << "an unknown key created by --set passed validation";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.new"), std::string::npos) << e.what();
  }
  try {
    apply_override(doc, "model.n_layers.x=1");
    FAIL() << "--set through a number";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.n_layers' is number, not an object"), std::string::npos) << e.what();
  }
}

// A value train.reduce_dtype does not take is refused in one line naming the key and the values it
// takes; bf16 is accepted (also on one rank, where nothing is reduced).
TEST(CliErrors, ReduceDtypeNamesTheValuesItTakes) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("reduce_dtype");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  std::string out;
  expect_one_line_user_error(test::run_linac("info " + cfg + " --set train.reduce_dtype=fp16", out), out, "fp16");
  EXPECT_NE(out.find("train.reduce_dtype: 'fp16' is not one of f32, bf16"), std::string::npos) << out;
  EXPECT_EQ(test::run_linac("info " + cfg + " --set train.reduce_dtype=bf16", out), 0) << out;
}

// A dtype key of train that takes bf16 only under bf16 precision (`choices` as the refusal lists
// them): an unknown value and bf16 under fp32 are each refused in one line naming the key; bf16
// under bf16 precision is taken.
void expect_bf16_dtype_key(const std::string& key, const std::string& choices) {
  const std::string dir = test::fresh_dir(key);
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  const std::string set = " --set train." + key + "=";
  std::string out;
  expect_one_line_user_error(test::run_linac("info " + cfg + set + "fp16", out), out, "fp16");
  EXPECT_NE(out.find("train." + key + ": 'fp16' is not one of " + choices), std::string::npos) << out;
  expect_one_line_user_error(test::run_linac("info " + cfg + set + "bf16 --set train.precision=fp32", out), out,
                             "train." + key);
  EXPECT_NE(out.find("bf16 needs train.precision bf16, got fp32"), std::string::npos) << out;
  EXPECT_EQ(test::run_linac("info " + cfg + set + "bf16 --set train.precision=bf16", out), 0) << out;
  EXPECT_EQ(test::run_linac("info " + cfg + " --set train.precision=fp32", out), 0) << out;
}

// train.logits_dtype takes auto, f32 or bf16, and bf16 only under bf16 precision (the logits are
// bf16 because the head's GEMM reads bf16 operands; auto is f32 there).
TEST(CliErrors, LogitsDtypeNeedsBf16Precision) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  expect_bf16_dtype_key("logits_dtype", "auto, f32, bf16");
}

// train.residual_dtype takes auto, f32 or bf16, and bf16 only under bf16 precision (the stream is
// f32 wherever the activations are; auto is f32 there).
TEST(CliErrors, ResidualDtypeNeedsBf16Precision) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  expect_bf16_dtype_key("residual_dtype", "auto, f32, bf16");
}

// Every component of a --set path must be a name: a trailing, leading or doubled dot is refused
// instead of being dropped ("train.lr." once set train.lr).
TEST(CliErrors, SetRefusesEmptyPathComponents) {
  for (const std::string bad : {"train.lr.=0.001", ".train.lr=1", "train..lr=1", "train.lr..=1"}) {
    json doc = test::tiny_train_config("x");
    try {
      apply_override(doc, bad);
      FAIL() << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("empty component"), std::string::npos) << e.what();
    }
    EXPECT_EQ(doc, test::tiny_train_config("x")) << bad;
  }
}

// A shape only the model can check (a mixer's latents over its heads, RoPE's head dim) names
// where its values came from, as the checks of the config's own fields do: the file, the --set
// that gave the value, or the file with the --set when the check reads a key of each.
TEST(CliErrors, MixerShapeErrorsNameWhereTheValuesCameFrom) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("mixer_shape");
  const std::string cfg = dir + "/tiny.json";
  json doc = test::tiny_train_config(dir + "/run");
  std::ofstream(cfg) << doc.dump(2);
  doc["model"]["arch"] = "latte";
  doc["model"]["mixer"] = {{"latents", 3}};
  std::ofstream(dir + "/latents3.json") << doc.dump(2);
  doc["model"]["mixer"] = {{"heads", 4}, {"latents", 8}};
  std::ofstream(dir + "/heads4.json") << doc.dump(2);
  const std::string rope =
      "model.n_heads: RoPE rotates pairs of a head's dims, so the head dim model.d_model / "
      "model.n_heads = 15 must be even and at most 512";
  const std::pair<std::string, std::string> cases[] = {
      {cfg + " --set model.arch=latte --set model.mixer.latents=3",
       "error: --set model.mixer.latents: 3 latents must split evenly over 2 heads"},
      {dir + "/latents3.json", "error: " + dir + "/latents3.json: model.mixer.latents: 3 latents must split"},
      {dir + "/heads4.json --set model.d_model=34",
       "error: " + dir +
           "/heads4.json with --set model.d_model: model.mixer.heads: 4 heads must divide model.d_model (34)"},
      // RoPE's head dims: odd (60 / 4 = 15) was an internal error in the kernel's check.
      {cfg + " --set model.d_model=60 --set model.n_heads=4",
       "error: --set model.n_heads, --set model.d_model: " + rope},
      {cfg + " --set model.d_model=30", "error: " + cfg + " with --set model.d_model: " + rope},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac("info " + args, out), out, args);
    EXPECT_NE(out.find(what), std::string::npos) << args << ": " << out;
  }
}

// Counts given to eval are at least 1: 0 is refused, not read as "the default".
TEST(CliErrors, EvalRefusesZeroCounts) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("eval_zero", 1);
  for (const std::string opt : {"--seq-len 0", "--seq-len -5", "--max-tokens 0", "--batch 0"}) {
    std::string out;
    expect_one_line_user_error(test::run_linac("eval --checkpoint " + ckpt + " " + opt, out), out, opt);
    EXPECT_NE(out.find("must be at least 1"), std::string::npos) << out;
  }
}

// A window longer than the tokens to score is cut to them: --seq-len 100000 with 50 tokens runs at T=50.
TEST(CliErrors, EvalWindowIsNeverLongerThanItsTokens) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("eval_window", 3);
  std::string out;
  ASSERT_EQ(
      test::run_linac("eval --checkpoint " + ckpt + " --seq-len 100000 --max-tokens 50 --split train --json", out), 0)
      << out;
  const json r = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(r["seq_len"], 50);
  EXPECT_EQ(r["tokens"], 50);
  // The same 50 targets scored in windows of 50 or of 100000 give the same loss.
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --seq-len 50 --max-tokens 50 --split train --json", out),
            0);
  EXPECT_DOUBLE_EQ(json::parse(out.substr(out.find('{')))["loss"].get<double>(), r["loss"].get<double>());
}

// An unknown command is one line like every other user error: the commands to choose from and the
// nearest one when there is one, not the whole usage.
TEST(CliErrors, UnknownCommandIsOneLineNamingTheCommands) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string commands =
      " (commands: prepare, train, eval, info, generate, export, import, bench; linac --help)\n";
  std::string out;
  EXPECT_EQ(test::run_linac("trian x.json", out), 2) << out;
  EXPECT_EQ(out, "linac: error: unknown command 'trian'; did you mean 'train'?" + commands);
  EXPECT_EQ(test::run_linac("frobnicate", out), 2) << out;
  EXPECT_EQ(out, "linac: error: unknown command 'frobnicate'" + commands);
}

// A checkpoint's model is the one its weights were trained as: info refuses --set model keys on
// it, and takes its run settings (the memory plan of another micro-batch).
TEST(CliErrors, InfoRefusesSetOnACheckpointsModel) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("info_ckpt_set", 1);
  std::string out;
  expect_one_line_user_error(test::run_linac("info " + ckpt + " --set model.n_layers=3", out), out, "--set");
  EXPECT_NE(out.find("linac info: error: --set model.n_layers=3: a checkpoint's model is the one its weights"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::run_linac("info " + ckpt + " --set train.micro_batch=2", out), 0) << out;  // planning a run
  EXPECT_NE(out.find("2 layers"), std::string::npos) << out;
}

// An integer option beyond int64 is refused echoing what was typed, never the clamped value.
TEST(CliErrors, IntegersOutOfRangeEchoTheTextTyped) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("int_range");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  for (const std::string big : {"99999999999999999999", "-99999999999999999999"}) {
    std::string out;
    expect_one_line_user_error(test::run_linac("info " + cfg + " --ranks " + big, out), out, big);
    EXPECT_NE(out.find("option --ranks expects an integer, got '" + big + "' (out of range)"), std::string::npos)
        << out;
    expect_one_line_user_error(test::run_linac("bench --generate " + cfg + " --batch 1," + big, out), out, big);
    EXPECT_NE(out.find("--batch: expected positive integers separated by commas, got '1," + big + "'"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("922337203685477580"), std::string::npos) << out;
  }
}

}  // namespace
// What a command does not read is refused, never ignored: a positional it takes none of, a
// single-dash word, an option given twice that it reads once; and output it cannot write (a full
// disk, a closed stdout) ends it with exit 2 like any failed write.
TEST(CliErrors, WhatACommandDoesNotReadAndOutputItCannotWriteAreErrors) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("unread_args", 1);
  const std::string dir = test::fresh_dir("unread_args_out");
  const std::pair<std::string, std::string> cases[] = {
      {"eval --checkpoint " + ckpt + " junk", "unexpected argument 'junk' for 'linac eval'"},
      {"eval junk --checkpoint " + ckpt, "unexpected argument 'junk' for 'linac eval'"},
      {"eval --checkpoint " + ckpt + " -j", "unknown option -j for 'linac eval' (options begin with --"},
      {"eval --checkpoint " + ckpt + " --checkpoint other.h5",
       "option --checkpoint is given 2 times ('" + ckpt + "', 'other.h5'); give it once"},
      {"generate --checkpoint " + ckpt + " --prompt a --prompt b", "option --prompt is given 2 times"},
      {"export --checkpoint " + ckpt + " --out " + dir + "/x junk", "unexpected argument 'junk' for 'linac export'"},
      {"bench --generate " + ckpt + " cfg.json", "unexpected argument 'cfg.json' for 'linac bench'"},
      // An option of another form of the command is named as such, not as unknown.
      {"bench --generate " + ckpt + " --seq-lens 64",
       "--seq-lens does not apply to this form of 'linac bench' (see --help for the one it belongs to)"},
      {"eval --checkpoint " + ckpt + " --bogus 1", "unknown option --bogus for 'linac eval' (see --help)"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac(args, out), out, args);
    EXPECT_NE(out.find(what), std::string::npos) << args << ": " << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/x"));
  const std::string bin = std::getenv("LINAC_BIN");
  for (const std::string& redirect : {">/dev/full", ">&-"}) {
    std::string out;
    // stderr to the pipe (fd 3), stdout away: the error line is what comes back.
    const int rc = test::run_shell(
        "{ " + bin + " eval --checkpoint " + ckpt + " --json --max-tokens 100 2>&3 " + redirect + "; } 3>&1", out);
    EXPECT_EQ(rc, 2) << redirect << ": " << out;
    // The last line (a progress line may come before it on a slow machine).
    const size_t last = out.rfind('\n', out.size() - 2);
    EXPECT_EQ(
        out.find("linac eval: error: cannot write to standard output: ", last == std::string::npos ? 0 : last + 1),
        last == std::string::npos ? 0 : last + 1)
        << redirect << ": " << out;
    // The top-level help as well.
    EXPECT_EQ(test::run_shell("{ " + bin + " --help 2>&3 " + redirect + "; } 3>&1", out), 2) << redirect << ": " << out;
    EXPECT_EQ(out.rfind("linac: error: cannot write to standard output: ", 0), 0u) << redirect << ": " << out;
  }
}

// Messages about what the user gave, not what the program assumed: a checkpoint given as a
// config, a --seq-lens that the default micro-batch does not divide (no --micro-tokens was
// given), zero tokens per step, a run's directory given as a checkpoint, data of another
// vocabulary for a checkpoint (whose model.vocab_size cannot change).
// Text that is not one config: a key twice (the parser kept the last), nesting that overflowed
// the stack when quoted, a NUL (the parser stopped there), nothing at all, bytes that are not
// UTF-8 in a --set value (the run could not record them), a number past int64's range (it
// wrapped), and a huge value (quoted whole).
TEST(CliErrors, ConfigTextThatIsNotOneConfigIsRefused) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("config_text");
  const std::string good = test::tiny_train_config(dir + "/run").dump();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
    return dir + "/" + name;
  };
  const std::string body = good.substr(0, good.size() - 1);  // without the closing brace
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::pair<std::string, std::string> cases[] = {
      {"info " + write("dup.json", body + R"(,"train":{"steps":1}})"),
       "dup.json: key 'train' appears twice in one object"},
      {"info " + write("deep.json", body + R"(,"x":)" + deep + "}"), "deep.json: nested deeper than 32 levels"},
      {"info " + write("nul.json", good + std::string(1, '\0') + "{{"), "nul.json: holds a NUL byte"},
      {"info " + write("empty.json", " \n"), "empty.json: empty, not a JSON config"},
      {"info " + write("comma.json", body + ",}"), "comma.json: invalid JSON: parse error at line 1"},
      {"info " + write("c.json", good) + " --set 'train.steps=" + deep + "'",
       "--set train.steps: nested deeper than 32"},
      {"info " + dir + "/c.json --set train.out_dir=run$(printf '\\377')",
       "--set train.out_dir: the value is not UTF-8"},
      {"info " + dir + "/c.json --set train.seed=18446744073709551615", "got 18446744073709551615"},
      {"info " + dir + "/c.json --set train.schedule=" + std::string(5000, 'x'), "(5000 bytes)' is not one of"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac(args, out), out, args.substr(0, 80));
    EXPECT_NE(out.find(what), std::string::npos) << args.substr(0, 80) << ": " << out.substr(0, 300);
    EXPECT_EQ(out.find("json.exception"), std::string::npos) << out.substr(0, 300);
    EXPECT_LT(out.size(), 400u) << args.substr(0, 80);
  }
}

TEST(CliErrors, MessagesNameWhatWasGiven) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string ckpt = test::tiny_checkpoint("named_inputs", 1);
  const std::string dir = test::fresh_dir("named_inputs_cfg");
  const std::string cfg = dir + "/cfg.json";
  std::ofstream(cfg) << test::tiny_train_config(dir + "/run").dump(2);
  const std::string run_dir = fs::path(ckpt).parent_path().parent_path().string();
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 200; ++i) text << "line " << i << " of a text with other words, numbers and pieces.\n\n";
  }
  std::string prep;
  ASSERT_EQ(
      test::run_linac("prepare --input " + dir + "/text.txt --out " + dir + "/v320.h5 --vocab-size 320 --quiet", prep),
      0)
      << prep;
  const std::pair<std::string, std::string> cases[] = {
      {"bench " + ckpt, ckpt + ": an HDF5 file (a checkpoint or a token dataset), not a JSON config"},
      {"train " + ckpt, ckpt + ": an HDF5 file"},
      {"bench " + cfg + " --seq-lens 48",
       "--seq-lens 48: the default micro-batch (train.micro_batch x data.seq_len = "
       "128 tokens) is no multiple of it; pass --micro-tokens N"},
      {"bench " + cfg + " --seq-lens 48 --micro-tokens 100", "--micro-tokens (100) must be a multiple of T=48"},
      {"bench " + cfg + " --tokens-per-step 0", "--micro-tokens and --tokens-per-step must be at least 1"},
      {"train " + cfg + " --resume ''", "--resume is empty; give auto or a checkpoint's path"},
      {"train " + cfg + " --set train.out_dir=", "error: --set train.out_dir: is empty"},
      {"train " + cfg + " --set train.out_dir=" + cfg,
       "error: --set train.out_dir: '" + cfg + "' exists and is not a directory"},
      {"train " + cfg + " --set train.steps=0", "error: --set train.steps: must be in [1, "},
      {"train " + cfg + " --set data.mqar.vocab=8",
       "error: " + cfg + " with --set data.mqar.vocab: data.mqar: applies to data.type 'mqar' only"},
      {"eval --checkpoint " + run_dir, run_dir + ": a directory, not a checkpoint (a checkpoint is a step_*.h5 file"},
      {"eval --checkpoint " + run_dir + "/ckpt", "a directory, not a checkpoint"},
      {"eval --checkpoint " + ckpt + " --data " + dir + "/v320.h5",
       dir + "/v320.h5 has vocab_size 320 but " + ckpt + "'s model has 300: score it on data of its own tokenizer"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac(args, out), out, args);
    EXPECT_NE(out.find(what), std::string::npos) << args << ": " << out;
  }
}

// A value a --set gave is blamed on the --set, not on the file that never held it: the key
// itself, a key inside the object it set, or an object holding the key it set. What the file
// holds is still blamed on the file, and a check across keys names both the file and the --set.
TEST(CliErrors, SetValuesAreBlamedOnTheSet) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("set_blame");
  const std::string cfg = dir + "/cfg.json";
  json doc = test::tiny_train_config(dir + "/run");
  std::ofstream(cfg) << doc.dump(2);
  doc["train"]["lr"] = -1;  // the file's own mistake
  std::ofstream(dir + "/bad_lr.json") << doc.dump(2);
  const std::pair<std::string, std::string> cases[] = {
      {cfg + " --set model.n_layers=0", "error: --set model.n_layers: must be in [1, 1024], got 0"},
      {cfg + " --set train.lrr=0.1", "error: --set train.lrr: unknown key 'train.lrr' (did you mean 'train.lr'?)"},
      {dir + "/bad_lr.json --set model.n_layers=2",
       "error: " + dir + "/bad_lr.json: train.lr: must be in [0, 10], got -1"},
      {cfg + " --set 'model.mixer={\"window\":-1}'", "error: --set model.mixer: model.mixer.window: must be in [0, "},
      {cfg + " --set model.mixers.foo.window=3",
       "error: --set model.mixers.foo.window: model.mixers.foo: 'foo' is not a "},
      {cfg + " --set train.lr=0", "error: --set train.lr: must be > 0"},
      {cfg + " --set model.d_model=33",
       "error: " + cfg + " with --set model.d_model: model.n_heads: must divide model.d_model (33), got 2"},
      {cfg + " --set model.n_heads=3 --set model.d_model=40",
       "error: --set model.n_heads, --set model.d_model: model.n_heads: must divide model.d_model (40), got 3"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac("info " + args, out), out, args);
    EXPECT_NE(out.find(what), std::string::npos) << args << ": " << out;
  }
}

// Options that configure something the config turned off are refused, naming the option;
// numbers are quoted as written (5, not 5.000000); null reads as absent.
TEST(CliErrors, OptionsThatDoNotApplyAreRefused) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("not_apply");
  const std::string cfg = dir + "/cfg.json";
  json doc = test::tiny_train_config(dir + "/run");
  doc["model"]["mixer"] = {{"rope", false}, {"rope_base", 5000}};
  std::ofstream(cfg) << doc.dump(2);
  doc["model"]["mixer"] = {{"rope_scaling", {{"factor", 4}, {"low_freq_factor", 5}}}};
  std::ofstream(dir + "/scaling.json") << doc.dump(2);
  doc["model"].erase("mixer");
  doc["data"]["mqar"] = nullptr;
  std::ofstream(dir + "/null.json") << doc.dump(2);
  const std::pair<std::string, std::string> cases[] = {
      {cfg, cfg + ": model.mixer.rope_base: does not apply with \"rope\": false"},
      {cfg + " --set model.mixer.rope_base=null --set 'model.mixer.rope_scaling={\"factor\":4}'",
       "error: --set model.mixer.rope_scaling: does not apply with \"rope\": false"},
      {dir + "/scaling.json", "model.mixer.rope_scaling.high_freq_factor: must be larger than low_freq_factor (5)"},
      {dir + "/null.json --set model.arch=latte --set 'model.mixer={\"vapor\":false,\"rope_base\":100}'",
       "model.mixer.rope_base: does not apply without VAPOR or a local window"},
      {dir + "/null.json --set model.arch=based --set model.mixers.taylor.heads=3",
       dir + "/null.json with --set model.mixers.taylor.heads: model.mixers.taylor.heads: 3 heads must divide "
             "model.d_model (32)"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    expect_one_line_user_error(test::run_linac("info " + args, out), out, args);
    EXPECT_NE(out.find(what), std::string::npos) << args << ": " << out;
  }
  std::string out;
  EXPECT_EQ(test::run_linac("info " + dir + "/null.json", out), 0) << out;
  EXPECT_EQ(test::run_linac("info " + cfg + " --set model.mixer.rope=true", out), 0) << out;
}

}  // namespace linac::test_cli_errors
