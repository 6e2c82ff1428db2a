// `linac prepare`: text files -> SentencePiece tokenizer -> HDF5 token dataset, or token-id files
// -> the same dataset without a tokenizer (src/data/prepare.h).
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/hdf5_util.h"
#include "data/prepare.h"
#include "train/checkpoint.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac prepare --input PATH... --out data/NAME.h5 [options]\n"
    "       linac prepare --token-ids FILE... --vocab-size V --eos-id E [--bos-id B]\n"
    "                     --out data/NAME.h5 [--val-fraction F] [--force] [--quiet]\n"
    "\n"
    "Tokenises text into an HDF5 token dataset for `linac train`. Inputs are files or directories\n"
    "(searched recursively) of .txt (a blank line separates documents), .md (a file is a document)\n"
    "and .jsonl (one JSON object per line, its \"text\" field is a document). A file named directly\n"
    "with another extension is read as .txt; binary content (NUL bytes, mostly not UTF-8) is refused.\n"
    "\n"
    "With --token-ids, the inputs are text already tokenised by a model's own tokenizer (for Hugging\n"
    "Face tokenizer.json models: scripts/hf_tokenize.py writes them): raw little-endian uint32 ids,\n"
    "each document followed by the end-of-document id E (added where a file's last document lacks\n"
    "it). Every id must be below V, the model's vocabulary size. The dataset then holds no\n"
    "tokenizer: `linac eval` reports no bits per byte and `generate` needs --prompt-ids.\n"
    "\n"
    "options:\n"
    "  --input PATH...          input files/directories (repeatable; later words are inputs too)\n"
    "  --out FILE               output .h5 file\n"
    "  --vocab-size N           train a SentencePiece model with N pieces (default 8192); with\n"
    "                           --token-ids: the model's vocabulary size (required)\n"
    "  --tokenizer FILE         use this SentencePiece .model, or the tokenizer inside a linac token\n"
    "                           dataset or checkpoint\n"
    "  --model-type bpe|unigram tokenizer algorithm when training (default bpe)\n"
    "  --character-coverage F   characters covered by pieces; the rest use bytes (default 0.9995)\n"
    "  --max-train-sentences N  tokenizer training sample, in lines (default 1000000)\n"
    "  --val-fraction F         share of documents held out for validation (default 0.005)\n"
    "  --threads N              encoding/training threads (default: all cores)\n"
    "  --jsonl-key KEY          field of .jsonl objects holding the text (default text)\n"
    "  --txt-split paragraph|file  what a .txt document is (default paragraph)\n"
    "  --force                  replace an existing output (only once the new one is complete)\n"
    "  --quiet                  no progress lines\n"
    "  --verbose                show SentencePiece's training log\n"
    "  --token-ids FILE...      token-id files instead of text (later words are files too)\n"
    "  --eos-id E               with --token-ids: the end-of-document id (required)\n"
    "  --bos-id B               with --token-ids: the beginning-of-sequence id, recorded only\n";

// A checkpoint's SentencePiece model (a run's, or an imported model's tokenizer.model), or empty
// when `path` is not a checkpoint (prepare reads .model files and token datasets itself).
std::string checkpoint_tokenizer(const std::string& path) {
  std::error_code ec;
  bool checkpoint = std::filesystem::is_directory(path, ec) && is_checkpoint_path(path);
  if (!checkpoint && std::filesystem::is_regular_file(path, ec) && h5::is_hdf5(path)) {
    try {
      checkpoint = h5::exists(h5::File::open(path, false).id(), "state");
    } catch (const Error&) {
      return {};  // unreadable: prepare's own reading says what is wrong
    }
  }
  if (!checkpoint) return {};
  std::string bytes = CheckpointReader(path, false).data().tokenizer;
  if (bytes.empty())
    throw UserError("--tokenizer " + path +
                    ": the checkpoint has no tokenizer (its run's data was prepared from token ids)");
  return bytes;
}

}  // namespace

