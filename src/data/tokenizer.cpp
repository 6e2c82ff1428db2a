#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace linac {
namespace {

// SentencePiece statuses read "Internal: file(line) [check] Human message."; keep the message,
// or the check itself where it has none.
std::string sp_message(const sentencepiece::util::Status& st) {
  const std::string s = st.ToString();
  const size_t close = s.rfind("] ");
  if (close == std::string::npos) return s;
  if (close + 2 < s.size()) return s.substr(close + 2);
  const size_t open = s.rfind(" [", close);
  return open == std::string::npos ? s : "SentencePiece's check " + s.substr(open + 1, close - open) + " failed";
}

// Feeds the trainer from a callback; the callback is the whole corpus pass.
class CallbackIterator : public sentencepiece::SentenceIterator {
 public:
  explicit CallbackIterator(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string value_;
  bool done_ = false;
};

// Fixed so that the trainer's reservoir sample, hence the model, is reproducible.
constexpr unsigned kTrainerSeed = 20261122;

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot read tokenizer model " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_bytes(ss.str(), path);
}

Tokenizer Tokenizer::from_bytes(std::string bytes, const std::string& origin) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto st = sp->LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    const std::string why = sp_message(st);
    throw UserError(origin + " is not a SentencePiece model" + (why.empty() ? "" : " (" + why + ")"));
  }
  if (sp->eos_id() < 0) throw UserError("tokenizer " + origin + " has no EOS piece; linac separates documents with it");
  return Tokenizer(std::move(sp), std::move(bytes));
}

void Tokenizer::encode(std::string_view text, std::vector<int>& out) const {
  const auto st = sp_->Encode(absl::string_view(text.data(), text.size()), &out);
  LINAC_CHECK(st.ok(), "SentencePiece encode failed: " + st.ToString());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  encode(text, ids);
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const std::vector<int> v(ids.begin(), ids.end());
  for (int id : v)
    if (id < 0 || id >= sp_->GetPieceSize())
      throw UserError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                      std::to_string(sp_->GetPieceSize()));
  std::string out;
  const auto st = sp_->Decode(v, &out);
  LINAC_CHECK(st.ok(), "SentencePiece decode failed: " + st.ToString());
  return out;
}

std::string Tokenizer::piece(int32_t id) const { return sp_->IdToPiece(id); }
int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::pad_id() const { return sp_->pad_id(); }
int32_t Tokenizer::unk_id() const { return sp_->unk_id(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }

void check_train_options(const TokenizerTrainOptions& opts) {
  if (opts.model_type != "bpe" && opts.model_type != "unigram")
    throw UserError("--model-type must be bpe or unigram, got '" + opts.model_type + "'");
  if (opts.vocab_size < 1 || opts.vocab_size > std::numeric_limits<int32_t>::max())
    throw UserError("--vocab-size must be in [1, 2^31 - 1], got " + std::to_string(opts.vocab_size));
  if (!(opts.character_coverage > 0 && opts.character_coverage <= 1))
    throw UserError("--character-coverage must be in (0, 1]");
}

Tokenizer train_tokenizer(const std::function<bool(std::string&)>& next, const TokenizerTrainOptions& opts) {
  check_train_options(opts);
  const std::unordered_map<std::string, std::string> kw = {
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"model_type", opts.model_type},
      {"character_coverage", std::to_string(opts.character_coverage)},
      {"input_sentence_size", std::to_string(opts.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(kMaxTrainSentenceBytes * 2)},
      {"num_threads", std::to_string(std::max(1, opts.threads))},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"remove_extra_whitespaces", "false"},
      {"normalization_rule_name", "identity"},
      {"pad_id", std::to_string(kPadId)},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"unk_surface", "\xEF\xBF\xBD"},  // U+FFFD, like the invalid-UTF-8 replacement
      {"minloglevel", opts.verbose ? "0" : "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(kTrainerSeed);
  CallbackIterator it(next);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(kw, &it, &model);
  if (!st.ok()) {
    const std::string msg = sp_message(st);
    std::smatch m;
    if (std::regex_search(msg, m, std::regex(R"(too high \((\d+)\)\. Please set it to a value <= (\d+))")))
      throw UserError("--vocab-size " + m[1].str() + " is larger than this corpus supports; use at most " +
                      m[2].str() + " (or add text)");
    if (std::regex_search(msg, m, std::regex(R"(smaller than required_chars\. (\d+) vs (\d+))")))
      throw UserError("--vocab-size " + m[1].str() + " is too small for this corpus's characters; use at least " +
                      m[2].str() + " (or lower --character-coverage)");
    throw UserError("tokenizer training failed: " + msg);
  }
  return Tokenizer::from_bytes(std::move(model), "the trained tokenizer");
}

}  // namespace linac
