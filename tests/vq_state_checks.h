// The VQ-attention prefill handover (vq_attn_state_prefill) against the steps it replaces, on the
// CPU or the GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac::test {

// On ctx: vq_attn_state_prefill of the whole prompt against T steps of vq_attn_step
// (vq_attn_state_start_document where a row's next document starts), from the same inputs. The
// cache (every count and mean) and every ring slot that a token of the row's last document holds
// must have the same bits; the slots of earlier documents must be absent (z = -1) in both.
// q, khat, v: [B, T, H, D] views on ctx's device (any batch and token strides); z: [B, T, H]
// int32 on the host; codebook, u, vr, rho as vq_attn_step takes them; docs: per row the lengths of
// its documents (empty: one document per row).
void check_state_prefill_matches_steps(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z,
                                       const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr,
                                       const Tensor& rho, const std::vector<std::vector<int64_t>>& docs);

}  // namespace linac::test
