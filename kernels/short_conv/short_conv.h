// Short gated convolution (BaseConv's core; docs/based.md §4, §7.3, §6.5): a depthwise
// causal convolution of width W (1..8) along the sequence, an activation and a multiplicative gate.
//
// For batch b, token t, channel ch (zero left padding; the input bias is not added to the padding):
//   ã[b,s,ch] = a[b,s,ch] + ba[ch] for s >= 0,   0 for s < 0
//   c[b,t,ch] = sum_{j=0..W-1} h[ch,j] * ã[b, t-W+1+j, ch]        (summed in ascending j)
//   z[b,t,ch] = act(c[b,t,ch]) * (g[b,t,ch] + bg[ch]),            act = SiLU or identity
// Backward (dz given; c is recomputed from a, nothing is saved):
//   dg = act(c) * dz,   dc = dz * (g + bg) * act'(c),   silu'(x) = σ(x) (1 + x (1 - σ(x)))
//   da[b,s] = sum_j h[j] * dc[b, s+W-1-j]  (terms with s+W-1-j >= T vanish; an anti-causal correlation)
//   dh[ch,j] += sum_{b,t} dc[b,t] * ã[b,t-W+1+j],   dba[ch] += sum_{b,s} da[b,s],   dbg[ch] += sum_{b,t} dg[b,t]
// Documents (ShortConvOpts::docs, core/doc_bounds.h): every document is convolved as if it were a
// sequence of its own. Tap j of token t reads s = t-W+1+j only when s >= start[b,t]; earlier taps
// read the zero padding (ã = 0, no bias):
//   c[b,t,ch] = sum_{j: s >= start[b,t]} h[ch,j] * ã[b,s,ch]
// and the backward drops the same terms: da[b,s] sums dc[b,t] over t = s+W-1-j < T with
// start[b,t] <= s (t in the document of s), dh sums only the taps that were read.
// Decode step: the state holds ã of the last W-1 tokens, oldest first; it starts at zero, which is
// exactly the zero left padding, so stepping token by token reproduces the forward bit for bit on
// the CPU (same products, same order). One step computes c from the state and ã_t, then shifts
// the state by one and appends ã_t. A new document starts from a zeroed state (the caller's).
//
// Layout: a, g, z, dz, da, dg [B, T, C] with unit channel stride and free batch/token strides (a and
// g are column ranges of a fused [B*T, P] projection, da/dg of its gradient). h, dh [C, W]
// contiguous; ba, bg, dba, dbg [C]. Each bias is optional (an undefined Tensor: no bias, and then its
// gradient must be undefined too); a bias gradient may also be left undefined to skip it. Step:
// a_t, g_t, z_t [B, C] (unit channel stride, free batch stride), state [B, W-1, C] contiguous. da, dg
// are overwritten; dh, dba, dbg are ACCUMULATED. dg may be left undefined: the gate's gradient is
// then not written (Latte's gate is a constant; dbg, if given, is still summed).
// Dtypes: CPU: every tensor f32 or every tensor f64. GPU: a, g, z, dz, da, dg (a_t, g_t, z_t) all
// bf16 or all f32; h, ba, bg, dh, dba, dbg and the state f32. The GPU backward reduces dh/dba/dbg in
// a fixed order through short_conv_bwd_workspace_bytes() of ctx.workspace (deterministic).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

constexpr int64_t kShortConvMaxWidth = 8;
// The GPU kernels give each CTA a tile of this many tokens of one sequence.
constexpr int64_t kShortConvTileTokens = 128;

struct ShortConvOpts {
  bool silu = true;  // act = SiLU; false: identity
  DocBounds docs;    // defined: no tap reads across a document start (core/doc_bounds.h)
};

// Shapes and the (batch, token) element strides of every [B, T, C] argument.
struct ShortConvLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, C = 0, W = 0;
  bool silu = true;
  const int32_t* doc_start = nullptr;  // [B, T] document starts (docs.start), null: one document per row
  Strides a, g, z, dz, da, dg;
};

// CPU references, F = float or double. Bias pointers may be null (no bias / no bias gradient).
template <class F>
void short_conv_fwd_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg, F* z);
template <class F>
void short_conv_bwd_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg,
                        const F* dz, F* da, F* dg, F* dh, F* dba, F* dbg);
// Step: strides are batch strides of a_t, g_t, z_t (T = 1 in L).
template <class F>
void short_conv_step_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg,
                         F* state, F* z);

void short_conv_fwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& z);
void short_conv_bwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& dz, const Tensor& da, const Tensor& dg,
                         const Tensor& dh, const Tensor& dba, const Tensor& dbg);
void short_conv_step_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                          const Tensor& ba, const Tensor& bg, const Tensor& state, const Tensor& z);

// Entry points: check shapes and strides, dispatch on ctx.device and dtypes.
void short_conv_fwd(const Ctx& ctx, const Tensor& a, const Tensor& g, const Tensor& h, const Tensor& ba,
                    const Tensor& bg, const Tensor& z, const ShortConvOpts& opts);
void short_conv_bwd(const Ctx& ctx, const Tensor& a, const Tensor& g, const Tensor& h, const Tensor& ba,
                    const Tensor& bg, const Tensor& dz, const Tensor& da, const Tensor& dg, const Tensor& dh,
                    const Tensor& dba, const Tensor& dbg, const ShortConvOpts& opts);
void short_conv_step(const Ctx& ctx, const Tensor& a_t, const Tensor& g_t, const Tensor& h, const Tensor& ba,
                     const Tensor& bg, const Tensor& state, const Tensor& z_t, const ShortConvOpts& opts);

// Scratch bytes short_conv_bwd needs from ctx.workspace on the GPU (per-tile partial sums of dh,
// dba, dbg; f32).
size_t short_conv_bwd_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t W);

}  // namespace linac
