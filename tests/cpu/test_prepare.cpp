// `linac prepare`: corpus reading (formats, UTF-8 repair), the end-to-end file, the val split,
// and every documented bad input through the library and through the `linac` binary (exit
// status 2, one error line, no existing file damaged, no partial file left behind), an --out
// that is one of the inputs among them.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/test_fixtures.h"
#include "data/token_dataset.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_prepare {
namespace {

using test::TempDir;

std::vector<std::string> read_all_documents(const std::vector<std::string>& inputs, CorpusOptions opts = {}) {
  DocumentReader r(discover_inputs(inputs), opts);
  std::vector<std::string> docs;
  std::string d;
  while (r.next(d)) docs.push_back(d);
  return docs;
}

// Splits a token split back into documents at EOS and decodes them.
std::vector<std::string> decode_split(const TokenDataset& ds, Split s, const Tokenizer& tok) {
  std::vector<int32_t> all(ds.size(s));
  ds.read(s, 0, all.size(), all.data());
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t id : all) {
    if (id == ds.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(id);
    }
  }
  EXPECT_TRUE(cur.empty()) << "split does not end with EOS";
  return docs;
}

// A corpus directory: paragraphs in .txt, a .md, a .jsonl, plus files that must be ignored.
std::vector<std::string> write_corpus(const TempDir& dir, size_t n_docs = 240) {
  const auto docs = test::synthetic_documents(n_docs, 2);
  const size_t third = n_docs / 3;
  std::string txt;
  for (size_t i = 0; i < third; ++i) txt += docs[i] + (i % 5 == 0 ? "\r\n\r\n\r\n" : "\n\n");
  test::write_file(dir / "corpus/a/part1.txt", txt);
  std::string jsonl;
  for (size_t i = third; i < 2 * third; ++i) jsonl += nlohmann::json{{"id", i}, {"text", docs[i]}}.dump() + "\n\n";
  test::write_file(dir / "corpus/b.jsonl", jsonl);
  std::string md;
  for (size_t i = 2 * third; i < n_docs; ++i) md += docs[i] + "\n\n";
  test::write_file(dir / "corpus/c.md", md);
  test::write_file(dir / "corpus/ignored.csv", "a,b\n1,2\n");
  test::write_file(dir / "corpus/.hidden/secret.txt", "never read");
  std::vector<std::string> expected(docs.begin(), docs.begin() + 2 * third);
  std::string whole = md;
  while (!whole.empty() && whole.back() == '\n') whole.pop_back();
  expected.push_back(whole);
  return expected;
}

PrepareOptions quick_options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.out = out;
  o.vocab_size = 400;
  o.character_coverage = 1.0;
  o.threads = 2;
  o.progress = false;
  return o;
}

TEST(Corpus, SanitizeUtf8ReplacesMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in, out;
    uint64_t n;
  };
  for (const Case& c : std::vector<Case>{
           {"plain ascii", "plain ascii", 0},
           {"é 日本 🦀", "é 日本 🦀", 0},
           {"a\xFF" "b", "a" + fffd + "b", 1},
           {"\xE2\x82" "x", fffd + "x", 1},                  // truncated 3-byte sequence
           {"\xED\xA0\x80", fffd + fffd + fffd, 3},          // UTF-16 surrogate: not UTF-8
           {"\xC0\xAF", fffd + fffd, 2},                     // overlong
           {"end\xF0\x9F\x98", "end" + fffd, 1}}) {          // truncated at the end
    std::string s = c.in;
    EXPECT_EQ(sanitize_utf8(s), c.n) << c.in;
    EXPECT_EQ(s, c.out);
  }
}

