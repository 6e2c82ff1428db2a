#include "data/token_dataset.h"

#include <filesystem>

#include "core/error.h"

namespace linac {
namespace {

constexpr size_t kWriteBuffer = 1 << 20;     // tokens buffered per split before an append
constexpr size_t kReadCacheBytes = 4 << 20;  // chunk cache per split: sequential reads hit memory

const char* dataset_name(Split s) { return s == Split::Train ? "train" : "val"; }

}  // namespace

const char* split_name(Split s) { return dataset_name(s); }

Split parse_split(const std::string& name) {
  if (name == "train") return Split::Train;
  if (name == "val") return Split::Val;
  throw UserError("split must be train or val, got '" + name + "'");
}

h5::Type token_type_for_vocab(int64_t vocab_size) {
  LINAC_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), "vocab size " + std::to_string(vocab_size));
  return vocab_size <= 65536 ? h5::Type::U16 : h5::Type::U32;
}

TokenDatasetWriter::TokenDatasetWriter(const std::string& path, const TokenFileMeta& meta)
    : meta_(meta), file_(h5::File::create(path, false)) {
  const h5::Type t = token_type_for_vocab(meta.vocab_size);
  for (Split s : {Split::Train, Split::Val})
    data_.push_back(h5::Dataset::create_appendable(file_.id(), dataset_name(s), t, kTokenChunk));
  for (auto& b : buf_) b.reserve(kWriteBuffer);
}

void TokenDatasetWriter::append(Split s, const int32_t* ids, size_t n) {
  auto& b = buf_[idx(s)];
  for (size_t i = 0; i < n; ++i) {
    LINAC_CHECK(ids[i] >= 0 && ids[i] < meta_.vocab_size, "token id " + std::to_string(ids[i]) + " outside vocab");
    b.push_back(ids[i]);
    if (b.size() == kWriteBuffer) flush(s);
  }
  tokens_[idx(s)] += n;
}

void TokenDatasetWriter::add_document(Split s, const int32_t* ids, size_t n) {
  append(s, ids, n);
  const int32_t eos = static_cast<int32_t>(meta_.eos_id);
  append(s, &eos, 1);
  ++docs_[idx(s)];
}

void TokenDatasetWriter::flush(Split s) {
  auto& b = buf_[idx(s)];
  data_[idx(s)].append(b.data(), b.size(), h5::Type::I32);
  b.clear();
}

void TokenDatasetWriter::finish() {
  flush(Split::Train);
  flush(Split::Val);
  const hid_t root = file_.id();
  if (!meta_.tokenizer.empty()) {
    auto tok = h5::Dataset::create(root, "tokenizer", h5::Type::U8, {meta_.tokenizer.size()});
    tok.write(meta_.tokenizer.data(), h5::Type::U8);
  }
  h5::set_attr(root, "format_version", kTokenFormatVersion);
  h5::set_attr(root, "vocab_size", meta_.vocab_size);
  h5::set_attr(root, "eos_id", meta_.eos_id);
  h5::set_attr(root, "bos_id", meta_.bos_id);
  h5::set_attr(root, "pad_id", meta_.pad_id);
  h5::set_attr(root, "unk_id", meta_.unk_id);
  h5::set_attr(root, "dtype", std::string(h5::type_name(token_type_for_vocab(meta_.vocab_size))));
  h5::set_attr(root, "source", meta_.source);
  h5::set_attr(root, "n_documents_train", static_cast<int64_t>(docs_[0]));
  h5::set_attr(root, "n_documents_val", static_cast<int64_t>(docs_[1]));
  h5::set_attr(root, "val_fraction", meta_.val_fraction);
  for (h5::Dataset& d : data_) d.close();
  data_.clear();
  file_.close();
}

