// The attention input projection with the rotary embedding of q and k applied as it is computed:
//   y = x W^T,  then columns [r0, r0 + n_rot) of y rotated as rope_fwd rotates them (rope.h): per head of
//   head_dim columns, the token of row r at position r % T (rows are sequences of T tokens; pos0 = 0),
//   or r % T - docs.start[r] with document bounds (core/doc_bounds.h; docs.start [N] on y's device)
// x [N, K], W [M, K], y [N, M], contiguous, row-major; r0 and n_rot multiples of head_dim,
// r0 + n_rot at most M (r0 = rot_begin: q and k after v, as the Latte mixer lays them out).
//
// "fused_sm90" (a Hopper GPU in a build for sm_90; x, W, y bf16; head_dim 64, 96 or 128; K and M
// multiples of 8, rows 16-byte aligned): one TMA + wgmma GEMM whose epilogue rotates the products
// after rounding them to bf16, with the rotation and the (cos, sin) table of rope_fwd, so y is bit
// for bit what matmul then rope_fwd give; it saves rope_fwd's pass over q and k. No split-K: each
// output's K terms are summed in one fixed order, so reruns are bit-identical. "composite"
// (everywhere else): matmul, then rope_fwd. LINAC_ROPE_LINEAR_KERNELS=sm80 keeps Hopper GPUs on the
// composite path (comparisons, tests); unset or "auto" picks; anything else is an error. With
// n_rot = 0 the call is a plain matmul.
#pragma once

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"
#include "rope/rope.h"

namespace linac {

// Which path a GPU call with these operands takes ("fused_sm90" or "composite").
const char* rope_linear_gpu_kernel(const Tensor& x, const Tensor& w, const Tensor& y, int64_t head_dim);

#if LINAC_WITH_SM90A
// cos_sin: rope_table_cuda's [T, head_dim / 2] table of (cos, sin) pairs, in device memory.
// doc_start: null, or docs.start; the table row of output row r is then r % T - doc_start[r].
void rope_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, int64_t T, int64_t r0,
                          int64_t n_rot, int64_t head_dim, const float* cos_sin, const int32_t* doc_start = nullptr);
#endif

// Entry point: checks shapes, dispatches on ctx.device and the path above.
void rope_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, int64_t T, int64_t n_rot,
                     int64_t head_dim, const RopeFreqs& freqs, const DocBounds& docs = {}, int64_t rot_begin = 0);

}  // namespace linac
