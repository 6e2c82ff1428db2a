#include "model/env.h"

namespace linac {

Tensor ScratchPool::get(const std::string& key, DType dt, const std::vector<int64_t>& dims) {
  Tensor probe(nullptr, dt, device_, dims);
  Buffer& b = bufs_[key];
  if (b.bytes() < probe.nbytes()) {
    b = Buffer(probe.nbytes(), device_);
    ++allocations_;
  }
  return b.tensor(dt, dims);
}

size_t ScratchPool::bytes() const {
  size_t n = 0;
  for (const auto& [k, b] : bufs_) n += b.bytes();
  return n;
}

}  // namespace linac
