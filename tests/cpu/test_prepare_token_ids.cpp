// `linac prepare --token-ids`: random ids in, dataset out (ids, documents and EOS placement, the
// split rule, uint16 vs uint32), every refusal through the library and the binary (exit status
// 2, one line naming the file or option, nothing written), and a run on such data: training with
// document packing, a checkpoint without a tokenizer, then `linac eval` (loss, no bits per byte),
// `info` and `generate --prompt-ids` on it.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/hdf5_util.h"
#include "data/prepare.h"
#include "data/test_fixtures.h"
#include "data/token_dataset.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train_fixture.h"

namespace linac::test_prepare_token_ids {
namespace {

using test::TempDir;
using Doc = std::vector<int32_t>;

// One .bin file: each document's ids, then eos unless it is the file's last and !last_eos.
void write_ids(const std::string& path, const std::vector<Doc>& docs, int32_t eos, bool last_eos = true) {
  std::string bytes;
  auto put = [&](uint32_t id) {
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((id >> (8 * b)) & 0xFF);
  };
  for (size_t d = 0; d < docs.size(); ++d) {
    for (int32_t id : docs[d]) put(static_cast<uint32_t>(id));
    if (last_eos || d + 1 < docs.size()) put(static_cast<uint32_t>(eos));
  }
  test::write_file(path, bytes);
}

// n documents of 1-40 ids in [0, vocab), none of them eos.
std::vector<Doc> random_docs(size_t n, int64_t vocab, int32_t eos, uint64_t seed) {
  Rng rng{seed, 3, 0};
  std::vector<Doc> docs(n);
  for (Doc& d : docs) {
    d.resize(1 + rng.below(40));
    for (int32_t& id : d) {
      do id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      while (id == eos);
    }
  }
  return docs;
}

std::vector<int32_t> split_ids(const TokenDataset& ds, Split s) {
  std::vector<int32_t> all(ds.size(s));
  ds.read(s, 0, all.size(), all.data());
  return all;
}

PrepareOptions ids_options(const std::vector<std::string>& files, const std::string& out, int64_t vocab, int64_t eos) {
  PrepareOptions o;
  o.token_ids = files;
  o.out = out;
  o.vocab_size = vocab;
  o.eos_id = eos;
  o.val_fraction = 0.2;
  o.progress = false;
  return o;
}

TEST(PrepareTokenIds, IdsDocumentsAndSplitReadBackAsGiven) {
  for (const int64_t vocab : {int64_t{1000}, int64_t{70000}}) {
    TempDir dir;
    const int32_t eos = static_cast<int32_t>(vocab - 7);
    const std::vector<Doc> docs = random_docs(90, vocab, eos, static_cast<uint64_t>(vocab));
    // Three files; the second's last document has no EOS and gets one.
    const std::vector<Doc> a(docs.begin(), docs.begin() + 30), b(docs.begin() + 30, docs.begin() + 50),
        c(docs.begin() + 50, docs.end());
    write_ids(dir / "a.bin", a, eos);
    write_ids(dir / "b.bin", b, eos, false);
    write_ids(dir / "c.bin", c, eos);
    test::write_file(dir / "empty.bin", "");
    PrepareOptions o = ids_options({dir / "a.bin", dir / "empty.bin", dir / "b.bin", dir / "c.bin"}, dir / "ids.h5",
                                   vocab, eos);
    o.bos_id = 3;
    const PrepareStats st = prepare(o);
    EXPECT_EQ(st.eos_added, 1u);
    EXPECT_EQ(st.dtype, vocab <= 65536 ? "uint16" : "uint32");

    std::vector<int32_t> want[2];
    uint64_t want_docs[2] = {0, 0};
    for (size_t i = 0; i < docs.size(); ++i) {
      const int s = is_val_document(i, 0.2) ? 1 : 0;
      want[s].insert(want[s].end(), docs[i].begin(), docs[i].end());
      want[s].push_back(eos);
      ++want_docs[s];
    }
    ASSERT_GT(want_docs[1], 0u);  // the seeded draw gives both splits documents: no adjustment here
    const TokenDataset ds(dir / "ids.h5");
    EXPECT_EQ(split_ids(ds, Split::Train), want[0]);
    EXPECT_EQ(split_ids(ds, Split::Val), want[1]);
    EXPECT_EQ(ds.documents(Split::Train), static_cast<int64_t>(want_docs[0]));
    EXPECT_EQ(ds.documents(Split::Val), static_cast<int64_t>(want_docs[1]));
    EXPECT_EQ(st.tokens_train + st.tokens_val, want[0].size() + want[1].size());
    EXPECT_EQ(ds.dtype(), vocab <= 65536 ? h5::Type::U16 : h5::Type::U32);
    EXPECT_EQ(ds.vocab_size(), vocab);
    EXPECT_EQ(ds.eos_id(), eos);
    EXPECT_EQ(ds.bos_id(), 3);
    EXPECT_EQ(ds.pad_id(), -1);
    EXPECT_FALSE(ds.has_tokenizer());
    EXPECT_TRUE(ds.tokenizer_bytes().empty());
    try {
      (void)ds.tokenizer();
      ADD_FAILURE() << "a dataset without a tokenizer handed one out";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("has no tokenizer"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(dir.has_temp_files());
  }
}

// The text path's rule: the last of >= 2 documents goes to an empty val split, one goes to train.
TEST(PrepareTokenIds, SplitKeepsBothSidesNonEmpty) {
  TempDir dir;
  const std::vector<Doc> docs = {{5, 6}, {}, {7}};  // an empty document: two EOS in a row
  write_ids(dir / "three.bin", docs, 1);
  PrepareOptions o = ids_options({dir / "three.bin"}, dir / "three.h5", 10, 1);
  o.val_fraction = 0.001;
  PrepareStats st = prepare(o);
  EXPECT_EQ(st.documents_train, 2u);
  EXPECT_EQ(st.documents_val, 1u);
  EXPECT_EQ(split_ids(TokenDataset(dir / "three.h5"), Split::Train), (std::vector<int32_t>{5, 6, 1, 1}));
  EXPECT_EQ(split_ids(TokenDataset(dir / "three.h5"), Split::Val), (std::vector<int32_t>{7, 1}));

  {  // An empty /tokenizer, as well as an absent one, means none.
    h5::File f = h5::File::open(dir / "three.h5", true);
    h5::Dataset::create(f.id(), "tokenizer", h5::Type::U8, {0});
  }
  EXPECT_FALSE(TokenDataset(dir / "three.h5").has_tokenizer());
  EXPECT_EQ(split_ids(TokenDataset(dir / "three.h5"), Split::Val), (std::vector<int32_t>{7, 1}));

  write_ids(dir / "one.bin", {{4, 4, 4}}, 1, false);
  o = ids_options({dir / "one.bin"}, dir / "one.h5", 10, 1);
  o.val_fraction = 0.5;
  st = prepare(o);
  EXPECT_EQ(st.documents_train, 1u);
  EXPECT_EQ(st.documents_val, 0u);
  EXPECT_EQ(split_ids(TokenDataset(dir / "one.h5"), Split::Train), (std::vector<int32_t>{4, 4, 4, 1}));
}

TEST(PrepareTokenIds, BadInputsFailBeforeWritingAnything) {
  TempDir dir;
  write_ids(dir / "good.bin", random_docs(10, 50, 0, 1), 0);
  test::write_file(dir / "odd.bin", std::string(7, '\0'));
  write_ids(dir / "big.bin", {{1, 2}, {3, 50}}, 0);  // id 50 at index 4
  test::write_file(dir / "empty.bin", "");
  test::write_file(dir / "existing.h5", "precious bytes");
  test::write_file(dir / "corpus.txt", "some text\n");
  struct Case {
    const char* what;
    PrepareOptions opts;
    std::string message;
  };
  const std::string good = dir / "good.bin", out = dir / "existing.h5";
  std::vector<Case> cases;
  auto add = [&](const char* what, PrepareOptions o, const std::string& message) {
    o.force = true;  // even with --force, a failed run leaves the old file alone
    cases.push_back({what, std::move(o), message});
  };
  add("size", ids_options({good, dir / "odd.bin"}, out, 50, 0), dir / "odd.bin: size 7 bytes is not a multiple of 4");
  add("id", ids_options({good, dir / "big.bin"}, out, 50, 0),
      dir / "big.bin: id 50 at index 4 is not below --vocab-size 50");
  add("eos", ids_options({good}, out, 50, 50), "--eos-id 50 is not an id of the vocabulary [0, 50)");
  PrepareOptions bos = ids_options({good}, out, 50, 0);
  bos.bos_id = 77;
  add("bos", bos, "--bos-id 77");
  add("missing", ids_options({good, dir / "nope.bin"}, out, 50, 0), "file not found: " + dir / "nope.bin");
  add("directory", ids_options({dir.path().string()}, out, 50, 0), "is not a regular file");
  add("empty", ids_options({dir / "empty.bin"}, out, 50, 0), "no token ids in the inputs (1 files, all empty)");
  add("vocab", ids_options({good}, out, 0, 0), "--vocab-size must be in");
  PrepareOptions mixed = ids_options({good}, out, 50, 0);
  mixed.inputs = {dir / "corpus.txt"};
  add("with --input", mixed, "either --input (text to tokenise) or --token-ids");
  PrepareOptions tok = ids_options({good}, out, 50, 0);
  tok.tokenizer = dir / "tok.model";
  add("with --tokenizer", tok, "--tokenizer does not apply to --token-ids");
  for (const Case& c : cases) {
    std::string msg;
    try {
      prepare(c.opts);
    } catch (const UserError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(test::read_file(out), "precious bytes") << c.what;
    EXPECT_FALSE(dir.has_temp_files()) << c.what;
  }
}

#define SKIP_WITHOUT_BINARY() \
  if (test::linac_bin().empty()) GTEST_SKIP() << "LINAC_BIN not set or not executable"

TEST(PrepareTokenIdsCli, SummaryAndRefusals) {
  SKIP_WITHOUT_BINARY();
  TempDir dir;
  write_ids(dir / "a.bin", random_docs(20, 300, 2, 5), 2);
  write_ids(dir / "b.bin", random_docs(20, 300, 2, 6), 2, false);
  test::write_file(dir / "odd.bin", "abcde");
  test::write_file(dir / "corpus.txt", "some text\n");
  const std::string a = dir / "a.bin", b = dir / "b.bin", out = dir / "ids.h5";
  auto r = test::run_linac({"prepare", "--quiet", "--token-ids", a, b, "--vocab-size", "300", "--eos-id", "2",
                            "--out", out},
                           dir);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* key : {"documents    40", "no tokenizer", "1 of 2 files did not end with --eos-id 2"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
  const std::string keep = test::read_file(out);
  const std::vector<std::string> ids = {"--token-ids", a, "--out", out, "--force"};
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--eos-id", "2"}, "--token-ids needs --vocab-size V"},
      {{"--vocab-size", "300"}, "--token-ids needs --eos-id E"},
      {{"--vocab-size", "300", "--eos-id", "300"}, "--eos-id 300 is not an id of the vocabulary"},
      {{"--vocab-size", "300", "--eos-id", "2", "--input", dir / "corpus.txt"}, "either --input"},
      {{"--vocab-size", "300", "--eos-id", "2", "--tokenizer", a}, "--tokenizer applies to text input"},
      {{"--vocab-size", "300", "--eos-id", "2", "--threads", "2"}, "--threads applies to text input"},
      {{"--vocab-size", "300", "--eos-id", "2", dir / "odd.bin"}, "odd.bin: size 5 bytes is not a multiple of 4"},
      {{"--vocab-size", "100", "--eos-id", "2"}, "a.bin: id "},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"prepare", "--quiet"};
    args.insert(args.end(), ids.begin(), ids.end());
    args.insert(args.end(), c.args.begin(), c.args.end());
    r = test::run_linac(args, dir);
    EXPECT_EQ(r.status, 2) << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(test::read_file(out), keep) << c.message;
    EXPECT_FALSE(dir.has_temp_files()) << c.message;
  }
  r = test::run_linac({"prepare", "--quiet", "--input", dir / "corpus.txt", "--eos-id", "2", "--out", dir / "t.h5"}, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--eos-id applies to --token-ids only"), std::string::npos) << r.err;
}

// A split of the tiny text dataset as token-id files, one document per EOS-terminated run.
void write_split_as_ids(const std::string& path, Split s) {
  const TokenDataset ds(test::tiny_dataset());
  const std::vector<int32_t> all = split_ids(ds, s);
  std::ofstream f(path, std::ios::binary);
  for (int32_t id : all)
    for (int b = 0; b < 4; ++b) f.put(static_cast<char>((static_cast<uint32_t>(id) >> (8 * b)) & 0xFF));
}

TEST(PrepareTokenIds, TrainWithDocumentPackingThenEvalWithoutBitsPerByte) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "linac binary not built";
  const std::string dir = test::fresh_dir("token_ids_run");
  const int64_t eos = TokenDataset(test::tiny_dataset()).eos_id();
  write_split_as_ids(dir + "/train.bin", Split::Train);
  PrepareOptions o = ids_options({dir + "/train.bin"}, dir + "/ids.h5", 300, eos);
  o.val_fraction = 0.1;
  prepare(o);
  // The tiny dataset's val split as the train split of an ids dataset: the same tokens to score.
  write_split_as_ids(dir + "/val.bin", Split::Val);
  o = ids_options({dir + "/val.bin"}, dir + "/val_ids.h5", 300, eos);
  o.val_fraction = 0;
  prepare(o);
  EXPECT_EQ(split_ids(TokenDataset(dir + "/val_ids.h5"), Split::Train),
            split_ids(TokenDataset(test::tiny_dataset()), Split::Val));

  json cfg = test::tiny_train_config(dir + "/run");
  cfg["data"]["path"] = dir + "/ids.h5";
  cfg["data"]["packing"] = "document";
  ASSERT_EQ(run_training(Config::from_json(cfg, "ids"), ""), 0);
  const std::string ckpt = test::latest_checkpoint_path(dir + "/run");
  ASSERT_FALSE(ckpt.empty());
  EXPECT_TRUE(CheckpointReader(ckpt).data().tokenizer.empty());

  std::string out;
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --data " + dir + "/val_ids.h5 --split train --json", out), 0)
      << out;
  const json ids = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(ids["packing"], "document");
  EXPECT_TRUE(ids["bits_per_byte"].is_null());
  EXPECT_TRUE(ids["bytes"].is_null());
  EXPECT_NE(ids["bits_per_byte_unavailable"].get<std::string>().find("no tokenizer"), std::string::npos);
  // The same tokens in the text dataset: the same loss, and there its tokenizer gives the bytes.
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --data " + test::tiny_dataset() + " --split val --json", out),
            0)
      << out;
  const json text = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(ids["tokens"], text["tokens"]);
  EXPECT_GT(ids["tokens"].get<int64_t>(), 0);
  EXPECT_NEAR(ids["loss"].get<double>(), text["loss"].get<double>(), 1e-9);
  EXPECT_NEAR(ids["perplexity"].get<double>(), text["perplexity"].get<double>(), 1e-6);
  EXPECT_GT(text["bits_per_byte"].get<double>(), 0);

  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt, out), 0) << out;
  EXPECT_NE(out.find("bits/byte unavailable: no tokenizer"), std::string::npos) << out;
  EXPECT_NE(out.find("| loss "), std::string::npos) << out;
  ASSERT_EQ(test::run_linac("info " + ckpt, out), 0) << out;
  EXPECT_NE(out.find("tokenizer   none"), std::string::npos) << out;
  ASSERT_EQ(test::run_linac("generate --checkpoint " + ckpt + " --prompt-ids 5,6,7 --max-new-tokens 3", out), 0)
      << out;
  ASSERT_NE(test::run_linac("generate --checkpoint " + ckpt + " --prompt hello", out), 0);
  EXPECT_NE(out.find("give --prompt-ids"), std::string::npos) << out;
}

}  // namespace
}  // namespace linac::test_prepare_token_ids
