// Fused AdamW step (Loshchilov & Hutter 2019, decoupled weight decay; PyTorch's AdamW), with
// t = step (1-based):
//   g  = grad * grad_scale                      (clipping and averaging factor, applied first)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   m^ = m / (1 - beta1^t),   v^ = v / (1 - beta2^t)
//   p -= lr * (weight_decay * p + m^ / (sqrt(v^) + eps))
// The bias corrections are computed in double on the host; the GPU folds them into
// lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
//
// Layout: param, grad, m, v are flat and contiguous with the same number of elements, f32 on
// the GPU (master weights and optimizer state), one dtype (f32 or f64) on the CPU. compute_copy
// is optional (an undefined Tensor skips it): the same number of elements, receiving the
// updated param, as bf16 rounded to nearest-even on the GPU, in param's dtype on the CPU.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

// Defaults are PyTorch's AdamW defaults.
struct AdamWArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 1e-2f, grad_scale = 1;
  int64_t step = 1;
};

template <class T>
void adamw_step_cpu(T* param, const T* grad, T* m, T* v, T* compute_copy, int64_t n, const AdamWArgs& a);

void adamw_step_cuda(const Ctx& ctx, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& compute_copy, const AdamWArgs& a);

// Entry point: checks shapes, dispatches on ctx.device and dtypes.
void adamw_step(const Ctx& ctx, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& compute_copy, const AdamWArgs& a);

}  // namespace linac
