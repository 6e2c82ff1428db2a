// Per-head views into a fused projection buffer: a mixer computes [q|k|v|...] = x W^T into one
// [N, P] buffer (one GEMM) and hands its column ranges to kernels as [B, T, H, D] tensors with
// token stride P. Shared by the mixers; the views own nothing.
#pragma once

#include "core/tensor.h"

namespace linac {

// [B, T, H, D] view of columns [c0, c0 + H*D) of a [B*T, P] buffer.
inline Tensor bthd(const Tensor& proj, int64_t B, int64_t T, int64_t c0, int64_t H, int64_t D) {
  const int64_t P = proj.size(1);
  Tensor t(static_cast<char*>(proj.ptr) + c0 * static_cast<int64_t>(dtype_size(proj.dtype)), proj.dtype, proj.device,
           {B, T, H, D});
  t.strides = {T * P, P, D, 1};
  return t;
}

// [B, H, D] view of columns [c0, c0 + H*D) of a [B, P] buffer (one decoding step).
inline Tensor bhd(const Tensor& proj, int64_t c0, int64_t H, int64_t D) {
  const int64_t B = proj.size(0), P = proj.size(1);
  Tensor t(static_cast<char*>(proj.ptr) + c0 * static_cast<int64_t>(dtype_size(proj.dtype)), proj.dtype, proj.device,
           {B, H, D});
  t.strides = {P, D, 1};
  return t;
}

}  // namespace linac
