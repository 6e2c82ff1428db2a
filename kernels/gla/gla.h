// Gated linear attention (Yang et al. 2023, arXiv:2312.06635; math in docs/gla.md).
//
// Per batch b and head h, with row vectors q_t, k_t in R^Dk, v_t in R^Dv, a log forget gate
// g_t in (-inf, 0]^Dk (alpha_t = exp(g_t)) and the state S_t in R^{Dk x Dv}:
//   S_t = diag(alpha_t) S_{t-1} + k_t^T v_t            (decay first, then write, then read)
//   o_t = scale * q_t S_t                               (the output includes token t)
// S_0 is the initial state (zero unless given), S_T the final state. Equivalently, with the
// inclusive cumulative log decay a_t = sum_{s<=t} g_s:
//   o_t = scale * sum_{s<=t} (sum_i q_t[i] k_s[i] exp(a_t[i] - a_s[i])) v_s + scale * (q_t * exp(a_t)) S_0
//
// Three forms compute this (all in the CPU reference; the GPU runs the chunkwise one):
//   recurrent  the recurrence above, step by step (also the decode step)
//   parallel   the quadratic form with pairwise exponents a_t - a_s, masked before exp
//   chunkwise  chunks of C tokens with chunk-local inclusive cumsums B (reset every chunk),
//              bn = B[C-1]; per chunk n (S_n = state BEFORE the chunk):
//                o      = scale (q * exp(B)) S_n + P v
//                S_n+1  = exp(bn) * S_n + (k * exp(bn - B))^T v
//              P[r,s] = scale sum_i q[r,i] k[s,i] exp(B[r,i] - B[s,i]) (s <= r) is built from
//              sub-chunks of c tokens: off-diagonal blocks (I > J) as a matmul of
//              q_I * exp(B_I - B[Ic]) and k_J * exp(B[Ic] - B_J), every factor <= 1; diagonal
//              blocks in full precision, factorised the same way (reference: the sub-chunk's
//              first row) where a key column decays by at most kGlaFactorSpan across the
//              sub-chunk, with exact pairwise exponents where it decays by more (P decides per
//              64-column slice of Dk, dq and dk per column). No gate strength overflows.
// Backward (docs/gla.md §4; dS_n = gradient of the state after chunk n-1, scanned in reverse):
//   dS_n = exp(bn) dS_n+1 + scale (q * exp(B))^T do_n,     dS_N = dS_final,  dS_0 -> d initial state
//   dq = scale [(do S_n^T) * exp(B) + intra],   dk = (v dS_n+1^T) * exp(bn - B) + intra,
//   dv = (k * exp(bn - B)) dS_n+1 + P^T do,     dP = do v^T (causal),
//   intra: dq[r,i] += sum_{s<=r} dP[r,s] k[s,i] e(r,s,i), dk[s,i] += sum_{r>=s} dP[r,s] scale q[r,i] e(r,s,i)
//   dg[t] = sum_{t'>=t} (q * dq - k * dk)[t'] + rowsum(dS_final * S_T)      (TOTAL dq, dk),
//         computed chunk-locally (docs/gla.md §4.3): for t in chunk n, the sum over the chunk's rows t' >= t
//         plus rowsum(dS_n+1 * S_n+1), which carries the later chunks exactly; no sum runs along T.
// The recurrent and parallel references differentiate their own form directly (dg from the
// per-step state derivative and from the pairwise exponents), so the three backward passes
// check each other.
//
// Layout: q, k, dq, dk [B, T, H, Dk]; v, o, dout, dv [B, T, H, Dv]; g, dg [B, T, H, Dk]. The last
// two dims are contiguous (head stride D, unit dim stride); batch and token strides are free,
// since q/k/v come from a fused projection. States s0, s_final, ds_final, ds0: [B, H, Dk, Dv]
// contiguous, each optional (an undefined Tensor: zero initial state / no final-state output /
// no gradient on the final state / no initial-state gradient). dq, dk, dv, dg, ds0 are
// overwritten. g must be <= 0 (a log of a gate in (0, 1]).
// Dtypes: CPU: every tensor f32, or every tensor f64. GPU: q, k, v, o, dout, dq, dk, dv all bf16
// or all f32; g, dg and the states f32 (gates and cumsums are never rounded to bf16). The GPU
// needs chunk 64, sub_chunk 16, Dk and Dv multiples of 16 (up to 1024), 16-byte aligned rows of
// q, k, v, g, o, dout, dq, dk, dv, and gla_workspace_bytes_per_seq() of ctx.workspace for at
// least one sequence (it processes the batch in groups that fit).
// Saved intermediates (GPU only, optional): the backward first recomputes the forward's chunk
// buffers (cumsums, decayed q and k, states S_0..S_N, P: 3 of its 6 launches). A `saved` tensor of
// at least gla_saved_bytes() (any dtype, contiguous, 256-byte aligned) handed to gla_fwd keeps them
// there; handing the same tensor, untouched, to gla_bwd with the same inputs skips the
// recomputation (bit-identical results), and gla_bwd then does not read g (it may be undefined).
// The CPU takes no `saved`.
//
// Decode step (recurrent form for one token): q, k [B, H, Dk], v, o [B, H, Dv], g [B, H, Dk]
// (last two dims contiguous, free batch stride), state [B, H, Dk, Dv] contiguous, updated in
// place: state = exp(g) * state + k^T v, o = scale * q state. GPU: q/k/v/o bf16 or f32, g and the
// state f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

