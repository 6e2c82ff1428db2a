// LRPE-d, the learnable relative positional encoding of TransNormerLLM's first layer
// (docs/transnormer.md §1.3), in its real-valued form. Per head h and channel j, at the position
// p = pos0 + t of token t, or p = pos0 + t - start[b, t] with document bounds (core/doc_bounds.h:
// positions restart at 0 at every document, as kernels/rope's do), with angle a = theta[h,j] * p:
//   y[b,t,h,j]     = x[b,t,h,j] * cos(a)          (j < D: the first half of the 2D outputs)
//   y[b,t,h,D + j] = x[b,t,h,j] * sin(a)
// so that q'_t . k'_u = sum_j q_t[j] k_u[j] cos(theta_j (t - u)) (within a document the restart
// changes only the rounding of the angles). Backward:
//   dx[b,t,h,j]  = dy[b,t,h,j] cos(a) + dy[b,t,h,D + j] sin(a)
//   dtheta[h,j] += sum_{b,t} p x[b,t,h,j] (-sin(a) dy[b,t,h,j] + cos(a) dy[b,t,h,D + j])
// The (b, t) rows are split into at most kLrpeMaxSlabs slabs of consecutive rows; the dtheta sum
// runs in a fixed order: a partial sum per slab (in ctx.workspace on the GPU), then a sum over
// the slabs in order.
//
// Precision: the angle is T(p) * theta rounded once in the compute type (f32 on the GPU, as
// kernels/rope does; positions are exact in f32 below 2^24) and the GPU uses sincosf (accurate
// over the full range), so the GPU and the CPU f32 reference agree; in f32 the angle itself
// carries a relative error of about 2^-24 (~2.4e-4 rad at p = 4096 for theta = 1).
//
// Layout: x, dx [B, T, H, D]; y, dy [B, T, H, 2D]; the last two dims contiguous (head stride D
// resp. 2D, unit channel stride), batch and token strides free (q and k are column ranges of a
// fused projection). theta, dtheta [H, D] contiguous. y and dx are written (overwrite); dtheta
// is ACCUMULATED (+=).
// Dtypes: GPU: x, y, dy, dx all bf16 or all f32; theta (the f32 master copy) and dtheta f32; math
// in f32. The backward needs lrpe_bwd_workspace_bytes() of ctx.workspace. CPU: every tensor one
// dtype (f32 or f64).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

constexpr int64_t kLrpeMaxSlabs = 256;

struct LrpeLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, D = 0, pos0 = 0;
  const int32_t* doc_start = nullptr;  // docs.start ([B, T] int32, on x's device) or null
  const int32_t* row_pos = nullptr;    // lrpe_fwd_at's positions ([B] int32, on x's device) or null
  Strides x, y, dy, dx;
};

// Slabs of (b, t) rows, and rows per slab (the last may be shorter).
inline int64_t lrpe_slabs(int64_t rows) { return std::min(rows, kLrpeMaxSlabs); }
inline int64_t lrpe_rows_per_slab(int64_t rows) {
  const int64_t slabs = lrpe_slabs(rows);
  return slabs > 0 ? (rows + slabs - 1) / slabs : 0;
}

template <class T>
void lrpe_fwd_cpu(const LrpeLayout& L, const T* x, const T* theta, T* y);
template <class T>
void lrpe_bwd_cpu(const LrpeLayout& L, const T* x, const T* theta, const T* dy, T* dx, T* dtheta);

void lrpe_fwd_cuda(const Ctx& ctx, const LrpeLayout& L, const Tensor& x, const Tensor& theta, const Tensor& y);
void lrpe_bwd_cuda(const Ctx& ctx, const LrpeLayout& L, const Tensor& x, const Tensor& theta, const Tensor& dy,
                   const Tensor& dx, const Tensor& dtheta);

// Entry points: check shapes, dispatch on ctx.device and dtypes. docs: x's rows are [B, T] packed
// documents, positions restart at each one.
void lrpe_fwd(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& y, int64_t pos0,
              const DocBounds& docs = {});
void lrpe_bwd(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& dy, const Tensor& dx,
              const Tensor& dtheta, int64_t pos0, const DocBounds& docs = {});
// The forward with each row at its own position, read on the device (decoding: a CUDA graph replays
// the same launch at every step): token t of row b at positions[b] + t, positions [B] int32 on x's
// device, each below 2^24 - T.
void lrpe_fwd_at(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& y, const Tensor& positions);
// GPU scratch for lrpe_bwd: the dtheta partial sums.
size_t lrpe_bwd_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D);

}  // namespace linac
