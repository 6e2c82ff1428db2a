// The channel mixer's two GEMMs next to its gate, with the gate applied inside them where the GPU
// allows (swiglu.h has the gate's math and the layout of h = [g | u]):
//   forward:   h = x W_in^T,    a = act(g) * u          x [N, d], W_in [2F, d], h [N, 2F], a [N, F]
//   backward:  da = dy W_out,   dh = swiglu_bwd(h, da)  dy [N, d], W_out [d, F], dh [N, 2F]
// All contiguous, row-major.
//
// "fused_sm90" (a Hopper GPU in a build for sm_90; every tensor bf16; d and F multiples of 8, rows
// 16-byte aligned): one kernel per direction, a TMA + wgmma GEMM whose epilogue applies the gate
// to the accumulators rounded to bf16, so a (dh) is bit for bit what swiglu_fwd (swiglu_bwd) gives
// for the h (da) the kernel computed; the forward saves swiglu_fwd's read of h, the backward never
// writes da. No split-K: each output element's K terms are summed in one fixed order, so reruns
// are bit-identical. "composite" (everywhere else, and for at most matmul.h's kSkinnyMaxRows rows
// of x: decoding, where matmul's skinny kernel streams W faster): matmul, then swiglu_fwd /
// swiglu_bwd, with da in `da` (which the fused backward does not touch and may be an empty
// tensor). `dots`: empty, or swiglu_value_dots' [N, F / 8] f32 table of the du written, from the
// fused kernel's epilogue (the same bits as swiglu_value_dots of its dh) or by that op after the
// composite path.
// LINAC_SWIGLU_KERNELS=sm80 keeps Hopper GPUs on the composite path (comparisons and tests); unset
// or "auto" picks; anything else is an error.
// The fused kernels run in clusters of 2 CTAs that take the same weight columns for adjacent row
// blocks: each CTA loads half of every weight stage and multicasts it to both, so the weight's
// L2 -> SM traffic halves (the forward was L2-bound at 88% of its throughput). LINAC_SWIGLU_CLUSTER=1
// runs one CTA per cluster (comparisons, tests); unset or 2 is the default; anything else is an error.
#pragma once

#include "core/gpu.h"
#include "core/tensor.h"
#include "swiglu/swiglu.h"

namespace linac {

// Which path a GPU call with these operands takes ("fused_sm90" or "composite"): x, w, y = the
// forward's x, W_in, a or the backward's dy, W_out, dh.
const char* swiglu_linear_gpu_kernel(const Tensor& x, const Tensor& w, const Tensor& h, const Tensor& y);

// Whether swiglu_linear_bwd with these operands writes da (the composite path): callers need a
// buffer for da only then.
bool swiglu_linear_bwd_writes_da(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h,
                                 const Tensor& dh);

// CTAs per cluster of the fused kernels (1 or 2, from LINAC_SWIGLU_CLUSTER).
int swiglu_linear_cluster();

#if LINAC_WITH_SM90A
void silu_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a,
                          int64_t c0);
void swiglu_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w_in, const Tensor& h, const Tensor& a,
                            GluAct act);
void swiglu_linear_bwd_sm90(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h, const Tensor& dh,
                            GluAct act, float* dots);
#endif

// Entry points: check shapes, dispatch on ctx.device and the path above.
void swiglu_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w_in, const Tensor& h, const Tensor& a,
                       GluAct act = GluAct::Silu);
void swiglu_linear_bwd(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h, const Tensor& da,
                       const Tensor& dh, GluAct act = GluAct::Silu, const Tensor& dots = Tensor());

// A projection whose output columns from c0 on go through SiLU (the Transformer-VQ GAU's input
// projection [Qr | Kr | V'] and V = SiLU(V'), docs/transformer_vq.md §4.6):
//   y = x W^T,   a = silu(y[:, c0:])
// x [N, d], W [M, d], y [N, M], a [N, M - c0]; all contiguous; c0 in [0, M). On the same two paths:
// "fused_sm90" (c0 a multiple of 8; silu_linear_fwd_sm90.cu: one kernel whose epilogue stores y and
// a, a bit for bit silu_fwd of that y) and "composite" (matmul, then silu_fwd).
void silu_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a, int64_t c0);

}  // namespace linac
