// Tokenizer: a SentencePiece model behind a small value type, and the trainer linac uses.
//
// Models that linac trains are lossless on valid UTF-8: identity normalisation, no whitespace
// folding, digits split, byte fallback on (a character outside the vocabulary becomes its
// UTF-8 bytes, pieces <0x00>..<0xFF>, never <unk>), so decode(encode(s)) == s. Invalid UTF-8
// is replaced by U+FFFD before it reaches a model. Special ids are fixed:
//   pad = 0, unk = 1, bos = 2, eos = 3
// and ordinary pieces start at 4. Models brought by the user (--tokenizer) keep their own ids;
// only an EOS id is required, because documents are separated by it.
//
// Encoding is thread-safe (SentencePiece's processor is immutable after loading).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace linac {

constexpr int kPadId = 0, kUnkId = 1, kBosId = 2, kEosId = 3;

class Tokenizer {
 public:
  // From a SentencePiece .model file. UserError when missing, unreadable or not a model.
  static Tokenizer from_file(const std::string& path);
  // From serialized model bytes (e.g. the /tokenizer dataset of a token file); `origin` names
  // where they came from in error messages.
  static Tokenizer from_bytes(std::string bytes, const std::string& origin);

  std::vector<int32_t> encode(std::string_view text) const;
  void encode(std::string_view text, std::vector<int>& out) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;

  int64_t vocab_size() const;
  int32_t pad_id() const;  // -1 when the model has none
  int32_t unk_id() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;
  const std::string& model_bytes() const { return bytes_; }

 private:
  Tokenizer(std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp, std::string bytes)
      : sp_(std::move(sp)), bytes_(std::move(bytes)) {}
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  std::string bytes_;
};

struct TokenizerTrainOptions {
  int64_t vocab_size = 8192;
  std::string model_type = "bpe";   // "bpe" | "unigram"
  double character_coverage = 0.9995;
  int64_t max_sentences = 1000000;  // SentencePiece keeps a seeded reservoir sample of this many
  int threads = 1;
  bool verbose = false;             // SentencePiece's own progress log on stderr
};

// Longest sentence handed to the trainer, in bytes; longer lines are cut (at a space when
// possible) because SentencePiece silently drops lines above its limit.
constexpr size_t kMaxTrainSentenceBytes = 4096;

// UserError for a model type other than bpe/unigram, a non-positive vocabulary size or a
// character coverage outside (0, 1].
void check_train_options(const TokenizerTrainOptions& opts);

// Trains a model from sentences produced by `next` (returns false at the end; each call fills
// its argument with one line of text). Deterministic for fixed options and input. UserError
// when the vocabulary does not fit the corpus (the message gives the largest or smallest
// size that works) or the options are invalid.
Tokenizer train_tokenizer(const std::function<bool(std::string&)>& next, const TokenizerTrainOptions& opts);

}  // namespace linac
