// Gated linear unit of the channel mixer, applied to the fused up-projection h = x W_in whose
// first half is the gate g and second half the value u:
//   a = act(g) * u
// with act = SiLU (SwiGLU, Shazeer 2020, as in LLaMA; the default) or the identity (SGLU,
// "simple GLU" of TransNormerLLM, docs/transnormer.md §1.6: a = g * u).
// Backward:
//   SiLU:      dg = da * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),   du = da * silu(g)
//   Identity:  dg = da * u,                                             du = da * g
// silu(x) = x * sigmoid(x); sigmoid is evaluated from exp(-|x|), which never overflows
// (activation/sigmoid.h; on the GPU with the approximate exp2 and division, swiglu_math.cuh).
// swiglu_linear.h has the GEMMs next to the gate, fused on Hopper.
//
// Layout: h, dh [N, 2F] contiguous (columns [0, F) = g, [F, 2F) = u); a, da [N, F] contiguous.
// dh is written (overwrite). GPU: h and a are f32 or bf16 independently; da and dh share one
// dtype (f32 or bf16), independent of h; math in f32. CPU: one dtype (f32 or f64).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

enum class GluAct { Silu, Identity };  // act applied to the gate

template <class T>
void swiglu_fwd_cpu(const T* h, T* a, int64_t n, int64_t f, GluAct act);
template <class T>
void swiglu_bwd_cpu(const T* h, const T* da, T* dh, int64_t n, int64_t f, GluAct act);

template <class T>
void swiglu_value_dots_cpu(const T* h, const T* dh, float* dots, int64_t n, int64_t f);

void swiglu_fwd_cuda(const Ctx& ctx, const Tensor& h, const Tensor& a, GluAct act);
void swiglu_bwd_cuda(const Ctx& ctx, const Tensor& h, const Tensor& da, const Tensor& dh, GluAct act);
void swiglu_value_dots_cuda(const Ctx& ctx, const Tensor& h, const Tensor& dh, const Tensor& dots);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void swiglu_fwd(const Ctx& ctx, const Tensor& h, const Tensor& a, GluAct act = GluAct::Silu);
void swiglu_bwd(const Ctx& ctx, const Tensor& h, const Tensor& da, const Tensor& dh, GluAct act = GluAct::Silu);

// The value half's products with its gradient, summed over units of 8 columns:
//   dots[r, j] = sum_{c = 8j}^{8j+7} du[r, c] u[r, c],   u = h[:, F:], du = dh[:, F:] as stored
// in f32, one fused multiply-add per column in column order from 0, so every path gives the same
// bits. dots [N, F / 8] f32 contiguous; F a multiple of 8. Where u is an attention's output o and du
// its gradient dout (the Transformer-VQ GAU's gate), the attention backward's delta_t = dout_t . o_t
// is a sum of F / 8 of these (VqAttnOpts::delta_units), read in place of dout and o;
// swiglu_linear_bwd's fused kernel writes them as it writes du.
void swiglu_value_dots(const Ctx& ctx, const Tensor& h, const Tensor& dh, const Tensor& dots);

}  // namespace linac
