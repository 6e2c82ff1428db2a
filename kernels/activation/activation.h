// Elementwise SiLU (Swish, beta = 1), the feature map of TransNormerLLM's q and k
// (docs/transnormer.md §1.2: Q = SiLU(Qr), K = SiLU(Kr)):
//   y  = silu(x) = x * sigmoid(x)
//   dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))
// The CPU evaluates sigmoid from exp(-|x|) (sigmoid.h), which never overflows; the GPU from the
// hardware's approximate exp2 and reciprocal (sigmoid.cuh, relative error ~1e-7).
//
// Layout: x, y, dy, dx [N, C] with unit column stride and any row stride (each may be a column
// range of a fused [N, P] projection); y and dx are written (overwrite), other columns of their
// buffers are left alone. GPU: every tensor bf16, or every tensor f32; math in f32. CPU: one
// dtype (f32 or f64).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

// Row strides (in elements) of the [N, C] operands.
struct SiluLayout {
  int64_t N = 0, C = 0;
  int64_t x = 0, y = 0, dy = 0, dx = 0;
};

template <class T>
void silu_fwd_cpu(const SiluLayout& L, const T* x, T* y);
template <class T>
void silu_bwd_cpu(const SiluLayout& L, const T* x, const T* dy, T* dx);
// silu_bwd_cpu in place over B sequences of `rows` rows of C elements: g <- g * silu'(pre), each with
// its own batch and token strides (the [B, T, H, D] views of ops whose features are SiLU(pre)).
template <class T>
void silu_grad_inplace_cpu(int64_t B, int64_t rows, int64_t C, const T* pre, int64_t pre_b, int64_t pre_t, T* g,
                           int64_t g_b, int64_t g_t);

void silu_fwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& y);
void silu_bwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& dy, const Tensor& dx);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void silu_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y);
void silu_bwd(const Ctx& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

}  // namespace linac
