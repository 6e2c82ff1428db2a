// `linac prepare`: text corpus -> tokenizer -> HDF5 token dataset (schema: token_dataset.h), or
// token ids already tokenised elsewhere -> the same dataset without a tokenizer (token_ids.h).
//
// Steps for text: discover the inputs (corpus.h); train a SentencePiece model on a bounded, seeded
// sample of their lines unless one is given; encode every document on `threads` threads
// (batches of documents, results written in input order, so the output does not depend on
// the thread count); append each document's tokens plus EOS to /train or /val; embed the
// model; fsync; rename into place. Token ids are checked up front and copied, each document
// followed by the given EOS id; the dataset then carries no tokenizer.
//
// Split rule (deterministic, independent of threads and batching; the same for text and ids):
// document i (0-based, in input order) goes to val iff
// philox_uniform(kValSplitSeed, "val_split", i) < val_fraction. If that leaves one split empty
// while there are >= 2 documents (and val_fraction > 0), the last document goes to the empty
// split; a single document always goes to train.
//
// Safety: the file is written as OUT.tmp-<pid> and renamed only once complete, so the final
// name never holds a partial file; an existing OUT is replaced only with --force and only by
// a complete file, never when it is one of the inputs (--input, --token-ids, --tokenizer);
// SIGINT/SIGTERM/SIGHUP during prepare remove the temporary file before the process dies; a
// UserError or any other failure removes it too. Every user mistake is detected before anything
// is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"

namespace linac {

constexpr uint64_t kValSplitSeed = 0x5EED5B17u;
// SentencePiece refuses a training sample of this many lines or fewer.
constexpr int64_t kMinTrainSentences = 100;

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out;
  int64_t vocab_size = 8192;
  std::string tokenizer;                // a .model file or a linac token dataset (.h5): reuse its model
  std::string tokenizer_bytes;          // the model itself when the caller read it (a checkpoint's)
  std::string model_type = "bpe";       // bpe | unigram
  double character_coverage = 0.9995;
  int64_t max_train_sentences = 1000000;
  double val_fraction = 0.005;          // in [0, 0.5]
  int threads = 0;                      // 0: hardware concurrency
  bool force = false;
  bool progress = true;                 // progress lines on the log
  bool verbose = false;                 // SentencePiece's own training log
  CorpusOptions corpus;
  // Token-id input instead of `inputs` (token_ids.h): vocab_size is then the model's vocabulary,
  // eos_id its end-of-document id; bos_id (-1: none) is recorded, never inserted.
  std::vector<std::string> token_ids;
  int64_t eos_id = -1, bos_id = -1;
};

struct PrepareStats {
  std::string out;
  uint64_t documents_train = 0, documents_val = 0;
  uint64_t tokens_train = 0, tokens_val = 0;   // including one EOS per document
  uint64_t bytes = 0;                          // input bytes read
  uint64_t eos_added = 0;                      // token ids: files whose last document had no EOS
  uint64_t invalid_utf8 = 0;                   // U+FFFD substitutions
  int64_t vocab_size = 0;
  std::string dtype;
  int threads = 0;
  double tokenizer_seconds = 0, encode_seconds = 0, total_seconds = 0;
};

PrepareStats prepare(const PrepareOptions& opts);

// The split rule's per-document draw (before the empty-split adjustment).
bool is_val_document(uint64_t doc_index, double val_fraction);

}  // namespace linac
