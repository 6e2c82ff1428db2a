// Token-id input for `linac prepare --token-ids`: text already tokenised by a model's own
// tokenizer (Hugging Face tokenizer.json models, scripts/hf_tokenize.py), so linac needs none.
//
// Format of one file: raw little-endian uint32 ids, no header; each document's ids are followed
// by the end-of-document id (--eos-id). Files are read in the order given and a document never
// spans two files: a file whose last id is not the EOS id ends with a document that gets one.
// Everything else is kept as given (a BOS the tokenizer put at a document's start, empty
// documents from two EOS ids in a row).
//
// The constructor checks every file before anything is written: it exists and is a regular file,
// its size is a multiple of 4, every id is below the vocabulary size, and not all files are
// empty; each problem is a UserError naming the file (and the id's index). Reading then streams
// one document at a time.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace linac {

class TokenIdReader {
 public:
  TokenIdReader(std::vector<std::string> paths, int64_t vocab_size, int64_t eos_id);

  // The next document's ids, without its EOS, into `doc`; false after the last one.
  bool next(std::vector<int32_t>& doc);

  uint64_t total_ids() const { return total_ids_; }   // ids in all files
  uint64_t ids_read() const { return ids_read_; }
  uint64_t eos_added() const { return eos_added_; }   // files whose last document had no EOS

 private:
  void open_next();
  void read_chunk();  // the current file's next ids into buf_

  std::vector<std::string> paths_;
  int64_t vocab_size_;
  int32_t eos_;
  size_t file_ = 0;  // files opened so far
  std::ifstream in_;
  uint64_t index_in_file_ = 0, left_in_file_ = 0;
  std::vector<unsigned char> raw_;
  std::vector<int32_t> buf_;
  size_t pos_ = 0;
  uint64_t total_ids_ = 0, ids_read_ = 0, eos_added_ = 0;
};

}  // namespace linac
