// linac export --checkpoint CKPT --out DIR [--format safetensors|hf]
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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
    "usage: linac export --checkpoint CKPT --out DIR [--format safetensors|hf] [--force]\n\n"
    "safetensors (default): DIR/model.safetensors with every parameter (and model buffer) under\n"
    "its linac name and shape, in f32, the linac config in its metadata (key linac_config) and\n"
    "in DIR/linac_config.json.\n"
    "hf: a Hugging Face LlamaForCausalLM folder for Transformer++ models (tied or untied):\n"
    "DIR/config.json and DIR/model.safetensors (wqkv and w13 split into q/k/v and gate/up).\n"
    "Both write the checkpoint's SentencePiece model as DIR/tokenizer.model when it has one.\n"
    "DIR must be new or empty; --force writes into a non-empty DIR, replacing the files of the\n"
    "same names (others stay). Files appear in DIR only once all of them are complete.\n";

// A folder inside the output directory that the files are written to first; they are moved into
// place when all are complete. Removed (with the output directory, when this export created it
// and it is still empty) however the export ends.
class Staging {
 public:
  Staging(const std::filesystem::path& dir, bool created_dir)
      : dir_(dir), tmp_(dir / (".export.tmp-" + std::to_string(::getpid()))), created_dir_(created_dir) {
    std::error_code ec;
    std::filesystem::create_directory(tmp_, ec);
    if (ec) throw UserError("--out: cannot write in '" + dir_.string() + "': " + ec.message());
  }
  ~Staging() {
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
    if (created_dir_ && std::filesystem::is_empty(dir_, ec)) std::filesystem::remove(dir_, ec);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  std::filesystem::path file(const std::string& name) const { return tmp_ / name; }
  // Moves every staged file into the output directory (a rename each, within one filesystem).
  void publish() const {
    for (const auto& e : std::filesystem::directory_iterator(tmp_)) {
      const auto dst = dir_ / e.path().filename();
      if (::rename(e.path().c_str(), dst.c_str()) != 0)
        throw UserError("cannot move '" + e.path().string() + "' to '" + dst.string() + "': " + std::strerror(errno));
    }
  }

 private:
  std::filesystem::path dir_, tmp_;
  bool created_dir_;
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw UserError("cannot write '" + path.string() + "'");
}

}  // namespace

int cmd_export(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"force"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto ckpt = args.get("checkpoint");
  const auto out = args.get("out");
  const std::string format = args.get_or("format", "safetensors");
  const bool force = args.flag("force");
  args.finish();
  if (!ckpt) throw UserError("--checkpoint CKPT is required (see --help)");
  if (!out) throw UserError("--out DIR is required (see --help)");
  if (format != "safetensors" && format != "hf")
    throw UserError("--format must be safetensors or hf, got '" + format + "'");

  const std::filesystem::path dir(*out);
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    if (!std::filesystem::is_directory(dir, ec)) throw UserError("--out: '" + dir.string() + "' exists and is not a directory");
    if (!force && !std::filesystem::is_empty(dir, ec))
      throw UserError("--out: '" + dir.string() + "' exists and is not empty (use --force to replace the files export writes)");
  }

  const CheckpointReader reader(*ckpt);
  // Refused before anything is written: publish() would stop at a target that is no file after
  // moving the others, and replacing the checkpoint being read would lose it.
  const std::vector<std::string> targets = {"model.safetensors", format == "hf" ? "config.json" : "linac_config.json",
                                            "tokenizer.model"};
  for (const std::string& name : targets) {
    const std::filesystem::path dst = dir / name;
    if (!std::filesystem::exists(dst, ec)) continue;
    if (!std::filesystem::is_regular_file(dst, ec))
      throw UserError("--out: '" + dst.string() + "' exists and is not a file; export writes a file there");
    if (std::filesystem::equivalent(dst, *ckpt, ec))
      throw UserError("--out: export would replace '" + dst.string() +
                      "', the --checkpoint it reads; give another --out");
  }
  const Config cfg = Config::from_json(reader.data().config, *ckpt + ":/config");
  if (format == "hf") check_hf_llama_exportable(cfg.model, *ckpt);
  // Exported weights are the f32 masters, whatever precision the run trained in.
  Model model(cfg.model, Ctx{}, {.precision = "fp32"});
  reader.load_params(model.params(), false);

  const bool created = !std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError("--out: cannot create '" + dir.string() + "': " + ec.message());
  const Staging staging(dir, created);
  std::optional<Tokenizer> tok;
  if (!reader.data().tokenizer.empty()) {
    tok = Tokenizer::from_bytes(reader.data().tokenizer, *ckpt);
    write_text(staging.file("tokenizer.model"), tok->model_bytes());
  }

  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (format == "hf") {
    tensors = hf_llama_tensors(model);
    const json hf = hf_llama_config(cfg, tok ? tok->bos_id() : -1, tok ? tok->eos_id() : -1);
    write_text(staging.file("config.json"), hf.dump(2) + "\n");
  } else {
    const ParamStore& ps = model.params();
    for (int i = 0; i < ps.count(); ++i) tensors.push_back({ps.spec(i).name, ps.master(i)});
    for (int i = 0; i < ps.buffer_count(); ++i) tensors.push_back({ps.buffer_spec(i).name, ps.buffer(i)});
    const std::string config = cfg.to_json().dump(2);
    metadata["linac_config"] = config;
    write_text(staging.file("linac_config.json"), config + "\n");
  }
  write_safetensors(staging.file("model.safetensors").string(), tensors, metadata);
  staging.publish();
  std::printf("wrote %s (%s, %zu tensors)\n", dir.string().c_str(), format.c_str(), tensors.size());
  return 0;
}

}  // namespace linac::cli
