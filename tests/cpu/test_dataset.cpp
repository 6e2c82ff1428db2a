// HDF5 token datasets: schema and attributes, range reads across chunks, uint16/uint32, and
// every broken-file case (missing, not HDF5, truncated, corrupt, incomplete, wrong vocab).
#include <filesystem>

#include "core/error.h"
#include "data/hdf5_util.h"
#include "data/test_fixtures.h"
#include "data/token_dataset.h"

namespace linac::test_dataset {
namespace {

std::vector<int32_t> pattern(size_t n, int64_t vocab, int32_t salt) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7919 + salt) % static_cast<size_t>(vocab));
  return v;
}

TEST(TokenDataset, SchemaAndAttributes) {
  test::TempDir dir;
  const std::string path = dir / "t.h5";
  TokenFileMeta meta;
  meta.vocab_size = 400;
  meta.source = R"(["corpus/"])";
  meta.tokenizer = test::tiny_tokenizer().model_bytes();
  meta.val_fraction = 0.25;
  {
    TokenDatasetWriter w(path, meta);
    const std::vector<int32_t> doc = {10, 11, 12};
    w.add_document(Split::Train, doc.data(), doc.size());
    w.add_document(Split::Train, doc.data(), 2);
    w.add_document(Split::Val, doc.data(), 1);
    w.finish();
  }
  // Raw view, as h5py or another tool would see the file.
  h5::File f = h5::File::open(path, false);
  EXPECT_EQ(h5::attr_int(f.id(), "format_version"), 1);
  EXPECT_EQ(h5::attr_int(f.id(), "vocab_size"), 400);
  EXPECT_EQ(h5::attr_int(f.id(), "pad_id"), 0);
  EXPECT_EQ(h5::attr_int(f.id(), "unk_id"), 1);
  EXPECT_EQ(h5::attr_int(f.id(), "bos_id"), 2);
  EXPECT_EQ(h5::attr_int(f.id(), "eos_id"), 3);
  EXPECT_EQ(h5::attr_string(f.id(), "dtype"), "uint16");
  EXPECT_EQ(h5::attr_string(f.id(), "source"), R"(["corpus/"])");
  EXPECT_EQ(h5::attr_int(f.id(), "n_documents_train"), 2);
  EXPECT_EQ(h5::attr_int(f.id(), "n_documents_val"), 1);
  EXPECT_DOUBLE_EQ(h5::attr_double(f.id(), "val_fraction"), 0.25);
  const h5::Dataset train = h5::Dataset::open(f.id(), "train");
  EXPECT_EQ(train.type(), h5::Type::U16);
  EXPECT_EQ(train.dims(), std::vector<uint64_t>{7});
  std::vector<int32_t> all(7);
  train.read_all(all.data(), h5::Type::I32);
  EXPECT_EQ(all, (std::vector<int32_t>{10, 11, 12, 3, 10, 11, 3}));
  const h5::Dataset tok = h5::Dataset::open(f.id(), "tokenizer");
  EXPECT_EQ(tok.type(), h5::Type::U8);
  EXPECT_EQ(tok.size(), meta.tokenizer.size());
  f.close();

  const TokenDataset ds(path);
  EXPECT_EQ(ds.vocab_size(), 400);
  EXPECT_EQ(ds.size(Split::Train), 7u);
  EXPECT_EQ(ds.size(Split::Val), 2u);
  EXPECT_EQ(ds.documents(Split::Train), 2);
  EXPECT_EQ(ds.documents(Split::Val), 1);
  EXPECT_EQ(ds.tokenizer_bytes(), meta.tokenizer);
  EXPECT_EQ(ds.tokenizer().vocab_size(), 400);
  std::vector<int32_t> val(2);
  ds.read(Split::Val, 0, 2, val.data());
  EXPECT_EQ(val, (std::vector<int32_t>{10, 3}));
}

