// Softmax attention, causal or full, optionally restricted to a sliding window; FlashAttention-2
// style on the GPU (Dao 2023): tiled, online softmax, only the log-sum-exp is saved.
//
// For each batch b, head h and query t (scale defaults to 1/sqrt(D)):
//   allowed(t,s): causal: s <= t (and s > t - window when window > 0); full: every s < T;
//                 with document bounds (AttentionOpts::docs) also s >= start[b,t]: block-diagonal
//                 causal masking, tiles wholly outside a query tile's documents skipped
//   S[t,s] = scale * <q[b,t,h,:], k[b,s,g,:]>          for allowed s, -inf otherwise
//   lse[t] = log sum_s exp(S[t,s]),   P[t,s] = exp(S[t,s] - lse[t])
//   o[t]   = sum_s P[t,s] v[b,s,g,:]
// where g = h / (H / Hk) is the key/value head of query head h: grouped-query attention (Ainslie
// et al. 2023) with Hk key/value heads, Hk dividing H (Hk = H: multi-head; Hk = 1: multi-query).
// Backward (dO = dout):
//   dP = dO V^T,  delta[t] = <dO[t], o[t]> (= sum_s P[t,s] dP[t,s]),  dS = P * (dP - delta)
//   dq = scale * dS K,   dk = scale * dS^T Q,   dv = P^T dO
// with dk and dv of head g summed over the H / Hk query heads of its group.
//
// RoPE (AttentionOpts::rope defined): q and k arrive rotated (rope_fwd, positions 0 .. T-1, or
// t - start[b,t] with document bounds, by the caller); the backward returns dq and dk for the unrotated q and k, i.e.
// rope_bwd applied to the gradients above. The Hopper backward rotates dq and dk as it writes them at D = 64, and dk
// at D = 80, 96, 112, 128 (one bf16 rounding, no extra pass); every other gradient gets a rope_bwd pass after the
// kernel.
//
// Layout: q, o, dout, dq are [B, T, H, D] and k, v, dk, dv [B, T, Hk, D], each with the last two
// dims contiguous (head stride D, unit dim stride); batch and token strides are free, since q/k/v
// (and dq/dk/dv) are views into a fused [B, T, H + 2 Hk, D] projection (token stride
// (H + 2 Hk) D). lse is [B, H, T] contiguous. dq and dk are overwritten; dv is too, or added to with
// AttentionOpts::accumulate_dv (v has another consumer whose gradient is already in dv).
// Dtypes: CPU: all f32 or all f64, any head dim. GPU: activations all bf16 or all f32, lse f32;
// head dim 64, 80, 96, 112 or 128 (attention_gpu_head_dim_ok). The GPU backward needs
// attention_bwd_workspace_bytes() of ctx.workspace, the GPU forward its first 4 bytes (the Hopper
// kernel's work counter).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"
#include "rope/rope.h"

namespace linac {

struct AttentionOpts {
  float scale = 0;     // softmax scale (> 0); 0 means 1/sqrt(D)
  bool causal = true;
  int64_t window = 0;  // 0: unlimited; > 0: query t sees keys s with t - window < s <= t (needs causal)
  RopeFreqs rope;        // defined: q and k carry this RoPE; the backward returns unrotated dq, dk
  DocBounds docs;        // defined: causal attention within each document only (core/doc_bounds.h)
  bool accumulate_dv = false;  // backward: dv += P^T dO (rounded once, after the sum) instead of dv =
};

// Shapes, resolved options and the (batch, token) element strides of every [B,T,H,D] argument.
struct AttentionLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, D = 0;
  int64_t Hk = 0;    // key/value heads, dividing H
  double scale = 0;  // never 0 here
  bool causal = true;
  int64_t window = 0;
  RopeFreqs rope;
  DocBounds docs;
  bool accumulate_dv = false;
  Strides q, k, v, o, dout, dq, dk, dv;

  // Keys [lo, hi] that query t of row b may attend to (hi < lo never happens for t < T). Host
  // code only: docs must be host memory to call key_lo with them.
  int64_t key_lo(int64_t b, int64_t t) const {
    int64_t lo = causal && window > 0 ? (t - window + 1 > 0 ? t - window + 1 : 0) : 0;
    if (docs.defined() && docs.start[b * T + t] > lo) lo = docs.start[b * T + t];
    return lo;
  }
  int64_t key_hi(int64_t t) const { return causal ? t : T - 1; }
  // Query heads per key/value head.
  int64_t group() const { return H / Hk; }
};

// Whether the GPU kernels take head dim D: a multiple of 16 from 64 to 128.
inline bool attention_gpu_head_dim_ok(int64_t D) { return D % 16 == 0 && D >= 64 && D <= 128; }

// Which bf16 GPU kernels run for head dim D on the current device: "sm90" (wgmma + TMA, FA3
// style: a build for sm_90 on a compute capability 9.0 GPU; head dims past 64 on 128-column tiles)
// or "sm80" (mma.sync, FA2 style: every other GPU). LINAC_ATTENTION_KERNELS=sm80 forces the
// latter (for comparisons); unset or "auto" picks; anything else is an error.
const char* attention_gpu_kernels(int64_t D);

template <class F>
void attention_fwd_cpu(const AttentionLayout& L, const F* q, const F* k, const F* v, F* o, F* lse);
template <class F>
void attention_bwd_cpu(const AttentionLayout& L, const F* q, const F* k, const F* v, const F* o, const F* lse,
                       const F* dout, F* dq, F* dk, F* dv);

void attention_fwd_cuda(const Ctx& ctx, const AttentionLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& lse);
void attention_bwd_cuda(const Ctx& ctx, const AttentionLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv);

// Entry points: check shapes and strides, dispatch on ctx.device and dtypes.
void attention_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, const AttentionOpts& opts);
void attention_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const AttentionOpts& opts);
// Scratch attention_bwd takes from ctx.workspace on the GPU (byte offsets, 256-aligned): delta,
// [B, H, T] f32; where the Hopper kernels run (attention_gpu_kernels) also the dQ accumulator,
// one f32 tile of kAttentionDqTile query rows x D per (batch*head, query block) (D rounded up to
// 64 or 128, the kernel's tile), and one int32
// counter per tile plus a launch ticket; with RoPE rotated by the Hopper kernels (D = 64, 128),
// the rope_table_cuda of positions 0 .. T-1 (8 * T * D/2 bytes).
constexpr int64_t kAttentionDqTile = 64;
// Columns of the Hopper kernels' tiles for head dim D: 64, or 128 for 64 < D <= 128.
constexpr int attention_sm90_tile_cols(int64_t D) { return D <= 64 ? 64 : 128; }
struct AttentionBwdWorkspace {
  size_t delta = 0, counters = 0, dq_acc = 0, rope_table = 0, bytes = 0;
};
AttentionBwdWorkspace attention_bwd_workspace(int64_t B, int64_t T, int64_t H, int64_t D, bool rope = false);
inline size_t attention_bwd_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D, bool rope = false) {
  return attention_bwd_workspace(B, T, H, D, rope).bytes;
}
// Whether the GPU backward rotates RoPE gradients inside its kernel (the Hopper kernels: dq and dk
// at D = 64; dk at D = 80, 96, 112, 128, where dQ leaves in 64-column chunks that split the
// pairs), and whether that includes dq.
bool attention_bwd_fuses_rope(int64_t D);
inline bool attention_bwd_fuses_rope_dq(int64_t D) { return D == 64 && attention_bwd_fuses_rope(D); }

}  // namespace linac
