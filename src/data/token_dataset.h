// Token dataset: the HDF5 file `linac prepare` writes and training/eval read.
//
// Schema, format_version 1 (all attributes on the root group):
//   /train, /val     1-D uint16 (when every id fits: vocab_size <= 65536) or uint32, chunked;
//                    each document's tokens followed by eos_id; no BOS inside text datasets
//                    (token-id input keeps the ids as given, a tokenizer's BOS included)
//   /tokenizer       1-D uint8: the SentencePiece model bytes (the file is self-contained);
//                    absent (or empty) when prepared from token ids (--token-ids): no linac
//                    tokenizer then, so nothing decodes the ids to text
//   vocab_size, eos_id, bos_id, pad_id, unk_id     int64 (bos/pad/unk may be -1: none)
//   dtype            string, "uint16" | "uint32" (the element type of /train and /val)
//   source           string, JSON array of the input paths given to prepare
//   n_documents_train, n_documents_val, format_version     int64
//   val_fraction     float64
//
// The reader opens read-only, validates the whole schema up front and reads token ranges
// with hyperslab selections, so memory use does not depend on the file size. Every problem
// with the file (missing, not HDF5, truncated, corrupt, wrong schema, ids outside the
// vocabulary) is a UserError naming the file and what is wrong. Not thread-safe (HDF5).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/hdf5_util.h"
#include "data/tokenizer.h"

namespace linac {

enum class Split { Train, Val };
const char* split_name(Split s);                  // "train" | "val"
Split parse_split(const std::string& name);       // UserError for anything else

constexpr int64_t kTokenFormatVersion = 1;
constexpr uint64_t kTokenChunk = 1 << 16;         // elements per HDF5 chunk of /train and /val

// The narrowest element type that holds every id of the vocabulary.
h5::Type token_type_for_vocab(int64_t vocab_size);

struct TokenFileMeta {
  int64_t vocab_size = 0;
  int64_t eos_id = kEosId, bos_id = kBosId, pad_id = kPadId, unk_id = kUnkId;
  std::string source = "[]";
  std::string tokenizer;   // SentencePiece model bytes; empty: no /tokenizer (token-id input)
  double val_fraction = 0;
};

// Streams tokens into a new file. The file is complete (schema attributes written) only after
// finish(); the caller decides its name (prepare writes to a temporary name and renames).
class TokenDatasetWriter {
 public:
  TokenDatasetWriter(const std::string& path, const TokenFileMeta& meta);

  // Raw tokens; ids must lie in [0, vocab_size).
  void append(Split s, const int32_t* ids, size_t n);
  // One document: its tokens, then eos_id.
  void add_document(Split s, const int32_t* ids, size_t n);
  uint64_t tokens(Split s) const { return tokens_[idx(s)]; }
  uint64_t documents(Split s) const { return docs_[idx(s)]; }
  void finish();

 private:
  static size_t idx(Split s) { return s == Split::Train ? 0 : 1; }
  void flush(Split s);
  TokenFileMeta meta_;
  h5::File file_;
  std::vector<h5::Dataset> data_;
  std::array<std::vector<int32_t>, 2> buf_;
  std::array<uint64_t, 2> tokens_{}, docs_{};
};

class TokenDataset {
 public:
  explicit TokenDataset(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t bos_id() const { return bos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  h5::Type dtype() const { return dtype_; }
  const std::string& source() const { return source_; }
  int64_t documents(Split s) const { return s == Split::Train ? n_docs_[0] : n_docs_[1]; }
  uint64_t size(Split s) const { return s == Split::Train ? size_[0] : size_[1]; }

  // Tokens [offset, offset + count) of a split as int32. Reading past the end is a caller bug
  // (linac::Error); a failed read or an id outside the vocabulary is a UserError.
  void read(Split s, uint64_t offset, uint64_t count, int32_t* out) const;
  // The embedded SentencePiece model; a dataset prepared from token ids has none.
  bool has_tokenizer() const { return has_tokenizer_; }
  std::string tokenizer_bytes() const;  // empty without a tokenizer
  Tokenizer tokenizer() const;          // UserError without a tokenizer

 private:
  std::string path_;
  h5::File file_;
  std::vector<h5::Dataset> data_;
  int64_t vocab_size_ = 0, eos_id_ = 0, bos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  h5::Type dtype_ = h5::Type::U16;
  std::string source_;
  int64_t n_docs_[2] = {0, 0};
  uint64_t size_[2] = {0, 0};
  bool has_tokenizer_ = false;
};

// UserError naming both numbers unless the dataset's vocabulary equals the model's.
void check_dataset_vocab(const TokenDataset& ds, int64_t model_vocab);

}  // namespace linac