TEST(Corpus, ReadsTxtParagraphsJsonlAndMarkdownInOrder) {
  TempDir dir;
  const auto expected = write_corpus(dir);
  const auto files = discover_inputs({dir / "corpus"});
  ASSERT_EQ(files.size(), 3u);  // .csv and the hidden directory are skipped
  EXPECT_EQ(files[0].kind, InputKind::Text);
  EXPECT_EQ(files[1].kind, InputKind::Jsonl);
  EXPECT_EQ(files[2].kind, InputKind::Markdown);
  EXPECT_EQ(read_all_documents({dir / "corpus"}), expected);
}

TEST(Corpus, TxtFileModeAndJsonlKey) {
  TempDir dir;
  test::write_file(dir / "one.txt", "\n\npara one\n\n  para two  \n\n");
  CorpusOptions whole;
  whole.txt_split = TextSplit::File;
  EXPECT_EQ(read_all_documents({dir / "one.txt"}, whole), std::vector<std::string>{"para one\n\n  para two"});
  EXPECT_EQ(read_all_documents({dir / "one.txt"}), (std::vector<std::string>{"para one", "  para two"}));
  test::write_file(dir / "k.jsonl", "{\"body\": \"x y\"}\n{\"body\": \"\"}\n");
  CorpusOptions key;
  key.jsonl_key = "body";
  EXPECT_EQ(read_all_documents({dir / "k.jsonl"}, key), std::vector<std::string>{"x y"});
}

