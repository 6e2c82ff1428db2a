// SimpleRMSNorm (TransNormerLLM, docs/transnormer.md §1.5): RMSNorm over the last dimension
// without gain or bias:
//   y[r,:] = x[r,:] * rstd[r],   rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
// Backward (y recomputed from x and rstd):
//   dx[r,:] (+)= rstd[r] * (dy[r,:] - y[r,:] * mean_j(y[r,j] * dy[r,j]))
//
// Layout: x, y, dy, dx [N, C] with unit column stride and any row stride (e.g. column ranges of
// a wider buffer); rstd [N] contiguous, written by the forward and read by the backward. dx is
// overwritten, or added to when `accumulate` (x is a residual stream whose gradient already
// holds the skip path). C <= kSrmsnormMaxDim.
// Optional residual add (pre-norm blocks), in the same pass: with `add` [N, C] (y's dtype), the
// forward normalises h = x + add instead of x and writes h [N, C] (x's dtype): x is the residual
// stream before a sub-layer, add that sub-layer's output, h the stream after it.
// Optional output gate (TransNormerLLM's mixer output, docs/transnormer.md §1.5), in the same pass:
// with `u` [N, C] the forward writes y = x * rstd * u, and the backward takes the gradient of that
// y, writes du = dy * x * rstd and dx = rstd * (dy * u - x * rstd * mean_j(x[r,j] * rstd * dy[r,j] * u[r,j])),
// which saves the normalised rows' round trip through memory and the gate's own launches. u has y's
// dtype in the forward and dy's in the backward; du has dx's; dx is overwritten.
// Optional constant factor (Transformer-VQ's queries and keys, scaled by Dk^-1/4, docs/transformer_vq.md
// §4.6), in the same pass: y = x * rstd * scale; the backward takes dy * scale as the gradient of the
// normalised row (rstd is that of x alone either way).
// Optional pull toward a target in the scaled backward (Transformer-VQ's commitment term on its keys,
// docs/transformer_vq.md §4.5), in the same pass: with `t` [N, C] (dy's dtype) and a factor `pull`, the
// gradient of y is dy + pull * (y - t), which adds the gradient of (pull / 2) ||y - t||^2; y is
// recomputed from x and rstd in f32, not read back.
// Dtypes: GPU: x and y each f32 or bf16, dy and dx each f32 or bf16, independently (the block
// norm reads the f32 residual stream and writes bf16; the norm inside the mixer reads and writes
// bf16); rstd f32; math in f32. CPU: every tensor one dtype (f32 or f64).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

constexpr int64_t kSrmsnormMaxDim = 16384;

// Row strides (in elements) of the [N, C] operands.
struct SrmsnormLayout {
  int64_t N = 0, C = 0;
  int64_t x = 0, y = 0, dy = 0, dx = 0, add = 0, h = 0, u = 0, du = 0, t = 0;
  double scale = 1;  // y's constant factor (srmsnorm_scaled_*)
  double pull = 0;   // the target's factor (srmsnorm_scaled_bwd with a target)
};

// Pointers the variant does not use (add and h, u and du, t) are null.
template <class T>
void srmsnorm_fwd_cpu(const SrmsnormLayout& L, const T* x, const T* add, const T* u, T* y, T* rstd, T* h, double eps);
template <class T>
void srmsnorm_bwd_cpu(const SrmsnormLayout& L, const T* x, const T* u, const T* t, const T* rstd, const T* dy, T* dx,
                      T* du, bool accumulate);

void srmsnorm_fwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& y, const Tensor& rstd,
                       float eps, const Tensor& add, const Tensor& h, const Tensor& u);
void srmsnorm_bwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& rstd, const Tensor& dy,
                       const Tensor& dx, bool accumulate, const Tensor& u, const Tensor& du, const Tensor& t);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void srmsnorm_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y, const Tensor& rstd, double eps,
                  const Tensor& add = Tensor(), const Tensor& h = Tensor());
void srmsnorm_bwd(const Ctx& ctx, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                  bool accumulate);
// The scaled variant: y = srmsnorm(x) * scale; its backward optionally pulls y toward `target`
// (the gradient of y is then dy + pull * (y - target)).
void srmsnorm_scaled_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y, const Tensor& rstd, double eps,
                         double scale);
void srmsnorm_scaled_bwd(const Ctx& ctx, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                         double scale, bool accumulate, const Tensor& target = Tensor(), double pull = 0);
// The gated variant: y = srmsnorm(x) * u; its backward writes dx and du.
void srmsnorm_gate_fwd(const Ctx& ctx, const Tensor& x, const Tensor& u, const Tensor& y, const Tensor& rstd,
                       double eps);
void srmsnorm_gate_bwd(const Ctx& ctx, const Tensor& x, const Tensor& u, const Tensor& rstd, const Tensor& dy,
                       const Tensor& dx, const Tensor& du);

}  // namespace linac
