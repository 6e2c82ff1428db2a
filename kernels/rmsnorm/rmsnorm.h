// RMSNorm over the last dimension (Zhang & Sennrich 2019), as in LLaMA:
//   y[r,:] = x[r,:] * rstd[r] * w,   rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
// Backward (g = dy * w):
//   dx[r,:] += rstd * g - x * rstd^3 * mean_j(g[r,j] * x[r,j])
//   dw      += sum_r dy[r,:] * x[r,:] * rstd[r]
//
// Layout: x, y, dy, dx are [rows, dim] contiguous; w, dw are [dim]; rstd is [rows].
// dx and dw are ACCUMULATED into (x is a residual stream whose gradient already holds the
// skip path). On the GPU x/dx may be f32 (residual stream) or bf16, y/dy f32 or bf16, and
// w, dw, rstd are f32 (master weight, fp32 gradient). On the CPU every tensor has one dtype.
// Optional, in the same pass over the rows (empty Tensor: none):
//   add, h  the pre-norm block's residual add: the forward normalises h = x + add instead of x
//           and writes h (x's shape and dtype; add has y's shape and dtype). x is the residual
//           stream before a sub-layer, add that sub-layer's output, h the stream after it.
//   dx_copy (dx's shape, dy's dtype): the updated dx rounded to dy's dtype (the gradient the
//           next sub-layer of the backward reads)
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class T>
void rmsnorm_fwd_cpu(const T* x, const T* add, const T* w, T* y, T* rstd, T* h, int64_t rows, int64_t dim, double eps);
template <class T>
void rmsnorm_bwd_cpu(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t dim);

void rmsnorm_fwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps,
                      const Tensor& add, const Tensor& h);
void rmsnorm_bwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx, const Tensor& dw, const Tensor& dx_copy);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void rmsnorm_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, double eps,
                 const Tensor& add = Tensor(), const Tensor& h = Tensor());
void rmsnorm_bwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                 const Tensor& dx, const Tensor& dw, const Tensor& dx_copy = Tensor());

}  // namespace linac