TEST(Corpus, BadInputsAreUserErrors) {
  TempDir dir;
  EXPECT_NE(test::user_error_message([&] { discover_inputs({dir / "absent"}); }).find("input not found: "),
            std::string::npos);
  // Named files are judged by content: any text is plain text, binary content is refused whatever the name.
  test::write_file(dir / "data.csv", "a,b");
  ASSERT_EQ(discover_inputs({dir / "data.csv"}).size(), 1u);
  EXPECT_EQ(read_all_documents({dir / "data.csv"}), std::vector<std::string>{"a,b"});
  test::write_file(dir / "notes", "plain words\n");
  EXPECT_EQ(read_all_documents({dir / "notes"}), std::vector<std::string>{"plain words"});
  test::write_file(dir / "image.txt", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  EXPECT_NE(test::user_error_message([&] {
              discover_inputs({dir / "image.txt"});
            }).find("image.txt: not a text file (it holds NUL"),
            std::string::npos);
  std::string noise;
  Rng rng{5, 1, 0};
  for (int i = 0; i < 3000; ++i) noise += static_cast<char>(0x80 + rng.below(0x80));
  test::write_file(dir / "noise.md", noise);
  EXPECT_NE(test::user_error_message([&] { discover_inputs({dir / "noise.md"}); }).find("are not UTF-8"),
            std::string::npos);
  std::filesystem::create_directories(dir / "emptydir");
  EXPECT_NE(test::user_error_message([&] { discover_inputs({dir / "emptydir"}); }).find("no text found"),
            std::string::npos);
  test::write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{not json\n");
  EXPECT_NE(
      test::user_error_message([&] { read_all_documents({dir / "bad.jsonl"}); }).find("bad.jsonl:2: invalid JSON"),
      std::string::npos);
  test::write_file(dir / "nokey.jsonl", "{\"content\": \"ok\"}\n");
  EXPECT_NE(test::user_error_message([&] { read_all_documents({dir / "nokey.jsonl"}); }).find("--jsonl-key"),
            std::string::npos);
  if (getuid() != 0) {  // root reads everything
    test::write_file(dir / "locked.txt", "secret");
    std::filesystem::permissions(dir / "locked.txt", std::filesystem::perms::none);
    EXPECT_NE(test::user_error_message([&] { discover_inputs({dir / "locked.txt"}); }).find("cannot read input"),
              std::string::npos);
  }
}

TEST(Prepare, EndToEndFileMatchesTheCorpus) {
  TempDir dir;
  const auto expected = write_corpus(dir);
  PrepareOptions o = quick_options({dir / "corpus"}, dir / "out/data.h5");  // creates out/
  o.val_fraction = 0.1;
  const PrepareStats st = prepare(o);
  EXPECT_EQ(st.documents_train + st.documents_val, expected.size());
  EXPECT_GT(st.documents_val, 0u);
  EXPECT_EQ(st.vocab_size, 400);
  EXPECT_EQ(st.dtype, "uint16");
  EXPECT_EQ(st.invalid_utf8, 0u);
  EXPECT_FALSE(dir.has_temp_files());

  const TokenDataset ds(dir / "out/data.h5");
  EXPECT_EQ(ds.vocab_size(), 400);
  EXPECT_EQ(ds.eos_id(), kEosId);
  EXPECT_EQ(ds.pad_id(), kPadId);
  EXPECT_EQ(ds.documents(Split::Train), static_cast<int64_t>(st.documents_train));
  EXPECT_EQ(ds.size(Split::Train), st.tokens_train);
  EXPECT_EQ(ds.size(Split::Val), st.tokens_val);
  EXPECT_EQ(ds.source(), nlohmann::json::array({dir / "corpus"}).dump());
  const Tokenizer tok = ds.tokenizer();
  std::vector<std::string> want_train, want_val;
  for (size_t i = 0; i < expected.size(); ++i) (is_val_document(i, 0.1) ? want_val : want_train).push_back(expected[i]);
  EXPECT_EQ(decode_split(ds, Split::Train, tok), want_train);
  EXPECT_EQ(decode_split(ds, Split::Val, tok), want_val);
  std::vector<int32_t> first(1);
  ds.read(Split::Train, 0, 1, first.data());
  EXPECT_NE(first[0], kBosId);  // no BOS inside documents
}

TEST(Prepare, OutputIsIndependentOfThreadsAndRuns) {
  TempDir dir;
  write_corpus(dir, 600);
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  const auto tokens = [](const std::string& path) {
    const TokenDataset ds(path);
    std::vector<int32_t> t(ds.size(Split::Train)), v(ds.size(Split::Val));
    ds.read(Split::Train, 0, t.size(), t.data());
    ds.read(Split::Val, 0, v.size(), v.data());
    return std::make_pair(t, v);
  };
  PrepareOptions o = quick_options({dir / "corpus"}, dir / "t1.h5");
  o.tokenizer = dir / "tok.model";
  o.threads = 1;
  prepare(o);
  o.out = dir / "t3.h5";
  o.threads = 3;
  prepare(o);
  EXPECT_EQ(tokens(dir / "t1.h5"), tokens(dir / "t3.h5"));
  o.tokenizer = dir / "t1.h5";  // the tokenizer embedded in a prepared file
  o.out = dir / "t_from_h5.h5";
  prepare(o);
  EXPECT_EQ(tokens(dir / "t1.h5"), tokens(dir / "t_from_h5.h5"));

  PrepareOptions trained = quick_options({dir / "corpus"}, dir / "a.h5");  // tokenizer trained twice
  prepare(trained);
  trained.out = dir / "b.h5";
  prepare(trained);
  EXPECT_EQ(tokens(dir / "a.h5"), tokens(dir / "b.h5"));
  EXPECT_EQ(TokenDataset(dir / "a.h5").tokenizer_bytes(), TokenDataset(dir / "b.h5").tokenizer_bytes());
}

TEST(Prepare, ValSplitKeepsBothSidesNonEmpty) {
  TempDir dir;
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  test::write_file(dir / "three.txt", "first doc\n\nsecond doc\n\nthird doc\n");
  PrepareOptions o = quick_options({dir / "three.txt"}, dir / "three.h5");
  o.tokenizer = dir / "tok.model";
  o.val_fraction = 0.001;
  PrepareStats st = prepare(o);
  EXPECT_EQ(st.documents_train, 2u);
  EXPECT_EQ(st.documents_val, 1u);  // at least one, and it is the last document
  const TokenDataset ds(dir / "three.h5");
  EXPECT_EQ(decode_split(ds, Split::Val, ds.tokenizer()), std::vector<std::string>{"third doc"});

  test::write_file(dir / "one.txt", "only document\n");
  o.inputs = {dir / "one.txt"};
  o.out = dir / "one.h5";
  o.val_fraction = 0.5;
  st = prepare(o);
  EXPECT_EQ(st.documents_train, 1u);
  EXPECT_EQ(st.documents_val, 0u);
}

TEST(Prepare, VeryLongLinesTrainAndRoundTrip) {
  TempDir dir;
  write_corpus(dir, 120);
  std::string spaced, solid;
  for (const auto& d : test::synthetic_documents(400, 4)) spaced += d + " ";
  for (int i = 0; i < 3000; ++i) solid += "研究日本";  // 36 KB without a space: cut at UTF-8 boundaries
  spaced.pop_back();
  test::write_file(dir / "corpus/long.jsonl",
                   nlohmann::json{{"text", spaced}}.dump() + "\n" + nlohmann::json{{"text", solid}}.dump() + "\n");
  PrepareOptions o = quick_options({dir / "corpus/long.jsonl", dir / "corpus/c.md"}, dir / "long.h5");
  o.val_fraction = 0;
  prepare(o);
  const TokenDataset ds(dir / "long.h5");
  const auto docs = decode_split(ds, Split::Train, ds.tokenizer());
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], spaced);
  EXPECT_EQ(docs[1], solid);
  EXPECT_EQ(ds.size(Split::Val), 0u);
}

