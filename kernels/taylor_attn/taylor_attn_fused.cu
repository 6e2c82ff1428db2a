// Host side of the fused Taylor attention kernels (taylor_attn_fused.cuh): grouping, workspace,
// and the choice between the mma.sync walks (any sm_80+ GPU, instantiated here) and the wgmma walks
// (compute capability 9.0 in an sm_90a build, taylor_attn_fused_sm90.cu; LINAC_TAYLOR_KERNELS=sm80
// keeps the former).
#include <algorithm>
#include <string_view>

#include "taylor_attn/taylor_attn_fused.cuh"

namespace linac::taylor_cuda {
namespace {

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

bool use_wgmma() { return std::string_view(taylor_attn_gpu_kernels()) == "sm90"; }

// One launch of the fused kernel for the pairs a.p0 .. a.p0 + P - 1 in `mode`.
void launch_fused(const Ctx& ctx, bool wg, Mode mode, const Args& a, int P, const bf16_t* q, const bf16_t* k,
                  const bf16_t* v, const bf16_t* gt, float* carry, bf16_t* out, float* den, float* s_final,
                  bf16_t* dx) {
#if LINAC_WITH_SM90A
  if (wg) return fused::launch_sm90(ctx, mode, a, P, q, k, v, gt, carry, out, den, s_final, dx);
#endif
  fused::launch_mode<false>(ctx, mode, a, P, q, k, v, gt, carry, out, den, s_final, dx);
}

}  // namespace

bool fused_applies(const Args& a, DType act) {
  static_assert(8 * fused::kNT == 64 + 16, "the fused kernels' value tiles hold Dv <= 64");
  return taylor_attn_fused_case(act, a.Dv) && std::string_view(taylor_attn_gpu_kernels()) != "chunk";
}

void fwd_fused(const Ctx& ctx, const TaylorAttnLayout& L, Args a, const bf16_t* q, const bf16_t* k, const bf16_t* v,
               bf16_t* o, float* den, float* s_final) {
  const bool wg = use_wgmma();
  // Workspace: the f32 segment carries only, none with one segment or with saved carries (set
  // only above one segment: every pair's carries stay there for the backward).
  const size_t per = static_cast<size_t>(a.nseg) * kRows * a.DvP;
  const bool saved = L.saved_carries != nullptr;
  const int64_t BH = L.B * L.H;
  const int64_t size = balanced_group(ctx, L, [&](int64_t P) { return a.nseg > 1 && !saved ? P * per * 4 : 0; });
  for (int64_t p0 = 0; p0 < BH; p0 += size) {
    const int P = static_cast<int>(std::min(size, BH - p0));
    a.p0 = static_cast<int>(p0);
    float* carry = saved ? L.saved_carries + p0 * per : static_cast<float*>(ctx.workspace);
    if (a.nseg > 1) {
      launch_totals(ctx, a, P, false, k, v, carry, s_final != nullptr);
      launch_carry(ctx, a, P, false, carry, s_final);
    }
    launch_fused(ctx, wg, kOut, a, P, q, k, v, nullptr, carry, o, den, s_final, nullptr);
  }
}

void bwd_fused(const Ctx& ctx, const TaylorAttnLayout& L, Args a, const bf16_t* q, const bf16_t* k, const bf16_t* v,
               const bf16_t* o, const float* den, const bf16_t* dout, bf16_t* dq, bf16_t* dk, bf16_t* dv) {
  const bool wg = use_wgmma();
  // Workspace (taylor_attn_workspace_bytes): g~ chunk-major, then the f32 segment carries (none with
  // one segment), which the two sweeps use in turn.
  const size_t g_per = static_cast<size_t>(a.N) * kC * a.DvP * sizeof(bf16_t);
  auto need = [&](int64_t P) { return taylor_attn_workspace_bytes(1, L.T, P, L.F, L.Dv, DType::BF16); };
  const int64_t BH = L.B * L.H, size = balanced_group(ctx, L, need);
  for (int64_t p0 = 0; p0 < BH; p0 += size) {
    const int P = static_cast<int>(std::min(size, BH - p0));
    a.p0 = static_cast<int>(p0);
    Workspace<bf16_t> w;
    w.gt = static_cast<bf16_t*>(ctx.workspace);
    float* carry = reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + round256(P * g_per));
    launch_prep<bf16_t>(ctx, a, P, nullptr, nullptr, nullptr, o, dout, den, w, kPrepG);
    // The forward state's carries: the forward's, or formed again as the forward formed them.
    float* fwd_carry = L.saved_carries ? L.saved_carries + p0 * a.nseg * kRows * a.DvP : carry;
    if (a.nseg > 1 && !L.saved_carries) {
      launch_totals(ctx, a, P, false, k, v, carry, false);
      launch_carry(ctx, a, P, false, carry, nullptr);
    }
    launch_fused(ctx, wg, kGradQ, a, P, q, k, v, w.gt, fwd_carry, nullptr, nullptr, nullptr, dq);
    if (a.nseg > 1) {
      launch_totals(ctx, a, P, true, q, w.gt, carry, false);
      launch_carry(ctx, a, P, true, carry, nullptr);
    }
    launch_fused(ctx, wg, kGradK, a, P, q, k, v, w.gt, carry, dv, nullptr, nullptr, dk);
  }
}

}  // namespace linac::taylor_cuda
