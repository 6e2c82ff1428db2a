#include "model/saved_arena.h"

#include <algorithm>

#include "core/error.h"

namespace linac {

namespace {
// Every take starts on a 256-byte boundary (vector loads, cuBLASLt's preferred alignment).
constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "mixer") return Recompute::Mixer;
  if (s == "block") return Recompute::Block;
  throw UserError("train.recompute: expected none, mixer or block, got '" + s + "'");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Mixer: return "mixer";
    case Recompute::Block: return "block";
  }
  return "?";
}

Tensor SavedBuf::tensor(DType dt, const std::vector<int64_t>& dims, size_t byte_offset) const {
  LINAC_CHECK(arena_ && arena_->mem_.bytes() > 0, "SavedBuf used before its arena was allocated");
  const size_t base = (shared_ ? arena_->private_bytes_ : 0) + offset_;
  Tensor t(static_cast<char*>(arena_->mem_.data()) + base + byte_offset, dt, arena_->device_, dims);
  LINAC_CHECK(byte_offset + t.nbytes() <= bytes_, "tensor " + t.shape_str() + " exceeds its saved buffer");
  return t;
}

void SavedArena::clear() {
  mem_ = Buffer();
  in_shared_ = false;
  private_bytes_ = shared_bytes_ = shared_cursor_ = 0;
}

void SavedArena::begin_group(bool shared) {
  LINAC_CHECK(mem_.bytes() == 0, "SavedArena::begin_group after allocate");
  in_shared_ = shared;
  shared_cursor_ = 0;
}

SavedBuf SavedArena::take(size_t bytes) {
  LINAC_CHECK(mem_.bytes() == 0, "SavedArena::take after allocate");
  SavedBuf b;
  b.arena_ = this;
  b.shared_ = in_shared_;
  b.bytes_ = bytes;
  size_t& cursor = in_shared_ ? shared_cursor_ : private_bytes_;
  b.offset_ = cursor;
  cursor += round_up(bytes);
  if (in_shared_) shared_bytes_ = std::max(shared_bytes_, shared_cursor_);
  return b;
}

void SavedArena::allocate() { mem_ = Buffer(std::max<size_t>(bytes(), kAlign), device_); }

}  // namespace linac