TEST(Prepare, InvalidUtf8IsReplacedAndCounted) {
  TempDir dir;
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  test::write_file(dir / "bad.txt", "valid text\n\nbroken \xFF\xFE bytes and \xE2\x82 more\n");
  PrepareOptions o = quick_options({dir / "bad.txt"}, dir / "bad.h5");
  o.tokenizer = dir / "tok.model";
  const PrepareStats st = prepare(o);
  EXPECT_EQ(st.invalid_utf8, 3u);
  const TokenDataset ds(dir / "bad.h5");
  auto docs = decode_split(ds, Split::Train, ds.tokenizer());
  const auto val = decode_split(ds, Split::Val, ds.tokenizer());
  docs.insert(docs.end(), val.begin(), val.end());
  EXPECT_EQ(docs[1], "broken \xEF\xBF\xBD\xEF\xBF\xBD bytes and \xEF\xBF\xBD more");
}

TEST(Prepare, BadInputsFailBeforeWritingAnything) {
  TempDir dir;
  write_corpus(dir, 60);
  test::write_file(dir / "existing.h5", "precious bytes");
  std::filesystem::create_directories(dir / "empty");
  test::write_file(dir / "empty/blank.txt", "\n \n\t\n");
  struct Case {
    const char* what;
    PrepareOptions opts;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"missing input", quick_options({dir / "nope"}, dir / "x.h5"), "input not found"});
  cases.push_back({"no text", quick_options({dir / "empty"}, dir / "x.h5"), "no text found"});
  PrepareOptions big = quick_options({dir / "corpus"}, dir / "existing.h5");
  big.vocab_size = 60000;
  big.force = true;  // even with --force, a failed run leaves the old file alone
  cases.push_back({"vocab too large", big, "is larger than this corpus supports; use at most"});
  cases.push_back({"output exists", quick_options({dir / "corpus"}, dir / "existing.h5"), "exists (use --force"});
  PrepareOptions frac = quick_options({dir / "corpus"}, dir / "x.h5");
  frac.val_fraction = 0.9;
  cases.push_back({"val fraction", frac, "--val-fraction"});
  PrepareOptions tok = quick_options({dir / "corpus"}, dir / "x.h5");
  test::write_file(dir / "not.model", "not a model");
  tok.tokenizer = dir / "not.model";
  cases.push_back({"bad tokenizer", tok, "is not a SentencePiece model"});
  for (const Case& c : cases) {
    const std::string msg = test::user_error_message([&] { prepare(c.opts); });
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(test::read_file(dir / "existing.h5"), "precious bytes") << c.what;
    EXPECT_FALSE(std::filesystem::exists(dir / "x.h5")) << c.what;
    EXPECT_FALSE(dir.has_temp_files()) << c.what;
  }
  PrepareOptions force = quick_options({dir / "corpus"}, dir / "existing.h5");
  force.force = true;
  prepare(force);
  EXPECT_NO_THROW(TokenDataset(dir / "existing.h5"));
}

