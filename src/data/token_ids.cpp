#include "data/token_ids.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace linac {
namespace fs = std::filesystem;
namespace {

constexpr size_t kChunkIds = 1 << 20;  // ids per read

std::ifstream open_ids(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("--token-ids: cannot read " + path + ": " + std::strerror(errno));
  return in;
}

// Reads n ids (ids [first, first + n) of `path`) into out as int32, checking each against the
// vocabulary. The bytes are decoded explicitly, so the files mean the same on any host.
void read_ids(std::ifstream& in, const std::string& path, uint64_t first, size_t n, int64_t vocab_size,
              std::vector<unsigned char>& raw, std::vector<int32_t>& out) {
  raw.resize(4 * n);
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
    throw UserError("--token-ids: " + path + ": read failed at id " + std::to_string(first) +
                    " (the file changed or is unreadable)");
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* b = &raw[4 * i];
    const uint32_t id = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    if (id >= static_cast<uint64_t>(vocab_size))
      throw UserError("--token-ids: " + path + ": id " + std::to_string(id) + " at index " + std::to_string(first + i) +
                      " is not below --vocab-size " + std::to_string(vocab_size));
    out[i] = static_cast<int32_t>(id);
  }
}

}  // namespace

TokenIdReader::TokenIdReader(std::vector<std::string> paths, int64_t vocab_size, int64_t eos_id)
    : paths_(std::move(paths)), vocab_size_(vocab_size), eos_(static_cast<int32_t>(eos_id)) {
  if (paths_.empty()) throw UserError("--token-ids: no files given");
  for (const std::string& p : paths_) {
    std::error_code ec;
    if (!fs::exists(p, ec)) throw UserError("--token-ids: file not found: " + p);
    if (!fs::is_regular_file(p, ec)) throw UserError("--token-ids: " + p + " is not a regular file (give the .bin files)");
    const uintmax_t bytes = fs::file_size(p, ec);
    if (ec) throw UserError("--token-ids: cannot read " + p + ": " + ec.message());
    if (bytes % 4 != 0)
      throw UserError("--token-ids: " + p + ": size " + std::to_string(bytes) +
                      " bytes is not a multiple of 4 (expected little-endian uint32 ids)");
    std::ifstream in = open_ids(p);
    for (uint64_t first = 0, n = bytes / 4; first < n; first += kChunkIds)
      read_ids(in, p, first, static_cast<size_t>(std::min<uint64_t>(kChunkIds, n - first)), vocab_size_, raw_, buf_);
    total_ids_ += bytes / 4;
  }
  buf_.clear();
  if (total_ids_ == 0)
    throw UserError("--token-ids: no token ids in the inputs (" + std::to_string(paths_.size()) + " files, all empty)");
}

void TokenIdReader::open_next() {
  const std::string& p = paths_[file_++];
  in_ = open_ids(p);
  std::error_code ec;
  left_in_file_ = fs::file_size(p, ec) / 4;
  if (ec) throw UserError("--token-ids: cannot read " + p + ": " + ec.message());
  index_in_file_ = 0;
}

void TokenIdReader::read_chunk() {
  const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkIds, left_in_file_));
  read_ids(in_, paths_[file_ - 1], index_in_file_, n, vocab_size_, raw_, buf_);
  index_in_file_ += n;
  left_in_file_ -= n;
  pos_ = 0;
}

bool TokenIdReader::next(std::vector<int32_t>& doc) {
  doc.clear();
  while (true) {
    if (pos_ == buf_.size()) {
      if (left_in_file_ == 0) {  // the file is done, and so is any document it left open
        if (!doc.empty()) {
          ++eos_added_;
          return true;
        }
        if (file_ == paths_.size()) return false;
        open_next();
        continue;
      }
      read_chunk();
    }
    const auto from = buf_.begin() + static_cast<std::ptrdiff_t>(pos_);
    const auto eos = std::find(from, buf_.end(), eos_);
    doc.insert(doc.end(), from, eos);
    pos_ = static_cast<size_t>(eos - buf_.begin());
    ids_read_ += static_cast<uint64_t>(eos - from);
    if (eos != buf_.end()) {
      ++pos_;
      ++ids_read_;
      return true;
    }
  }
}

}  // namespace linac
