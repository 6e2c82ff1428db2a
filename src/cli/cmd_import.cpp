// linac import --format hf DIR --out CKPT [--force]
#include <cstdio>
#include <filesystem>

#include "attention/attention.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "export/hf_llama_import.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac import --format hf DIR --out CKPT [--force]\n\n"
    "Reads a Hugging Face LlamaForCausalLM folder (config.json, and model.safetensors or the shards\n"
    "of model.safetensors.index.json, in F32, F16 or BF16) and writes a linac Transformer++\n"
    "checkpoint: the weights in f32 (wqkv and w13 fused from q/k/v and gate/up), a config that\n"
    "reproduces the model, step 0 and no optimizer state (eval, generate, info and export read it).\n"
    "What linac cannot compute as transformers does (biases, other architectures, RoPE scaling\n"
    "other than llama3, ...) is refused, naming the field or tensor. A SentencePiece\n"
    "DIR/tokenizer.model is embedded; tokenizer.json is not used (linac tokenises with\n"
    "SentencePiece only): give such a model token ids (generate --prompt-ids; data for eval and\n"
    "train from scripts/hf_tokenize.py and prepare --token-ids). CKPT must not\n"
    "exist unless --force; it appears only once complete.\n";

// --force replaces CKPT: never with a file of the folder being imported (its config, weights or
// tokenizer), which would be gone once the checkpoint took its place.
void refuse_out_in_model_folder(const std::string& out, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(out, ec) || !fs::equivalent(fs::absolute(out, ec).parent_path(), dir, ec)) return;
  const std::string name = fs::path(out).filename().string();
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (name == "config.json" || name == "tokenizer.model" || name == "tokenizer.json" || ends_with(".safetensors") ||
      ends_with(".safetensors.index.json"))
    throw UserError("--out: '" + out + "' is a file of the model folder being imported; give another --out");
}

}  // namespace

int cmd_import(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"force"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto format = args.get("format");
  const auto out = args.get("out");
  const bool force = args.flag("force");
  const std::vector<std::string> dirs = args.positionals();
  args.finish();
  if (!format) throw UserError("--format hf is required (see --help)");
  if (*format != "hf") throw UserError("--format must be hf (a Hugging Face Llama folder), got '" + *format + "'");
  if (dirs.size() != 1) throw UserError("give exactly one model folder DIR (see --help)");
  if (!out) throw UserError("--out CKPT is required (see --help)");
  if (out->empty()) throw UserError("--out: expected a checkpoint path, got an empty one");
  std::error_code ec;
  if (std::filesystem::is_directory(*out, ec)) throw UserError("--out: '" + *out + "' is a directory");
  if (std::filesystem::exists(*out, ec) && !force)
    throw UserError("--out: '" + *out + "' exists (use --force to replace it)");
  refuse_out_in_model_folder(*out, dirs[0]);

  const HfLlamaImport hf = import_hf_llama(dirs[0]);
  CheckpointData data;
  data.config = hf.cfg.to_json();
  data.state.seed = hf.cfg.train.seed;
  data.tokenizer = hf.tokenizer;
  save_checkpoint(*out, hf.model->params(), data);
  std::printf("wrote %s (%lld parameters, %s)\n", out->c_str(),
              static_cast<long long>(hf.model->params().total_numel()),
              hf.tokenizer.empty() ? "no tokenizer" : "SentencePiece tokenizer embedded");
  const int64_t head_dim = hf.cfg.model.head_dim();
  if (!attention_gpu_head_dim_ok(head_dim))
    std::printf(
        "note: head dim %lld: linac's GPU attention needs a multiple of 16 from 64 to 128, so this model "
        "runs on the CPU only\n",
        static_cast<long long>(head_dim));
  if (hf.hf_tokenizer_only)
    std::printf(
        "note: %s has tokenizer.json, which linac does not use (it tokenises with SentencePiece only): "
        "give this model token ids (generate --prompt-ids; for eval and train, scripts/hf_tokenize.py and "
        "linac prepare --token-ids: docs/huggingface.md \"Tokenizers\")\n",
        dirs[0].c_str());
  return 0;
}

}  // namespace linac::cli