TEST(TokenDataset, RangeReadsAcrossChunks) {
  test::TempDir dir;
  const size_t n = 2 * kTokenChunk + 1234;  // several chunks and a partial one
  const auto train = pattern(n, 400, 1), val = pattern(5000, 400, 2);
  test::write_token_file(dir / "t.h5", train, val, 400);
  const TokenDataset ds(dir / "t.h5");
  ASSERT_EQ(ds.size(Split::Train), n);
  Rng rng{3, 0, 0};
  for (int k = 0; k < 50; ++k) {
    const uint64_t count = 1 + rng.below(3000), off = rng.below(n - count);
    std::vector<int32_t> got(count);
    ds.read(Split::Train, off, count, got.data());
    ASSERT_TRUE(std::equal(got.begin(), got.end(), train.begin() + static_cast<long>(off))) << off;
  }
  std::vector<int32_t> tail(10);
  ds.read(Split::Train, n - 10, 10, tail.data());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), train.end() - 10));
  std::vector<int32_t> one(1);
  EXPECT_THROW(ds.read(Split::Train, n, 1, one.data()), Error);  // past the end: a caller bug
}

TEST(TokenDataset, ElementTypeFollowsVocab) {
  EXPECT_EQ(token_type_for_vocab(400), h5::Type::U16);
  EXPECT_EQ(token_type_for_vocab(65536), h5::Type::U16);
  EXPECT_EQ(token_type_for_vocab(65537), h5::Type::U32);
  test::TempDir dir;
  const auto train = pattern(1000, 100000, 5);
  test::write_token_file(dir / "big.h5", train, {99999, 3}, 100000);
  const TokenDataset ds(dir / "big.h5");
  EXPECT_EQ(ds.dtype(), h5::Type::U32);
  std::vector<int32_t> got(1000), val(2);
  ds.read(Split::Train, 0, 1000, got.data());
  ds.read(Split::Val, 0, 2, val.data());
  EXPECT_EQ(got, train);
  EXPECT_EQ(val, (std::vector<int32_t>{99999, 3}));
}

TEST(TokenDataset, MissingOrNonHdf5FileIsUserError) {
  test::TempDir dir;
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "nope.h5"); }).find("token dataset not found"),
            std::string::npos);
  test::write_file(dir / "text.h5", "hello, I am plain text and not HDF5 at all");
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "text.h5"); }).find("is not an HDF5 file"),
            std::string::npos);
  test::write_file(dir / "empty.h5", "");
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "empty.h5"); }).find("is not an HDF5 file"),
            std::string::npos);
}

TEST(TokenDataset, TruncatedFileIsUserError) {
  test::TempDir dir;
  test::write_token_file(dir / "t.h5", pattern(200000, 400, 1), pattern(1000, 400, 2), 400);
  const std::string bytes = test::read_file(dir / "t.h5");
  for (size_t keep : {bytes.size() / 2, bytes.size() - 100, size_t{2048}}) {
    test::write_file(dir / "cut.h5", bytes.substr(0, keep));
    const std::string msg = test::user_error_message([&] { TokenDataset d(dir / "cut.h5"); });
    EXPECT_NE(msg.find(dir / "cut.h5"), std::string::npos) << msg;
    // The superblock is whole in every cut: the message gives the sizes, not HDF5's internal names.
    EXPECT_NE(msg.find("truncated: " + std::to_string(keep) + " bytes of the " + std::to_string(bytes.size()) +
                       " its header records"),
              std::string::npos)
        << msg;
  }
}

TEST(TokenDataset, CorruptHeaderIsUserError) {
  test::TempDir dir;
  test::write_token_file(dir / "t.h5", pattern(5000, 400, 1), pattern(100, 400, 2), 400);
  std::string bytes = test::read_file(dir / "t.h5");
  for (size_t i = 8; i < 96; ++i) bytes[i] = static_cast<char>(0xA5);  // superblock after the signature
  test::write_file(dir / "bad.h5", bytes);
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "bad.h5"); }).find(dir / "bad.h5"), std::string::npos);
}