TokenDataset::TokenDataset(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UserError("token dataset not found: " + path);
  if (!h5::is_hdf5(path))
    throw UserError(path + " is not an HDF5 file (unreadable, corrupt, or not written by linac prepare)");
  const auto bad = [&](const std::string& what) { return UserError(path + ": " + what); };
  try {
    file_ = h5::File::open(path, false);
    const hid_t root = file_.id();
    for (const char* a : {"format_version", "vocab_size", "eos_id", "bos_id", "pad_id", "unk_id", "dtype", "source",
                          "n_documents_train", "n_documents_val"})
      if (!h5::has_attr(root, a)) throw bad(std::string("missing attribute '") + a + "' (not a complete linac token dataset)");
    const int64_t version = h5::attr_int(root, "format_version");
    if (version != kTokenFormatVersion)
      throw bad("format_version " + std::to_string(version) + " is not supported (this linac reads " +
                std::to_string(kTokenFormatVersion) + ")");
    vocab_size_ = h5::attr_int(root, "vocab_size");
    eos_id_ = h5::attr_int(root, "eos_id");
    bos_id_ = h5::attr_int(root, "bos_id");
    pad_id_ = h5::attr_int(root, "pad_id");
    unk_id_ = h5::attr_int(root, "unk_id");
    source_ = h5::attr_string(root, "source");
    n_docs_[0] = h5::attr_int(root, "n_documents_train");
    n_docs_[1] = h5::attr_int(root, "n_documents_val");
    if (vocab_size_ <= 0 || vocab_size_ > (int64_t{1} << 31))
      throw bad("vocab_size " + std::to_string(vocab_size_) + " is out of range");
    if (eos_id_ < 0 || eos_id_ >= vocab_size_)
      throw bad("eos_id " + std::to_string(eos_id_) + " is outside the vocabulary of " + std::to_string(vocab_size_));
    const std::string dtype = h5::attr_string(root, "dtype");
    if (dtype != "uint16" && dtype != "uint32") throw bad("dtype '" + dtype + "' is not uint16 or uint32");
    dtype_ = dtype == "uint16" ? h5::Type::U16 : h5::Type::U32;
    if (dtype_ == h5::Type::U16 && vocab_size_ > 65536)
      throw bad("dtype uint16 cannot hold vocab_size " + std::to_string(vocab_size_));
    for (Split s : {Split::Train, Split::Val}) {
      const std::string name = dataset_name(s);
      if (!h5::exists(root, name)) throw bad("missing dataset /" + name);
      data_.push_back(h5::Dataset::open(root, name, kReadCacheBytes));
      const h5::Dataset& d = data_.back();
      if (d.type() != dtype_)
        throw bad("dataset /" + name + " holds " + h5::type_name(d.type()) + " but attribute dtype says " + dtype);
      if (d.dims().size() != 1) throw bad("dataset /" + name + " is not 1-D");
      size_[s == Split::Train ? 0 : 1] = d.size();
    }
    if (h5::exists(root, "tokenizer")) {
      const h5::Dataset tok = h5::Dataset::open(root, "tokenizer");
      if (tok.type() != h5::Type::U8 || tok.dims().size() != 1) throw bad("dataset /tokenizer is not a 1-D uint8 array");
      has_tokenizer_ = tok.size() > 0;
    }
  } catch (const h5::Failure& e) {
    if (e.truncated()) throw bad("not a readable linac token dataset: " + e.reason());
    throw bad(std::string("not a readable linac token dataset (truncated or corrupt?): ") + e.what());
  } catch (const Error& e) {
    throw bad(std::string("not a readable linac token dataset (truncated or corrupt?): ") + e.what());
  }
}

void TokenDataset::read(Split s, uint64_t offset, uint64_t count, int32_t* out) const {
  const size_t i = s == Split::Train ? 0 : 1;
  LINAC_CHECK(offset <= size_[i] && count <= size_[i] - offset,
              path_ + ": read of [" + std::to_string(offset) + ", +" + std::to_string(count) + ") past /" +
                  dataset_name(s) + " (" + std::to_string(size_[i]) + " tokens)");
  try {
    data_[i].read(offset, count, out, h5::Type::I32);
  } catch (const Error& e) {
    throw UserError(path_ + ": reading /" + dataset_name(s) + " failed (corrupt file?): " + e.what());
  }
  for (uint64_t k = 0; k < count; ++k)
    if (out[k] < 0 || out[k] >= vocab_size_)
      throw UserError(path_ + ": corrupt /" + dataset_name(s) + ": token " + std::to_string(out[k]) + " at offset " +
                      std::to_string(offset + k) + " is outside the vocabulary of " + std::to_string(vocab_size_));
}

std::string TokenDataset::tokenizer_bytes() const {
  if (!has_tokenizer_) return {};
  try {
    const h5::Dataset tok = h5::Dataset::open(file_.id(), "tokenizer");
    std::string bytes(tok.size(), '\0');
    tok.read_all(bytes.data(), h5::Type::U8);
    return bytes;
  } catch (const Error& e) {
    throw UserError(path_ + ": reading /tokenizer failed (corrupt file?): " + e.what());
  }
}

Tokenizer TokenDataset::tokenizer() const {
  if (!has_tokenizer_)
    throw UserError(path_ + " has no tokenizer: it was prepared from token ids (linac prepare --token-ids)");
  Tokenizer t = Tokenizer::from_bytes(tokenizer_bytes(), path_ + ":/tokenizer");
  if (t.vocab_size() != vocab_size_)
    throw UserError(path_ + ": the embedded tokenizer has " + std::to_string(t.vocab_size()) +
                    " pieces but vocab_size says " + std::to_string(vocab_size_));
  return t;
}

void check_dataset_vocab(const TokenDataset& ds, int64_t model_vocab) {
  if (ds.vocab_size() == model_vocab) return;
  throw UserError("dataset " + ds.path() + " has vocab_size " + std::to_string(ds.vocab_size()) +
                  " but model.vocab_size is " + std::to_string(model_vocab) + "; set model.vocab_size to " +
                  std::to_string(ds.vocab_size()) + " or prepare the data with --vocab-size " +
                  std::to_string(model_vocab));
}

}  // namespace linac
