// Lightning Attention (Qin et al. 2024, arXiv:2405.17381; math in docs/transnormer.md
// §2-§4, §8): decayed causal linear attention with a constant per-head decay.
//
// Per batch b and head h, with row vectors q_t, k_t in R^Dk, v_t in R^Dv, a decay rate s_h >= 0
// (lambda = exp(-s_h); s_h = 0 is plain causal linear attention) and the state S_t in R^{Dk x Dv}:
//   S_t = lambda S_{t-1} + k_t^T v_t            (decay first, then write, then read)
//   o_t = q_t S_t                               (the output includes token t; no scale, no normaliser)
// S_-1 = s0 (zero unless given), s_final = S_{T-1}. Equivalently (quadratic form):
//   o_t = sum_{u<=t} exp(-s (t-u)) (q_t . k_u) v_u + exp(-s (t+1)) q_t s0
//
// Three forms compute this (all in the CPU reference; the GPU runs the block form):
//   recurrent  the recurrence above, step by step (also the decode step)
//   quadratic  the masked n x n form, D[t,u] = exp(-s (t-u)) for t >= u, else 0
//   block      blocks of C tokens (the last one may hold m < C); S_n = state before block n and
//                a[i] = exp(-s (i+1)), c[j] = exp(-s (m-1-j)), g = exp(-s m), every exponent <= 0:
//                o_i     = sum_{j<=i} exp(-s (i-j)) (q_i . k_j) v_j + a[i] q_i S_n
//                S_n+1   = g S_n + (c * K)^T V
//              Using m (not C) for the ragged last block keeps s_final exact for a prefill -> decode
//              hand-off (docs/transnormer.md §3.2).
// Backward (docs/transnormer.md §4.3; R_n = gradient of the state after block n, scanned in reverse,
// R_N-1 = ds_final):
//   dq_i = sum_{j<=i} exp(-s (i-j)) (do_i . v_j) k_j + a[i] do_i S_n^T
//   dk_j = sum_{i>=j} exp(-s (i-j)) (do_i . v_j) q_i + c[j] v_j R_n^T
//   dv_j = sum_{i>=j} exp(-s (i-j)) (q_i . k_j) do_i + c[j] k_j R_n
//   R_n-1 = g R_n + (a * Q)^T dO,   ds0 = R_-1
// The recurrent and quadratic references differentiate their own form directly, so the three
// backward passes check each other. The decay is a fixed buffer: it has no gradient.
//
// Layout: q, k, dq, dk [B, T, H, Dk]; v, o, dout, dv [B, T, H, Dv]. The last two dims are
// contiguous (head stride D, unit dim stride); batch and token strides are free, since q/k/v
// come from a fused projection. decay [H] contiguous, on the op's device, holding s_h >= 0.
// States s0, s_final, ds_final, ds0: [B, H, Dk, Dv] contiguous, each optional (an undefined
// Tensor: zero initial state / no final-state output / no gradient on the final state / no
// initial-state gradient). dq, dk, dv, ds0 are overwritten.
// Dtypes: CPU: every tensor f32, or every tensor f64 (decay too). GPU: q, k, v, o, dout, dq, dk,
// dv all bf16 or all f32; decay and the states f32 (accumulation in f32 throughout).
// GPU: block C = 64 whatever opts.block says; Dk and Dv multiples of 16 (up to 1024: the kernels
// walk the head dims in 64-wide slices; tested up to 256), 16-byte aligned rows, any T and B*H, and
// lightning_workspace_bytes_per_seq() of ctx.workspace for at least one sequence (the batch runs
// in groups that fit). Deterministic: no atomics, fixed-order sums.
//
// Decode step (recurrent form for one token): q, k [B, H, Dk], v, o [B, H, Dv] (last two dims
// contiguous, free batch stride), state [B, H, Dk, Dv] contiguous, updated in place:
// state = lambda * state + k^T v, o = q state. GPU: q/k/v/o bf16 or f32, decay and state f32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct LightningOpts {
  int64_t block = 64;  // C: tokens per block of the block form (CPU; the GPU always uses 64)
};

enum class LightningForm { Block, Recurrent, Quadratic };  // the CPU runs any; the GPU always Block

struct LightningLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, Dk = 0, Dv = 0;
  int64_t block = 64;
  Strides q, k, v, o, dout, dq, dk, dv;
};

// CPU references, F = float or double. decay [H]; pointers to optional states may be null.
template <class F>
void lightning_fwd_recurrent_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, F* o, F* s_final);
template <class F>
void lightning_bwd_recurrent_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0);
template <class F>
void lightning_fwd_quadratic_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, F* o, F* s_final);
template <class F>
void lightning_bwd_quadratic_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0);
template <class F>
void lightning_fwd_block_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                             const F* s0, F* o, F* s_final);
template <class F>
void lightning_bwd_block_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                             const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0);

// Decode step. Strides: batch strides of q, k, v, o (head stride D, unit dim stride).
struct LightningStepLayout {
  int64_t B = 0, H = 0, Dk = 0, Dv = 0;
  int64_t q = 0, k = 0, v = 0, o = 0;
};
template <class F>
void lightning_step_cpu(const LightningStepLayout& L, const F* q, const F* k, const F* v, const F* decay, F* state,
                        F* o);

void lightning_fwd_cuda(const Ctx& ctx, const LightningLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& decay, const Tensor& s0, const Tensor& o, const Tensor& s_final);
void lightning_bwd_cuda(const Ctx& ctx, const LightningLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& decay, const Tensor& s0, const Tensor& dout, const Tensor& ds_final,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& ds0);
void lightning_step_cuda(const Ctx& ctx, const LightningStepLayout& L, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& decay, const Tensor& state, const Tensor& o);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
void lightning_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& o, const Tensor& s0, const Tensor& s_final, const LightningOpts& opts,
                   LightningForm form = LightningForm::Block);
void lightning_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& dout, const Tensor& s0, const Tensor& ds_final, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const Tensor& ds0, const LightningOpts& opts,
                   LightningForm form = LightningForm::Block);
void lightning_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                    const Tensor& state, const Tensor& o);

// GPU scratch (ctx.workspace) one sequence of T tokens needs: the per-block states of both scans
// (act) and the per-block scan terms (f32), 8 H ceil(T/64) Dk Dv bytes in bf16 (12 in f32); `act` is
// the dtype of q/k/v. The entry points split the batch into groups that fit.
size_t lightning_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act);

}  // namespace linac
