// Flat elementwise updates over whole tensors (gradient accumulation, mixed-precision copies,
// loss scaling):
//   add_inplace:   dst[i] += alpha * src[i]
//   cast:          dst[i]  = src[i]            (rounded to nearest-even when narrowing to bf16)
//   scale_inplace: x[i]   *= s
//   increment_i32: x[i]   += 1             (int32: each decoding row's position, advanced on the
//                                           device so a replayed CUDA graph advances it too)
//
// Layout: every tensor contiguous; dst and src have the same number of elements (any shape).
// On the GPU dst and src are f32 or bf16 independently (cast: f32 <-> bf16, or a copy when the
// dtypes agree); arithmetic is in f32. On the CPU add_inplace and scale_inplace take one dtype
// (f32 or f64); cast converts among f32, f64 and bf16 (bf16 through core/buffer.h's host
// conversion, rounded like the GPU's).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class T>
void add_inplace_cpu(T* dst, const T* src, double alpha, int64_t n);
template <class TD, class TS>
void cast_cpu(TD* dst, const TS* src, int64_t n);
template <class T>
void scale_inplace_cpu(T* x, double s, int64_t n);
void increment_i32_cpu(int32_t* x, int64_t n);

void add_inplace_cuda(const Ctx& ctx, const Tensor& dst, const Tensor& src, float alpha);
void cast_cuda(const Ctx& ctx, const Tensor& dst, const Tensor& src);
void scale_inplace_cuda(const Ctx& ctx, const Tensor& x, float s);
void increment_i32_cuda(const Ctx& ctx, const Tensor& x);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void add_inplace(const Ctx& ctx, const Tensor& dst, const Tensor& src, float alpha);
void cast(const Ctx& ctx, const Tensor& dst, const Tensor& src);
// s is applied in x's dtype on the CPU (double in fp64 checks), as f32 on the GPU.
void scale_inplace(const Ctx& ctx, const Tensor& x, double s);
void increment_i32(const Ctx& ctx, const Tensor& x);

}  // namespace linac
