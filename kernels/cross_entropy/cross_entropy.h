// Fused softmax cross-entropy of the LM head, loss and gradient in one call (the logits are
// never softmaxed into a separate buffer):
//   lse_i          = log sum_j exp(logits[i,j])
//   losses[i]      = lse_i - logits[i, t_i]
//   dlogits[i,j]   = (exp(logits[i,j] - lse_i) - [j == t_i]) * grad_scale
// Rows whose target t_i < 0 are ignored: losses[i] = 0 and dlogits[i,:] = 0. grad_scale is the
// loss weight of a row (typically 1 / number of counted tokens).
// Optional hits [N] (losses' dtype; pass an empty Tensor to skip): hits[i] = 1 when t_i is the
// row's argmax — the first index holding the row maximum, as torch.argmax picks it, so a row of
// equal logits is a hit only for target 0 — else 0; 0 for ignored rows. Accuracy metrics (MQAR).
//
// Layout: logits, dlogits [N, V] contiguous; targets [N] i32; losses [N]. dlogits may be the
// very memory of logits (in place, same dtype): every row is read in full before any of it is
// written. GPU: logits and dlogits f32 or bf16, losses f32; a row is held in a block's registers
// up to V = 32768, on Hopper up to 51,200 (V a multiple of 4; one read per logit;
// cross_entropy_gpu_kernel), else one pass for the running max and sum (online softmax) and a
// second for the writes. CPU: one dtype (f32 or f64).
// A target >= V is a caller bug: the CPU throws linac::Error; the GPU, which cannot see the
// targets from the host, reads nothing out of bounds and writes a NaN loss for that row
// (its gradient row is then softmax * grad_scale), which a non-finite-loss check catches.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

// hits may be null.
template <class T>
void cross_entropy_fwd_bwd_cpu(const T* logits, const int32_t* targets, T* dlogits, T* losses, T* hits, int64_t n,
                               int64_t v, double grad_scale);

// Which GPU kernel takes these logits: "rows_sm90" (a Hopper GPU in a build for sm_90: register
// rows streamed through shared memory, V <= 51,200, cross_entropy_sm90.cu), "rows" (register rows read from
// global memory; V <= 32768) or "two_pass" (longer rows, or V not a multiple of 4).
// LINAC_CROSS_ENTROPY_KERNELS=sm80 keeps Hopper GPUs off "rows_sm90" (comparisons and tests); unset or
// "auto" picks; anything else is an error.
const char* cross_entropy_gpu_kernel(const Tensor& logits, const Tensor& dlogits);

void cross_entropy_fwd_bwd_cuda(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                                const Tensor& losses, const Tensor& hits, float grad_scale);

// Entry point: checks shapes, dispatches on ctx.device and dtypes.
void cross_entropy_fwd_bwd(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                           const Tensor& losses, float grad_scale, const Tensor& hits = Tensor());

}  // namespace linac
