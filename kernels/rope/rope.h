// Rotary position embedding (Su et al. 2021) with the GPT-NeoX / Hugging Face LLaMA
// "rotate half" pairing: within each head, element i pairs with element i + D/2 (i < D/2).
// Token t of a sequence sits at position p = pos0 + t, or with document bounds (core/doc_bounds.h)
// p = pos0 + t - start[b, t] (positions restart at every document), or p = pos[b] + t with
// per-row positions on the device (a decoding step); with
//   inv_freq_i = base^(-2i/D)  (RopeFreqs, optionally rescaled as Llama 3 does),  angle = p * inv_freq_i,
// the forward rotates each pair by +angle,
//   y_i = x_i cos - x_{i+D/2} sin,   y_{i+D/2} = x_{i+D/2} cos + x_i sin,
// and the backward rotates the gradient by -angle (the rotation's transpose). Both work in
// place.
//
// Precision: inv_freq_i is RopeFreqs::inv_freq, evaluated in double and rounded to the compute type
// (on the GPU to f32, on the host, so host and device agree bit for bit); the angle is
// T(p) * inv_freq_i rounded once in the compute type, as in the Hugging Face implementation;
// the GPU then uses sincosf (accurate over the full range, unlike __sincosf) and rounds each product
// of the rotation on its own (rope_math.cuh, shared with rope_linear's GEMM). In f32 the angle
// therefore carries a relative error of about 2^-24 (e.g. ~2e-4 rad at p = 4096), the same as
// reference implementations that compute it in f32.
//
// Layout: x (and dx) [B, T, H, D] with the last two dimensions contiguous (strides D and 1) and
// arbitrary batch and token strides, so x can be the q or k slice of a fused [B, T, 3, H, D]
// qkv buffer. D is even, D <= kRopeMaxDim. GPU: f32 or bf16, math in f32. CPU: f32 or f64.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

constexpr int64_t kRopeMaxDim = 512;

// The rotation frequencies. Plain RoPE: inv_freq_i = base^(-2i/D). Llama 3's frequency scaling
// (factor > 0; docs/transformer.md "RoPE options") keeps the short wavelengths
// (lambda_i = 2 pi / inv_freq_i below original_context / high_freq_factor), divides the long ones
// (lambda_i above original_context / low_freq_factor) by `factor`, and blends the two in between:
//   s = (original_context / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   inv_freq_i <- (1 - s) inv_freq_i / factor + s inv_freq_i.
// A double converts to plain RoPE of that base.
struct RopeFreqs {
  double base = 0;  // > 0 for a rotation; 0 means none (AttentionOpts)
  double factor = 0;
  double low_freq_factor = 1, high_freq_factor = 4, original_context = 8192;

  RopeFreqs() = default;
  RopeFreqs(double b) : base(b) {}  // NOLINT(google-explicit-constructor): a base is a plain RoPE
  bool defined() const { return base > 0; }
  bool scaled() const { return factor > 0; }
  double inv_freq(int64_t d, int64_t i) const {
    const double f = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (!scaled()) return f;
    const double kPi = 3.14159265358979323846, wavelen = 2 * kPi / f;
    if (wavelen < original_context / high_freq_factor) return f;
    if (wavelen > original_context / low_freq_factor) return f / factor;
    const double s = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1 - s) * f / factor + s * f;
  }
  bool operator==(const RopeFreqs&) const = default;
};

// inv_freq_i rounded to f32: what the GPU kernels use (see Precision above).
inline float rope_inv_freq_f32(const RopeFreqs& freqs, int64_t d, int64_t i) {
  return static_cast<float>(freqs.inv_freq(d, i));
}

// Rotates by +angle (inverse = false) or -angle (inverse = true). doc_start: docs.start ([b, t]
// int32, x's device) or null; row_pos: int32 [b] (x's device) added to each row's positions, or null.
template <class T>
void rope_apply_cpu(T* x, int64_t b, int64_t t, int64_t h, int64_t d, int64_t stride_b, int64_t stride_t,
                    const RopeFreqs& freqs, int64_t pos0, bool inverse, const int32_t* doc_start = nullptr,
                    const int32_t* row_pos = nullptr);

void rope_apply_cuda(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, bool inverse,
                     const int32_t* doc_start = nullptr, const int32_t* row_pos = nullptr);
// The (cos, sin) of every angle at positions 0 .. t-1, computed as the rotation kernels do:
// cos_sin[(p * d/2 + i) * 2 + {0, 1}] (f32, device memory, d/2 pairs per position). For kernels
// that rotate their own outputs (the Hopper attention backward's dq and dk).
void rope_table_cuda(const Ctx& ctx, const RopeFreqs& freqs, int64_t d, int64_t t, float* cos_sin);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
// docs: x's rows are [B, T] packed documents (x.size(0) = B, x.size(1) = T), positions restart
// at each one.
void rope_fwd(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs = {});
void rope_bwd(const Ctx& ctx, const Tensor& dx, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs = {});
// Row b's token t at position pos[b] + t: pos int32 [B] on x's device, read there (a decoding
// step's per-row document positions; the launch does not change with them, so a CUDA graph
// replays it). On the GPU, positions below 2^24 are the caller's invariant.
void rope_fwd(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, const Tensor& pos);
void rope_bwd(const Ctx& ctx, const Tensor& dx, const RopeFreqs& freqs, const Tensor& pos);

}  // namespace linac
