// linac export --checkpoint CKPT --out DIR [--format safetensors|hf]
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "data/tokenizer.h"
#include "export/hf_llama.h"
#include "export/safetensors.h"
#include "model/model.h"
#include "model/param_store.h"
#include "train/checkpoint.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac export --checkpoint CKPT --out DIR [--format safetensors|hf]\n\n"
    "safetensors (default): DIR/model.safetensors with every parameter (and model buffer) under\n"
    "its linac name and shape, in f32, the linac config in its metadata (key linac_config) and\n"
    "in DIR/linac_config.json.\n"
    "hf: a Hugging Face LlamaForCausalLM folder for Transformer++ models (tied or untied):\n"
    "DIR/config.json and DIR/model.safetensors (wqkv and w13 split into q/k/v and gate/up).\n"
    "Both write the checkpoint's SentencePiece model as DIR/tokenizer.model when it has one.\n";

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw UserError("cannot write '" + path.string() + "'");
}

}  // namespace

int cmd_export(int argc, char** argv) {
  Args args(argc, argv, kUsage);
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto ckpt = args.get("checkpoint");
  const auto out = args.get("out");
  const std::string format = args.get_or("format", "safetensors");
  args.finish();
  if (!ckpt) throw UserError("--checkpoint CKPT is required (see --help)");
  if (!out) throw UserError("--out DIR is required (see --help)");
  if (format != "safetensors" && format != "hf")
    throw UserError("--format must be safetensors or hf, got '" + format + "'");

  const CheckpointReader reader(*ckpt);
  const Config cfg = Config::from_json(reader.data().config, *ckpt + ":/config");
  if (format == "hf") check_hf_llama_exportable(cfg.model, *ckpt);
  // Exported weights are the f32 masters, whatever precision the run trained in.
  Model model(cfg.model, Ctx{}, "fp32", false);
  reader.load_params(model.params(), false);

  const std::filesystem::path dir(*out);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError("--out: cannot create '" + dir.string() + "': " + ec.message());
  std::optional<Tokenizer> tok;
  if (!reader.data().tokenizer.empty()) {
    tok = Tokenizer::from_bytes(reader.data().tokenizer, *ckpt);
    write_text(dir / "tokenizer.model", tok->model_bytes());
  }

  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (format == "hf") {
    tensors = hf_llama_tensors(model);
    const json hf = hf_llama_config(cfg, tok ? tok->bos_id() : -1, tok ? tok->eos_id() : -1);
    write_text(dir / "config.json", hf.dump(2) + "\n");
  } else {
    const ParamStore& ps = model.params();
    for (int i = 0; i < ps.count(); ++i) tensors.push_back({ps.spec(i).name, ps.master(i)});
    for (int i = 0; i < ps.buffer_count(); ++i) tensors.push_back({ps.buffer_spec(i).name, ps.buffer(i)});
    const std::string config = cfg.to_json().dump(2);
    metadata["linac_config"] = config;
    write_text(dir / "linac_config.json", config + "\n");
  }
  write_safetensors((dir / "model.safetensors").string(), tensors, metadata);
  std::printf("wrote %s (%s, %zu tensors)\n", dir.string().c_str(), format.c_str(), tensors.size());
  return 0;
}

}  // namespace linac::cli
