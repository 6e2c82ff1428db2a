#include "core/tensor.h"

#include "core/dims_text.h"

namespace linac {

Tensor::Tensor(void* p, DType dt, Device dev, const std::vector<int64_t>& dims)
    : ptr(p), dtype(dt), device(dev), ndim(static_cast<int>(dims.size())) {
  LINAC_CHECK(ndim <= kMaxDims, "too many dimensions");
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    shape[i] = dims[i];
    strides[i] = s;
    s *= dims[i];
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

std::string Tensor::shape_str() const { return dims_text(shape.data(), static_cast<size_t>(ndim)); }

Tensor Tensor::view(const std::vector<int64_t>& dims) const {
  LINAC_CHECK(is_contiguous(), "view of a non-contiguous tensor");
  Tensor t(ptr, dtype, device, dims);
  LINAC_CHECK(t.numel() == numel(), "view " + t.shape_str() + " of " + shape_str());
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  LINAC_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0], "slice0 out of range");
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.ptr = static_cast<char*>(ptr) + static_cast<size_t>(begin * strides[0]) * dtype_size(dtype);
  return t;
}

Tensor Tensor::narrow(int d, int64_t start, int64_t len) const {
  LINAC_CHECK(0 <= d && d < ndim && 0 <= start && start + len <= shape[d], "narrow out of range");
  Tensor t = *this;
  t.shape[d] = len;
  t.ptr = static_cast<char*>(ptr) + static_cast<size_t>(start * strides[d]) * dtype_size(dtype);
  return t;
}

Tensor Tensor::select(int d, int64_t idx) const {
  Tensor t = narrow(d, idx, 1);
  for (int i = d; i + 1 < ndim; ++i) {
    t.shape[i] = t.shape[i + 1];
    t.strides[i] = t.strides[i + 1];
  }
  t.ndim = ndim - 1;
  return t;
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

void check_saved_buffer(const Tensor& saved, const Tensor& like, size_t need, const char* op) {
  if (!saved.defined()) return;
  const std::string name(op);
  LINAC_CHECK(saved.device == like.device && like.device != Device::CPU,
              name + ": saved intermediates are for the GPU only");
  LINAC_CHECK(saved.is_contiguous() && reinterpret_cast<uintptr_t>(saved.ptr) % 256 == 0,
              name + ": saved must be contiguous and 256-byte aligned");
  LINAC_CHECK(saved.nbytes() >= need, name + ": saved holds " + std::to_string(saved.nbytes()) + " bytes, needs " +
                                          std::to_string(need));
}

Tensor adjacent_rows(std::initializer_list<Tensor> parts) {
  const Tensor& first = *parts.begin();
  if (first.ndim != 2) return Tensor();
  int64_t rows = 0;
  const char* next = static_cast<const char*>(first.ptr);
  for (const Tensor& p : parts) {
    if (p.ndim != 2 || !p.is_contiguous() || p.dtype != first.dtype || p.device != first.device ||
        p.size(1) != first.size(1) || p.ptr != next)
      return Tensor();
    rows += p.size(0);
    next += p.nbytes();
  }
  return Tensor(first.ptr, first.dtype, first.device, {rows, first.size(1)});
}

}  // namespace linac