TEST(TokenDataset, OutOfVocabularyTokensAreUserError) {
  test::TempDir dir;
  test::write_token_file(dir / "t.h5", pattern(5000, 400, 1), pattern(100, 400, 2), 400);
  {
    h5::File f = h5::File::open(dir / "t.h5", true);
    h5::set_attr(f.id(), "vocab_size", int64_t{50});  // now most stored ids are out of range
    f.close();
  }
  const TokenDataset ds(dir / "t.h5");
  std::vector<int32_t> out(5000);
  EXPECT_NE(test::user_error_message([&] {
              ds.read(Split::Train, 0, 5000, out.data());
            }).find("outside the vocabulary of 50"),
            std::string::npos);
}

TEST(TokenDataset, IncompleteFilesAreRejected) {
  test::TempDir dir;
  {  // a writer that never finished, as an interrupted prepare would leave under its temp name
    TokenFileMeta meta;
    meta.vocab_size = 400;
    TokenDatasetWriter w(dir / "partial.h5", meta);
    const auto v = pattern(100, 400, 1);
    w.append(Split::Train, v.data(), v.size());
  }
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "partial.h5"); }).find("missing attribute"),
            std::string::npos);

  test::write_token_file(dir / "t.h5", pattern(100, 400, 1), pattern(10, 400, 2), 400);
  {
    h5::File f = h5::File::open(dir / "t.h5", true);
    H5Ldelete(f.id(), "val", H5P_DEFAULT);
    h5::set_attr(f.id(), "format_version", int64_t{7});
    f.close();
  }
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "t.h5"); }).find("format_version 7"),
            std::string::npos);
  {
    h5::File f = h5::File::open(dir / "t.h5", true);
    h5::set_attr(f.id(), "format_version", int64_t{1});
    f.close();
  }
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "t.h5"); }).find("missing dataset /val"),
            std::string::npos);
  {
    h5::File f = h5::File::open(dir / "t.h5", true);
    h5::set_attr(f.id(), "dtype", std::string("uint32"));
    f.close();
  }
  EXPECT_NE(test::user_error_message([&] { TokenDataset d(dir / "t.h5"); }).find("attribute dtype says uint32"),
            std::string::npos);
}

TEST(TokenDataset, VocabMismatchNamesBothSizes) {
  test::TempDir dir;
  test::write_token_file(dir / "t.h5", pattern(100, 400, 1), pattern(10, 400, 2), 400);
  const TokenDataset ds(dir / "t.h5");
  EXPECT_NO_THROW(check_dataset_vocab(ds, 400));
  const std::string msg = test::user_error_message([&] { check_dataset_vocab(ds, 32000); });
  EXPECT_NE(msg.find("vocab_size 400"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.vocab_size is 32000"), std::string::npos) << msg;
}

TEST(Hdf5Util, ErrorsCarryTheLibraryMessage) {
  test::TempDir dir;
  try {
    h5::File::open(dir / "absent.h5", false);
    FAIL() << "expected linac::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unable to open file"), std::string::npos) << e.what();
  }
  h5::File f = h5::File::create(dir / "x.h5", false);
  EXPECT_THROW(h5::File::create(dir / "x.h5", false), Error);  // exists, no overwrite
  auto d = h5::Dataset::create(f.id(), "params/layer0/w", h5::Type::F32, {2, 3});
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  d.write(w.data(), h5::Type::F32);
  h5::set_attr(d.id(), "note", std::string("überall"));
  EXPECT_TRUE(h5::exists(f.id(), "params/layer0/w"));
  EXPECT_TRUE(h5::exists(f.id(), "/params/layer0/w"));
  EXPECT_FALSE(h5::exists(f.id(), "params/layer1/w"));
  EXPECT_FALSE(h5::exists(f.id(), "params/layer0/w/not_a_group"));
  EXPECT_EQ(h5::attr_string(d.id(), "note"), "überall");
  EXPECT_THROW(h5::attr_int(d.id(), "note"), Error);
  EXPECT_THROW(h5::Dataset::open(f.id(), "nothing"), Error);
  std::vector<double> back(6);
  d.read_all(back.data(), h5::Type::F64);
  EXPECT_EQ(back, (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace linac::test_dataset
