// Tensor: a non-owning view {ptr, dtype, device, shape, strides}. Strides are in elements and
// contiguous (row-major) unless a view says otherwise; kernels require contiguous inputs and
// check it. Memory is owned by Buffer (buffer.h).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace linac {

constexpr int kMaxDims = 6;

struct Tensor {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};

  Tensor() = default;
  Tensor(void* p, DType dt, Device dev, const std::vector<int64_t>& dims);

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t size(int d) const { return shape[static_cast<size_t>(d < 0 ? d + ndim : d)]; }
  bool is_contiguous() const;
  bool defined() const { return ptr != nullptr; }
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_str() const;

  template <class T>
  T* data() const {
    return static_cast<T*>(ptr);
  }

  // Same memory, new contiguous shape with the same number of elements.
  Tensor view(const std::vector<int64_t>& dims) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice0(int64_t begin, int64_t end) const;
  // Elements [start, start+len) of dimension d; keeps strides (the result may be non-contiguous).
  Tensor narrow(int d, int64_t start, int64_t len) const;
  // Index `idx` of dimension d, which is removed; keeps the other strides.
  Tensor select(int d, int64_t idx) const;
};

bool same_shape(const Tensor& a, const Tensor& b);

// Contiguous matrices [r_i, c] that lie back to back in memory (same dtype, device and c) as one
// [sum r_i, c] matrix, e.g. parameters registered one after another, so a fused projection runs
// one GEMM; undefined when they do not.
Tensor adjacent_rows(std::initializer_list<Tensor> parts);

// An op's buffer of intermediates its forward keeps for its backward (GLA, Lightning): undefined,
// or on `like`'s device, which is a GPU, contiguous, 256-byte aligned and at least `need` bytes.
// `op` names the op in the error.
void check_saved_buffer(const Tensor& saved, const Tensor& like, size_t need, const char* op);

// t's data, or null for an undefined tensor (an optional input or output of a kernel).
template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace linac

// Shape/dtype/device agreement between kernel arguments (a caller bug if violated).
#define LINAC_CHECK_SHAPE(a, b) \
  LINAC_CHECK(::linac::same_shape(a, b), "shape mismatch " + (a).shape_str() + " vs " + (b).shape_str())
