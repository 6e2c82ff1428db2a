// Writes `value` into the rows of tokens that start a document (core/doc_bounds.h):
//   x[b, t, :] = value   for t > 0 with docs.start[b*T + t] == t
// Row 0 of a window is left alone: nothing precedes it in the window. A recurrence whose decay
// is a gate exp(g) forgets everything before a document start when g there is very negative
// (kernels/gla: g = -kGlaDocReset), and the backward zeroes dg in the same rows, since g there is
// a constant.
// Layout: x [B, T, C] contiguous; docs on x's device. Dtypes: CPU f32 or f64, GPU f32 or bf16.
#pragma once

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class T>
void doc_start_fill_cpu(T* x, const int32_t* doc_start, int64_t B, int64_t T_len, int64_t C, double value);
void doc_start_fill_cuda(const Ctx& ctx, const Tensor& x, const int32_t* doc_start, double value);

// Entry point: checks x, dispatches on ctx.device and the dtype. A no-op without docs.
void doc_start_fill(const Ctx& ctx, const Tensor& x, const DocBounds& docs, double value);

}  // namespace linac
