// Per-head normalisation times a swish output gate (the GLA output path, docs/gla.md §1.2 / §4.5):
//   u[n,h,:] = (x[n,h,:] - mean) * rstd,   mean/var over the head's D values, rstd = 1/sqrt(var + eps)
//              (LayerNorm without affine, statistics in f32/f64)
//   y[n,c]   = u[n,c] * swish(r[n,c] + br[c]),   swish(p) = p * sigmoid(p),   c = h*D + j
// Backward (p = r + br, s = sigmoid(p)):
//   dr[n,c] = dy * u * s * (1 + p * (1 - s))                  (= d/dp; the bias gradient is its column sum)
//   du      = dy * p * s
//   dx      = rstd * (du - mean_j(du) - u * mean_j(du * u))
//
// Layout: x, y, dy, dx, r, dr [N, H*D] with unit column stride and free row strides (r and dr are
// views into fused projection buffers); br [H*D]; mean, rstd [N, H] contiguous (written by the
// forward, read by the backward). y, dx, dr are written (overwrite).
// Dtypes: GPU: x, r, y, dy, dx, dr one activation dtype (bf16 or f32), br/mean/rstd f32, math in
// f32. CPU: one dtype (f32 or f64).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct NormGateLayout {
  int64_t N = 0, H = 0, D = 0;
  double eps = 1e-5;
  int64_t x = 0, r = 0, y = 0, dy = 0, dx = 0, dr = 0;  // row strides
};

template <class T>
void norm_gate_fwd_cpu(const NormGateLayout& L, const T* x, const T* r, const T* br, T* y, T* mean, T* rstd);
template <class T>
void norm_gate_bwd_cpu(const NormGateLayout& L, const T* x, const T* r, const T* br, const T* mean, const T* rstd,
                       const T* dy, T* dx, T* dr);

void norm_gate_fwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd);
void norm_gate_bwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr);

// Entry points: x etc. are [N, H*D]; mean/rstd [N, H] give H. Check shapes, dispatch.
void norm_gate_fwd(const Ctx& ctx, const Tensor& x, const Tensor& r, const Tensor& br, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, double eps);
void norm_gate_bwd(const Ctx& ctx, const Tensor& x, const Tensor& r, const Tensor& br, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr);

}  // namespace linac
