// The fused Taylor attention kernels with the output warps' walks on wgmma (taylor_attn_fused.cuh),
// built for sm_90a only.
#include "taylor_attn/taylor_attn_fused.cuh"

namespace linac::taylor_cuda::fused {

void launch_sm90(const Ctx& ctx, Mode mode, const Args& a, int P, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                 const bf16_t* gt, float* carry, bf16_t* out, float* den, float* s_final, bf16_t* dx) {
  launch_mode<true>(ctx, mode, a, P, q, k, v, gt, carry, out, den, s_final, dx);
}

}  // namespace linac::taylor_cuda::fused
