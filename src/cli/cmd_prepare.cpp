// `linac prepare`: text files -> SentencePiece tokenizer -> HDF5 token dataset (src/data/prepare.h).
#include <cstdio>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/prepare.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac prepare --input PATH... --out data/NAME.h5 [options]\n"
    "\n"
    "Tokenises text into an HDF5 token dataset for `linac train`. Inputs are files or directories\n"
    "(searched recursively) of .txt (a blank line separates documents), .md (a file is a document)\n"
    "and .jsonl (one JSON object per line, its \"text\" field is a document). A file named directly\n"
    "with another extension is read as .txt; binary content (NUL bytes, mostly not UTF-8) is refused.\n"
    "\n"
    "options:\n"
    "  --input PATH...          input files/directories (repeatable; later words are inputs too)\n"
    "  --out FILE               output .h5 file\n"
    "  --vocab-size N           train a SentencePiece model with N pieces (default 8192)\n"
    "  --tokenizer FILE         use this SentencePiece .model, or the tokenizer inside a linac .h5\n"
    "  --model-type bpe|unigram tokenizer algorithm when training (default bpe)\n"
    "  --character-coverage F   characters covered by pieces; the rest use bytes (default 0.9995)\n"
    "  --max-train-sentences N  tokenizer training sample, in lines (default 1000000)\n"
    "  --val-fraction F         share of documents held out for validation (default 0.005)\n"
    "  --threads N              encoding/training threads (default: all cores)\n"
    "  --jsonl-key KEY          field of .jsonl objects holding the text (default text)\n"
    "  --txt-split paragraph|file  what a .txt document is (default paragraph)\n"
    "  --force                  replace an existing output (only once the new one is complete)\n"
    "  --quiet                  no progress lines\n"
    "  --verbose                show SentencePiece's training log\n";

}  // namespace

int cmd_prepare(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"force", "quiet", "verbose"});
  if (args.help()) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  PrepareOptions o;
  o.inputs = args.get_all("input");
  for (const auto& p : args.positionals()) o.inputs.push_back(p);
  o.out = args.get_or("out", "");
  const auto vocab = args.get("vocab-size");
  o.tokenizer = args.get_or("tokenizer", "");
  if (vocab && !o.tokenizer.empty()) throw UserError("give either --vocab-size or --tokenizer, not both");
  o.vocab_size = args.get_int("vocab-size", o.vocab_size);
  o.model_type = args.get_or("model-type", o.model_type);
  o.character_coverage = args.get_double("character-coverage", o.character_coverage);
  o.max_train_sentences = args.get_int("max-train-sentences", o.max_train_sentences);
  o.val_fraction = args.get_double("val-fraction", o.val_fraction);
  o.threads = static_cast<int>(args.get_int("threads", 0));
  o.corpus.jsonl_key = args.get_or("jsonl-key", o.corpus.jsonl_key);
  const std::string split = args.get_or("txt-split", "paragraph");
  if (split != "paragraph" && split != "file") throw UserError("--txt-split must be paragraph or file, got '" + split + "'");
  o.corpus.txt_split = split == "file" ? TextSplit::File : TextSplit::Paragraph;
  o.force = args.flag("force");
  o.progress = !args.flag("quiet");
  o.verbose = args.flag("verbose");
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
