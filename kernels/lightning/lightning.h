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
// Documents (LightningOpts::docs, core/doc_bounds.h; docs/transnormer.md §4.5): the state restarts
// empty at every document start t > 0, S_t = k_t^T v_t there; s0 continues the row's first
// document (token 0 never restarts, so a row that is one document gives the stream result, and a
// state carried between calls continues the document that ends the earlier call); s_final is the
// state of the row's last document. In the quadratic form the sum runs over st(t) <= u <= t
// (st = docs.start, en = docs.end) and the s0 term counts only where st(t) = 0. In the block form,
// with t0 = n C, e = t0 + m - 1 the block's last token and lim = max(t0, 1), the decay weights are
// unchanged and each term keeps only pairs within a document:
//   intra pair (i, j), j <= i    when t0 + j >= st(t0 + i)     (equivalently t0 + i < en(t0 + j))
//   a[i] q_i S_n                 when st(t0 + i) < lim         (row i continues S_n's document)
//   c[j] k_j^T v_j into S_n+1    when en(t0 + j) > e           (token j's document reaches the end)
//   g S_n into S_n+1             when st(e) < lim              (no document starts in the block)
// and the backward is the transpose: R_n-1 = [st(e) < lim] g R_n + sum over the rows with
// st(t0 + i) < lim of a[i] q_i^T do_i; dk_j and dv_j take the R_n term only when en(t0 + j) > e.
// No state gradient crosses a document start.
//
// Layout: q, k, dq, dk [B, T, H, Dk]; v, o, dout, dv [B, T, H, Dv]. The last two dims are
// contiguous (head stride D, unit dim stride); batch and token strides are free, since q/k/v
// come from a fused projection. decay [H] contiguous, on the op's device, holding s_h >= 0.
// States s0, s_final, ds_final, ds0: [B, H, Dk, Dv] contiguous, each optional (an undefined
// Tensor: zero initial state / no final-state output / no gradient on the final state / no
// initial-state gradient). dq, dk, dv, ds0 are overwritten.
// Dtypes: CPU: every tensor f32, or every tensor f64 (decay too). GPU: q, k, v, o, dout, dq, dk,
// dv all bf16 or all f32; decay and the states f32 (accumulation in f32 throughout).
// Documents: docs.start and docs.end, [B, T] int32 on the op's device (host memory on the CPU).
// GPU: block C = 64 whatever opts.block says; Dk and Dv multiples of 16 (up to 1024: the kernels
// walk the head dims in 64-wide slices; tested up to 256), 16-byte aligned rows, any T and B*H, and
// lightning_workspace_bytes_per_seq() of ctx.workspace for at least one sequence (the batch runs
// in groups that fit). Deterministic: no atomics, fixed-order sums.
// Saved states (GPU only, optional): the backward first reruns the forward's state scan (the
// states S_n before each block, the input of its dq pass). A `saved` tensor of at least
// lightning_saved_bytes() (any dtype, contiguous, 256-byte aligned) handed to lightning_fwd keeps
// them there; handing the same tensor, untouched, to lightning_bwd with the same inputs skips the
// scan (bit-identical results). The CPU takes no `saved`.
//
// SiLU feature map (TransNormerLLM's q = SiLU(q_pre), k = SiLU(k_pre), docs/transnormer.md §1.2), in
// the backward only: with LightningOpts::q_pre (k_pre) given, [B,T,H,Dk] like q, lightning_bwd writes
// into dq (dk) the gradient of q_pre (k_pre), dq * silu'(q_pre) (activation.h), instead of the
// gradient of q. The GPU rounds dq to the activation dtype first, so it writes the bits that
// lightning_bwd followed by silu_bwd write, without dq's round trip through memory. The pre-
// activations must not overlap dq, dk or dv.
//
// Decode step (recurrent form for one token): q, k [B, H, Dk], v, o [B, H, Dv] (last two dims
// contiguous, free batch stride), state [B, H, Dk, Dv] contiguous, updated in place:
// state = lambda * state + k^T v, o = q state. GPU: q/k/v/o bf16 or f32, decay and state f32.
// It knows no documents: the caller zeroes a row's state before the row's next document.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct LightningOpts {
  int64_t block = 64;  // C: tokens per block of the block form (CPU; the GPU always uses 64)
  DocBounds docs;      // defined: the recurrence restarts at every document (start and end needed)
  Tensor q_pre, k_pre;  // lightning_bwd: the SiLU feature map's pre-activations (above), or undefined
};

enum class LightningForm { Block, Recurrent, Quadratic };  // the CPU runs any; the GPU always Block

struct LightningLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, Dk = 0, Dv = 0;
  int64_t block = 64;
  DocBounds docs;
  Strides q, k, v, o, dout, dq, dk, dv, q_pre, k_pre;

  // st(b, t) and en(b, t) of the Documents paragraph: without documents a row is one document.
  // Host code only (docs must be host memory to call them with documents).
  int64_t doc_start(int64_t b, int64_t t) const { return docs.defined() ? docs.start[b * T + t] : 0; }
  int64_t doc_end(int64_t b, int64_t t) const { return docs.defined() ? docs.end[b * T + t] : T; }
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
                        const Tensor& decay, const Tensor& s0, const Tensor& o, const Tensor& s_final,
                        const Tensor& saved);
void lightning_bwd_cuda(const Ctx& ctx, const LightningLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& decay, const Tensor& s0, const Tensor& dout, const Tensor& ds_final,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& ds0, const Tensor& saved,
                        const Tensor& q_pre, const Tensor& k_pre);
void lightning_step_cuda(const Ctx& ctx, const LightningStepLayout& L, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& decay, const Tensor& state, const Tensor& o);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
void lightning_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& o, const Tensor& s0, const Tensor& s_final, const LightningOpts& opts,
                   LightningForm form = LightningForm::Block, const Tensor& saved = Tensor());
void lightning_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& dout, const Tensor& s0, const Tensor& ds_final, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const Tensor& ds0, const LightningOpts& opts,
                   LightningForm form = LightningForm::Block, const Tensor& saved = Tensor());
void lightning_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                    const Tensor& state, const Tensor& o);

// GPU scratch (ctx.workspace) one sequence of T tokens needs: the per-block states of both scans
// (act) and the per-block scan terms (f32), 8 H ceil(T/64) Dk Dv bytes in bf16 (12 in f32); `act` is
// the dtype of q/k/v. The entry points split the batch into groups that fit.
size_t lightning_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act);
// Bytes of the saved states of B sequences (see above): H ceil(T/64) Dk Dv per sequence in `act`.
size_t lightning_saved_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act);

}  // namespace linac