// ---- through the binary ------------------------------------------------------------------

#define SKIP_WITHOUT_BINARY() \
  if (test::linac_bin().empty()) GTEST_SKIP() << "LINAC_BIN not set or not executable"

TEST(PrepareCli, PrintsASummary) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_corpus(dir, 120);
  const auto r = test::run_linac({"prepare", "--input", dir / "corpus", "--out", dir / "d.h5", "--vocab-size", "400",
                                  "--character-coverage", "1", "--threads", "2", "--val-fraction", "0.05"},
                                 dir);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* key : {"documents", "bytes", "tokens", "bytes/token", "time", "MB/s"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
  EXPECT_EQ(TokenDataset(dir / "d.h5").vocab_size(), 400);
}

TEST(PrepareCli, BadInputsExitWithStatus2AndOneLine) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_corpus(dir, 60);
  std::filesystem::create_directories(dir / "empty");
  test::write_file(dir / "bad.jsonl", "{\"text\": 1}\n");
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  test::write_file(dir / "truncated.h5", test::read_file(dir / "tok.model").substr(0, 10));
  test::write_file(dir / "zero.model", "");
  std::filesystem::create_symlink(dir / "corpus/c.md", dir / "c_link.md");
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);  // refused before it is opened: no writer needed
  // A valid dataset stands in for the output in every case; it must survive byte for byte.
  PrepareOptions o = quick_options({dir / "corpus"}, dir / "keep.h5");
  o.tokenizer = dir / "tok.model";
  prepare(o);
  const std::string keep = test::read_file(dir / "keep.h5");
  const std::string corpus = dir / "corpus", out = dir / "keep.h5";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--input", dir / "nope", "--out", out, "--force"}, "input not found"},
      {{"--input", dir / "empty", "--out", out, "--force"}, "no text found"},
      {{"--input", dir / "bad.jsonl", "--out", out, "--force", "--tokenizer", dir / "tok.model"}, "bad.jsonl:1"},
      {{"--input", corpus, "--out", out, "--force", "--vocab-size", "60000"}, "use at most"},
      {{"--input", corpus, "--out", out}, "exists (use --force"},
      {{"--input", corpus, "--out", out, "--force", "--tokenizer", dir / "truncated.h5"}, "not a SentencePiece model"},
      {{"--input", corpus, "--out", out, "--force", "--tokenizer", dir / "tok.model", "--vocab-size", "9"},
       "either --vocab-size or --tokenizer"},
      {{"--input", corpus, "--out", out, "--force", "--threads", "two"}, "expects an integer"},
      {{"--input", corpus, "--out", out, "--force", "--bogus", "1"}, "unknown option --bogus"},
      {{"--input", corpus, "--input", dir / "corpus/c.md", "--out", out, "--force", "--tokenizer", dir / "tok.model"},
       "input " + corpus + "/c.md is read twice (named twice, or named and found in a named directory)"},
      {{"--input", corpus, "--input", dir / "c_link.md", "--out", out, "--force", "--tokenizer", dir / "tok.model"},
       "input " + dir / "c_link.md" + " is the same file as input " + corpus + "/c.md"},
      {{"--input", dir / "fifo", "--out", out, "--force"}, "input " + dir / "fifo" + " is not a regular file"},
      {{"--input", corpus, "--out", out, "--force", "--max-train-sentences", "100"},
       "--max-train-sentences must be more than 100"},
      {{"--input", corpus, "--out", out, "--force", "--vocab-size", "100000000000"},
       "--vocab-size must be in [1, 2^31 - 1], got 100000000000"},
      {{"--input", corpus, "--out", out, "--force", "--tokenizer", dir / "tok.model", "--character-coverage", "1"},
       "--character-coverage applies to training a tokenizer, not to --tokenizer"},
      {{"--input", corpus, "--out", out, "--force", "--verbose"}, "give either --quiet or --verbose, not both"},
      {{"--input", corpus, "--out", out, "--force", "--tokenizer", dir / "empty"},
       "is not a file; give a SentencePiece"},
      {{"--input", corpus, "--out", out, "--force", "--tokenizer", dir / "zero.model"}, "zero.model is empty"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"prepare", "--quiet"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = test::run_linac(args, dir);
    EXPECT_EQ(r.status, 2) << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(test::read_file(out), keep) << c.message;
    EXPECT_FALSE(dir.has_temp_files()) << c.message;
  }
  // An output where no file can be made is said before the tokenizer is trained (no log line).
  const auto r = test::run_linac({"prepare", "--input", corpus, "--out", "/proc/linac_prepare.h5"}, dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(r.err, "linac prepare: error: cannot write /proc/linac_prepare.h5: No such file or directory\n");
}