// The largest decay B[first] - B[last] across a sub-chunk (per key column) for which a diagonal
// block is formed from per-row factors exp(B[r] - B[first]) and exp(B[first] - B[s]) instead of
// one exponential per pair (docs/gla.md §3.2); both factors then stay within exp(+-60).
inline constexpr double kGlaFactorSpan = 60.0;

struct GlaOpts {
  double scale = 1.0;      // multiplies every q.k product
  int64_t chunk = 64;      // C: tokens per chunk (chunkwise form)
  int64_t sub_chunk = 16;  // c: tokens per sub-chunk; divides chunk
  // gla_bwd calls this once, on the GPU right after launching the first reverse state scan (on the
  // CPU before it starts): data-parallel training opens its gradient-reduction window there, so
  // the reductions share the GPU with the chunk kernels' many short CTAs, not with the scan's few
  // long ones (model/env.h, open_comm_window).
  std::function<void()> after_reverse_scan;
};

enum class GlaForm { Chunk, Recurrent, Parallel };  // the CPU runs any; the GPU always Chunk

struct GlaLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, Dk = 0, Dv = 0;
  double scale = 1.0;
  int64_t chunk = 64, sub_chunk = 16;
  Strides q, k, v, g, o, dout, dq, dk, dv, dg;
};

// CPU references, F = float or double. Pointers to optional states may be null.
template <class F>
void gla_fwd_recurrent_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                           F* s_final);
template <class F>
void gla_bwd_recurrent_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                           const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0);
template <class F>
void gla_fwd_parallel_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                          F* s_final);
template <class F>
void gla_bwd_parallel_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                          const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0);
template <class F>
void gla_fwd_chunk_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                       F* s_final);
template <class F>
void gla_bwd_chunk_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                       const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0);

// Decode step. Strides: batch strides of q, k, v, g, o (head stride D, unit dim stride).
struct GlaStepLayout {
  int64_t B = 0, H = 0, Dk = 0, Dv = 0;
  double scale = 1.0;
  int64_t q = 0, k = 0, v = 0, g = 0, o = 0;
};
template <class F>
void gla_step_cpu(const GlaStepLayout& L, const F* q, const F* k, const F* v, const F* g, F* state, F* o);

void gla_fwd_cuda(const Ctx& ctx, const GlaLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& s0, const Tensor& o, const Tensor& s_final, const Tensor& saved);
void gla_bwd_cuda(const Ctx& ctx, const GlaLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& s0, const Tensor& dout, const Tensor& ds_final, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& ds0, const Tensor& saved,
                  const std::function<void()>& after_reverse_scan);
void gla_step_cuda(const Ctx& ctx, const GlaStepLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& g, const Tensor& state, const Tensor& o);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
void gla_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& o,
             const Tensor& s0, const Tensor& s_final, const GlaOpts& opts, GlaForm form = GlaForm::Chunk,
             const Tensor& saved = Tensor());
void gla_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& dout,
             const Tensor& s0, const Tensor& ds_final, const Tensor& dq, const Tensor& dk, const Tensor& dv,
             const Tensor& dg, const Tensor& ds0, const GlaOpts& opts, GlaForm form = GlaForm::Chunk,
             const Tensor& saved = Tensor());
void gla_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& state, const Tensor& o, double scale);

// GPU scratch (ctx.workspace) one sequence of T tokens needs for the backward (the forward needs
// less); `act` is the dtype of q/k/v. The entry points split the batch into groups that fit.
// With saved intermediates the backward needs only the state gradients, the forward nothing.
size_t gla_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act, bool saved = false);
// Bytes of the saved intermediates of B sequences (see above).
size_t gla_saved_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act);

}  // namespace linac