int cmd_prepare(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"force", "quiet", "verbose"});
  if (args.help()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  PrepareOptions o;
  o.inputs = args.get_all("input");
  o.token_ids = args.get_all("token-ids");
  for (const auto& p : args.positionals()) (o.token_ids.empty() ? o.inputs : o.token_ids).push_back(p);
  o.out = args.get_or("out", "");
  o.val_fraction = args.get_double("val-fraction", o.val_fraction);
  o.force = args.flag("force");
  o.progress = !args.flag("quiet");
  if (args.flag("quiet") && args.flag("verbose")) throw UserError("give either --quiet or --verbose, not both");
  if (!o.token_ids.empty()) {
    for (const char* opt : {"tokenizer", "model-type", "character-coverage", "max-train-sentences", "threads",
                            "jsonl-key", "txt-split"})
      if (args.get(opt)) throw UserError(std::string("--") + opt + " applies to text input, not to --token-ids");
    if (args.flag("verbose")) throw UserError("--verbose applies to text input, not to --token-ids");
    if (!args.get("vocab-size"))
      throw UserError("--token-ids needs --vocab-size V: the model's vocabulary size (config.json's vocab_size)");
    if (!args.get("eos-id"))
      throw UserError("--token-ids needs --eos-id E: the id that ends each document (config.json's eos_token_id)");
    o.vocab_size = args.get_int("vocab-size", 0);
    o.eos_id = args.get_int("eos-id", -1);
    o.bos_id = args.get_int("bos-id", -1);
  } else {
    for (const char* opt : {"eos-id", "bos-id"})
      if (args.get(opt))
        throw UserError(std::string("--") + opt + " applies to --token-ids only (text takes its ids from the tokenizer)");
    const auto vocab = args.get("vocab-size");
    o.tokenizer = args.get_or("tokenizer", "");
    if (vocab && !o.tokenizer.empty()) throw UserError("give either --vocab-size or --tokenizer, not both");
    if (args.get("tokenizer")) {
      if (o.tokenizer.empty()) throw UserError("--tokenizer is empty; give a file");
      for (const char* opt : {"model-type", "character-coverage", "max-train-sentences"})
        if (args.get(opt))
          throw UserError(std::string("--") + opt + " applies to training a tokenizer, not to --tokenizer");
      o.tokenizer_bytes = checkpoint_tokenizer(o.tokenizer);
    }
    o.vocab_size = args.get_int("vocab-size", o.vocab_size);
    o.model_type = args.get_or("model-type", o.model_type);
    o.character_coverage = args.get_double("character-coverage", o.character_coverage);
    o.max_train_sentences = args.get_int("max-train-sentences", o.max_train_sentences);
    o.threads = static_cast<int>(args.get_int("threads", 0));
    o.corpus.jsonl_key = args.get_or("jsonl-key", o.corpus.jsonl_key);
    const std::string split = args.get_or("txt-split", "paragraph");
    if (split != "paragraph" && split != "file")
      throw UserError("--txt-split must be paragraph or file, got '" + split + "'");
    o.corpus.txt_split = split == "file" ? TextSplit::File : TextSplit::Paragraph;
    o.verbose = args.flag("verbose");
  }
  args.finish();

  const PrepareStats s = prepare(o);
  if (s.invalid_utf8 > 0)
    std::fprintf(stderr, "linac prepare: warning: replaced %llu invalid UTF-8 sequences with U+FFFD\n",
                 static_cast<unsigned long long>(s.invalid_utf8));
  const uint64_t tokens = s.tokens_train + s.tokens_val;
  std::printf("wrote %s\n", s.out.c_str());
  std::printf("  documents    %llu (train %llu, val %llu)\n",
              static_cast<unsigned long long>(s.documents_train + s.documents_val),
              static_cast<unsigned long long>(s.documents_train), static_cast<unsigned long long>(s.documents_val));
  if (!o.token_ids.empty()) {
    std::printf("  tokens       %llu (train %llu, val %llu; %s, vocab %lld), no tokenizer\n",
                static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(s.tokens_train),
                static_cast<unsigned long long>(s.tokens_val), s.dtype.c_str(), static_cast<long long>(s.vocab_size));
    // Every file lacking its final EOS may mean a wrong --eos-id: each file is then one document.
    if (s.eos_added > 0)
      std::printf("  note         %llu of %zu files did not end with --eos-id %lld; it was added\n",
                  static_cast<unsigned long long>(s.eos_added), o.token_ids.size(), static_cast<long long>(o.eos_id));
    std::printf("  time         %.2f s\n", s.total_seconds);
    return 0;
  }
  std::printf("  bytes        %.2f MB\n", s.bytes / 1e6);
  std::printf("  tokens       %llu (train %llu, val %llu; %s, vocab %lld)\n", static_cast<unsigned long long>(tokens),
              static_cast<unsigned long long>(s.tokens_train), static_cast<unsigned long long>(s.tokens_val),
              s.dtype.c_str(), static_cast<long long>(s.vocab_size));
  std::printf("  bytes/token  %.3f\n", tokens ? static_cast<double>(s.bytes) / tokens : 0.0);
  std::printf("  time         %.2f s (tokenizer training %.2f s, encoding %.2f s = %.2f MB/s on %d threads)\n",
              s.total_seconds, s.tokenizer_seconds, s.encode_seconds, s.bytes / 1e6 / std::max(s.encode_seconds, 1e-9),
              s.threads);
  return 0;
}

}  // namespace linac::cli