// --force never lets the dataset replace a file it is made from: a named input, one found in an
// input directory, the same file under another name (a hard link; a symbolic link is refused as
// a link), a --token-ids file or the --tokenizer dataset.
TEST(PrepareCli, OutputThatIsAnInputIsRefused) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_corpus(dir, 60);
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  PrepareOptions o = quick_options({dir / "corpus"}, dir / "data.h5");
  o.tokenizer = dir / "tok.model";
  prepare(o);
  std::string ids;
  for (const int32_t id : {3, 4, 5, 0, 6, 7, 0}) ids.append(reinterpret_cast<const char*>(&id), 4);
  test::write_file(dir / "ids.bin", ids);
  std::filesystem::create_hard_link(dir / "corpus/c.md", dir / "link.md");
  const std::string corpus = dir / "corpus", md = dir / "corpus/c.md", data = dir / "data.h5";
  const std::vector<std::string> files = {md, dir / "corpus/b.jsonl", data, dir / "ids.bin"};
  std::vector<std::string> before;
  for (const std::string& f : files) before.push_back(test::read_file(f));
  const std::vector<std::vector<std::string>> cases = {
      {"--input", md, "--out", md, "--vocab-size", "400"},
      {"--input", corpus, "--out", dir / "corpus/b.jsonl", "--vocab-size", "400"},
      {"--input", md, "--out", dir / "link.md", "--vocab-size", "400"},
      {"--input", md, "--out", data, "--tokenizer", data},
      {"--token-ids", dir / "ids.bin", "--out", dir / "ids.bin", "--vocab-size", "10", "--eos-id", "0"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"prepare", "--quiet", "--force"};
    args.insert(args.end(), c.begin(), c.end());
    const auto r = test::run_linac(args, dir);
    EXPECT_EQ(r.status, 2) << c[3] << "\n" << r.err;
    EXPECT_NE(r.err.find("linac prepare: error: output " + c[3] + " is the "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("; give another --out"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(test::read_file(files[i]), before[i]) << files[i];
    EXPECT_FALSE(dir.has_temp_files()) << c[3];
  }
}

// Starts `prepare --force` of a corpus large enough to take a while into OUT with the given
// disposition of `sig`, sends it `sig` once its temporary file exists, and returns its wait
// status (-1 when it finished before).
int status_after_signal(const TempDir& dir, int sig, void (*disposition)(int)) {
  test::write_file(dir / "tok.model", test::tiny_tokenizer().model_bytes());
  std::string big;
  for (const auto& d : test::synthetic_documents(20000, 9)) big += d + "\n\n";
  for (int i = 0; i < 4; ++i) test::write_file(dir / ("corpus/p" + std::to_string(i) + ".txt"), big);
  test::write_file(dir / "out.h5", "the previous dataset");
  const std::string bin = test::linac_bin(), out = dir / "out.h5", tok = dir / "tok.model", in = dir / "corpus";
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    (void)!freopen("/dev/null", "w", stdout);
    signal(sig, disposition);  // whatever the test runner's shell left it at
    execl(bin.c_str(), bin.c_str(), "prepare", "--input", in.c_str(), "--out", out.c_str(), "--tokenizer",
          tok.c_str(), "--threads", "1", "--force", static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string tmp = out + ".tmp-" + std::to_string(pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (!std::filesystem::exists(tmp)) {
    if (waitpid(pid, &status, WNOHANG) == pid || std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, sig);
  return waitpid(pid, &status, 0) == pid ? status : -1;
}

TEST(PrepareCli, InterruptLeavesNoPartialFile) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  const int status = status_after_signal(dir, SIGINT, SIG_DFL);
  ASSERT_NE(status, -1) << "prepare finished before its temporary file was seen";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  EXPECT_FALSE(dir.has_temp_files());
  EXPECT_EQ(test::read_file(dir / "out.h5"), "the previous dataset");
}

// A signal ignored when prepare starts stays ignored (`nohup linac prepare ...` outlives its
// terminal); it used to end the run once the temporary file existed.
TEST(PrepareCli, IgnoredHangupStaysIgnored) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  const int status = status_after_signal(dir, SIGHUP, SIG_IGN);
  ASSERT_NE(status, -1) << "prepare finished before its temporary file was seen";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(dir.has_temp_files());
  EXPECT_GT(TokenDataset(dir / "out.h5").size(Split::Train), 0u);
}

// --force renames the new dataset over OUT: a link would be replaced instead of its target, a
// FIFO or device by a regular file. Both are refused and left as they were.
TEST(PrepareCli, OutputThatIsALinkOrNotAFileIsRefused) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_corpus(dir, 60);
  test::write_file(dir / "target.h5", "the link's target");
  std::filesystem::create_symlink(dir / "target.h5", dir / "link.h5");
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  const std::pair<std::string, std::string> cases[] = {
      {dir / "link.h5", "output " + dir / "link.h5" + " is a symbolic link (to " + dir / "target.h5" +
                            "); give the file itself as --out"},
      {dir / "fifo", "output " + dir / "fifo" + " is not a regular file (a device, FIFO or socket)"},
  };
  for (const auto& [out, message] : cases) {
    const auto r = test::run_linac({"prepare", "--quiet", "--force", "--input", dir / "corpus", "--out", out}, dir);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.h5"));
  EXPECT_EQ(test::read_file(dir / "target.h5"), "the link's target");
  EXPECT_TRUE(std::filesystem::is_fifo(dir / "fifo"));
  EXPECT_FALSE(dir.has_temp_files());
}

// A checkpoint's tokenizer tokenises new text as its run's dataset did (an imported model's
// tokenizer.model alike).
TEST(PrepareCli, ACheckpointsTokenizerIsTheRunsOwn) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_corpus(dir, 60);
  const std::string ckpt = test::tiny_checkpoint("prepare_tokenizer", 1);
  const auto r = test::run_linac(
      {"prepare", "--quiet", "--input", dir / "corpus", "--out", dir / "new.h5", "--tokenizer", ckpt}, dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const TokenDataset made(dir / "new.h5"), run(test::tiny_dataset());
  EXPECT_EQ(made.tokenizer_bytes(), run.tokenizer_bytes());
  EXPECT_GT(made.size(Split::Train), 0u);
}

}  // namespace
}  // namespace linac::test_prepare
