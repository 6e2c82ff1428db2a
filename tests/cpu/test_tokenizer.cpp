// Tokenizer: fixed special ids, lossless round trips (non-ASCII, whitespace, byte fallback),
// loading from bytes and files, deterministic training, and vocabulary-size errors.
#include <algorithm>

#include "core/error.h"
#include "data/test_fixtures.h"
#include "data/tokenizer.h"

namespace linac::test_tokenizer {
namespace {

std::function<bool(std::string&)> feed(const std::vector<std::string>& docs) {
  auto i = std::make_shared<size_t>(0);
  return [&docs, i](std::string& s) {
    if (*i == docs.size()) return false;
    s = docs[(*i)++];
    return true;
  };
}

TEST(Tokenizer, SpecialIdsAreFixed) {
  const Tokenizer& tok = test::tiny_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.pad_id(), kPadId);
  EXPECT_EQ(tok.unk_id(), kUnkId);
  EXPECT_EQ(tok.bos_id(), kBosId);
  EXPECT_EQ(tok.eos_id(), kEosId);
  EXPECT_EQ(tok.piece(kEosId), "</s>");
  EXPECT_EQ(tok.piece(kBosId), "<s>");
}

TEST(Tokenizer, RoundTripIsLossless) {
  const Tokenizer& tok = test::tiny_tokenizer();
  for (const std::string text :
       {"The model learns to predict the next token.", "café naïve über façade 日本 東京 研究",
        "  two leading spaces, double  space and a trailing one ", "line one\nline two\n\n\ttabbed 123456789",
        "The 42 models of 2026"}) {
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, ByteFallbackCoversUnseenCharacters) {
  const Tokenizer& tok = test::tiny_tokenizer();
  const std::string text = "Привет ☃ 🦀 Ωμέγα";  // none of these characters were in training
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kUnkId), 0);
  EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return tok.piece(id) == "<0xF0>"; }));
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(Tokenizer, LoadsFromBytesAndFileIdentically) {
  const Tokenizer& tok = test::tiny_tokenizer();
  test::TempDir dir;
  test::write_file(dir / "m.model", tok.model_bytes());
  const Tokenizer a = Tokenizer::from_file(dir / "m.model");
  const Tokenizer b = Tokenizer::from_bytes(tok.model_bytes(), "bytes");
  const std::string text = "Gated linear attention über alles 日本";
  EXPECT_EQ(a.encode(text), tok.encode(text));
  EXPECT_EQ(b.encode(text), tok.encode(text));
  EXPECT_EQ(a.vocab_size(), tok.vocab_size());
}

TEST(Tokenizer, TrainingIsDeterministic) {
  const auto docs = test::synthetic_documents(300, 5);
  TokenizerTrainOptions o;
  o.vocab_size = 350;
  o.character_coverage = 1.0;
  o.threads = 2;
  const Tokenizer a = train_tokenizer(feed(docs), o);
  const Tokenizer b = train_tokenizer(feed(docs), o);
  EXPECT_EQ(a.model_bytes(), b.model_bytes());
  o.model_type = "unigram";
  const Tokenizer u = train_tokenizer(feed(docs), o);
  EXPECT_EQ(u.decode(u.encode(docs[0])), docs[0]);
}

TEST(Tokenizer, VocabTooLargeNamesTheLimit) {
  const auto docs = test::synthetic_documents(50, 3);
  TokenizerTrainOptions o;
  o.vocab_size = 50000;
  o.character_coverage = 1.0;
  try {
    train_tokenizer(feed(docs), o);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-size 50000 is larger than this corpus supports; use at most"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, VocabTooSmallNamesTheMinimum) {
  const auto docs = test::synthetic_documents(50, 3);
  TokenizerTrainOptions o;
  o.vocab_size = 100;  // below the 256 byte pieces alone
  try {
    train_tokenizer(feed(docs), o);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("use at least"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, BadOptionsAndModelsAreUserErrors) {
  const auto docs = test::synthetic_documents(10, 3);
  TokenizerTrainOptions o;
  o.model_type = "wordpiece";
  EXPECT_THROW(train_tokenizer(feed(docs), o), UserError);
  test::TempDir dir;
  EXPECT_THROW(Tokenizer::from_file(dir / "missing.model"), UserError);
  test::write_file(dir / "junk.model", "this is not a protobuf");
  EXPECT_THROW(Tokenizer::from_file(dir / "junk.model"), UserError);
  const std::vector<int32_t> bad = {1000000};
  EXPECT_THROW(test::tiny_tokenizer().decode(bad), UserError);
}

}  // namespace
}  // namespace linac::test_tokenizer
