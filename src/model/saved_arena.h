// SavedArena: the memory holding what forward passes keep for their backward passes (saved
// activations), and the activation recompute that shares it between layers.
//
// Modules take their saved buffers in reserve() (take(bytes) -> SavedBuf); the model allocates the
// arena once every module has taken its share. A SavedBuf resolves its address when a tensor is
// made from it, so takes come before the memory exists.
//
// Takes belong to the group opened last (begin_group). Private groups get bytes of their own, one
// after another. Every shared group starts at offset 0 of one shared region as large as the
// largest of them: they overlap, so at most one of them may hold live data at a time. Activation
// recompute (train.recompute) puts each layer's mixer (`mixer`) or whole block (`block`) in a
// shared group and re-runs that forward right before its backward.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/buffer.h"

namespace linac {

class SavedArena;

class SavedBuf {
 public:
  SavedBuf() = default;
  Tensor tensor(DType dt, const std::vector<int64_t>& dims, size_t byte_offset = 0) const;
  size_t bytes() const { return bytes_; }

 private:
  friend class SavedArena;
  const SavedArena* arena_ = nullptr;
  bool shared_ = false;
  size_t offset_ = 0, bytes_ = 0;  // offset_ within the private part or the shared region
};

// What activation recompute keeps: `none` keeps everything, `mixer` re-runs each token mixer's
// forward in the backward, `block` keeps only each block's input and re-runs the whole block.
enum class Recompute { None, Mixer, Block };
Recompute parse_recompute(const std::string& s);  // "none" | "mixer" | "block"
const char* recompute_name(Recompute r);

class SavedArena {
 public:
  explicit SavedArena(Device device) : device_(device) {}
  SavedArena(const SavedArena&) = delete;
  SavedArena& operator=(const SavedArena&) = delete;

  // Forgets every take and frees the memory (before a new round of reserve()).
  void clear();
  void begin_group(bool shared);
  SavedBuf take(size_t bytes);
  // Allocates private + shared bytes; every SavedBuf taken since clear() becomes usable.
  void allocate();
  size_t bytes() const { return private_bytes_ + shared_bytes_; }

 private:
  friend class SavedBuf;
  Device device_;
  Buffer mem_;
  bool in_shared_ = false;
  size_t private_bytes_ = 0, shared_bytes_ = 0, shared_cursor_ = 0;
};

}  // namespace linac
