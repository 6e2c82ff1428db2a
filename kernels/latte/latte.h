// Latte: latent attention (Dolga et al. 2024; math in docs/latte.md §1-§5, §8), and
// its Macchiato mixing with a local state.
//
// Per batch b and head h, with L latents, latent-query logits a_t, latent-key logits b_t in R^L and
// values v_t in R^Dv:
//   lse_{t,l} = log sum_{s<=t} exp(b_{s,l})                      (logcumsumexp over time, lse_-1 = -inf)
//   mu_{t,l}  = sum_{s<=t} exp(b_{s,l} - lse_{t,l}) v_s          (latent summaries: convex combinations)
//   plain     (a has La = L columns):     pi_t = softmax(a_t),  y_t = sum_l pi_{t,l} mu_{t,l}
//   Macchiato (a has La = L + 1 columns): pi_t = softmax over the L + 1 columns, column 0 weighs the
//             given local state: y_t = pi_{t,0} local_t + sum_{l>=1} pi_{t,l} mu_{t,l-1}
// Below, pi_{t,l} names the weight of latent l (column l, or l + 1 with a local state).
//
// Documents (LatteOpts::docs, core/doc_bounds.h; docs/latte.md "Documents"): every sum over s <= t
// becomes a sum over start[b,t] <= s <= t, so lse and mu restart at each document start (also
// inside a chunk): lse_{t,l} = log sum_{start<=s<=t} exp(b_{s,l}), mu likewise, mu_final and the
// final lse row are the last document's. In the chunked form (below) a row t takes the carried
// state only when its document began before the chunk (start[b,t] < f), the intra-chunk products
// only for s >= max(f, start[b,t]), and the factorisation's reference is per row: ref_t = lse at
// max(f, start[b,t]), the first row of t's document in the chunk (so Qt <= 1 still, and Kt <=
// exp(growth of its document's lse inside the chunk)); a chunk state moves to the next chunk only
// when the chunk's last row's document began before the chunk (otherwise it is dropped), and the
// backward's reverse states likewise only within a document. Positions (VAPOR, RoPE) are the
// caller's.
//
// Three forms compute this (all in the CPU reference; the GPU runs the chunked one):
//   quadratic  y_t = sum_{s<=t} (sum_l pi_{t,l} exp(b_{s,l} - lse_{t,l})) v_s, every lse from its own
//              max-shifted sum (the test oracle)
//   recurrent  running weighted mean (docs/latte.md §5, also the decode step): per token
//                lse' = logaddexp(lse, b_t), omega = exp(b_t - lse'), mu += omega (v_t - mu)
//   chunked    chunks of C tokens f..e with the carried state mu_prev (mu at f-1) and lse as above
//              (docs/latte.md §3.2): with ref = lse_f (the chunk's FIRST position, so every factor but Kt is
//              <= 1 and Kt <= exp(lse_e - lse_f)):
//                Qt = pi * exp(ref - lse_t),  Kt = exp(b_s - ref),  dec = exp(lse_{f-1} - lse_t)
//                Y  = tril(Qt Kt^T) V + (pi * dec) mu_prev
//                mu_e = exp(lse_{f-1} - lse_e) mu_prev + exp(B - lse_e)^T V
//              A chunk whose lse grows by more than 60 inside it (Kt could overflow f32) forms the
//              products exp(b_s - lse_t) directly instead (docs/latte.md §3.3).
// Backward (docs/latte.md §4; gy = dy):
//   gP_{t,l} = gy_t . mu_{t,l} (Macchiato: gP_{t,0} = gy_t . local_t),  da_t = pi_t * (gP_t - pi_t . gP_t)
//   dlocal_t = pi_{t,0} gy_t
//   dv_s     = sum_l sum_{t>=s} pi_{t,l} exp(b_{s,l} - lse_{t,l}) gy_t
//   db_{s,l} = sum_{t>=s} pi_{t,l} exp(b_{s,l} - lse_{t,l}) (gy_t . v_s - gP_{t,l})      (sum_s db_{s,l} = 0)
// dv holds the latent path only (the local path's own dv belongs to whoever computed `local`).
// The recurrent backward runs the reverse recurrences of docs/latte.md §4.1, the chunked one the chunk
// states R_l = sum_{t>e} exp(lse_e - lse_t) pi_{t,l} gy_t, r_l = sum_{t>e} ... gP_{t,l} of §4.2,
// the quadratic one differentiates its own form: the three check each other.
//
// Layout: a, da [B, T, H, La]; b, db [B, T, H, L]; v, dv, y, dy, local, dlocal [B, T, H, Dv]
// (local, dlocal undefined Tensor() iff La == L). The last two dims are contiguous; batch and
// token strides are free (views of fused projections). lse [B, T, H, L] contiguous: written by the
// forward, read by the backward. mu_final [B, H, L, Dv] contiguous, optional: mu after the last
// token (with lse's last row, the decode state after a prefill). da, db, dv, dlocal are overwritten.
// Dtypes: CPU: every tensor f32 or every tensor f64. GPU: a, b, v, local, y, dy, da, db, dv, dlocal
// all bf16 or all f32; lse, mu_final and the decode state f32; every exp, logsumexp and state sum
// in f32.
// GPU: chunks of 64 tokens whatever opts.chunk says; L in 1..64, Dv a multiple of 4 up to 128
// (the paper's 96 included), any T and B*H, and latte_workspace_bytes_per_seq() of ctx.workspace
// for at least one sequence (the batch runs in groups that fit). The chunk products run on tensor
// cores with the factorised Qt, Kt (ref = lse_f as above); a chunk whose lse grows by more than 60
// forms exp(b_s - lse_t) directly instead, so no logit range can overflow it (latte_common.cuh).
// Deterministic: no atomics, fixed-order sums.
//
// Decode step (recurrent form for one token): a_t [B, H, La], b_t [B, H, L], v_t, local_t, y_t
// [B, H, Dv] (last two dims contiguous, free batch stride; local_t undefined iff La == L);
// lse_state [B, H, L] and mu_state [B, H, L, Dv] contiguous, updated in place (f32 on the GPU).
// latte_state_reset() makes a fresh state: lse = -inf, mu = 0; on the row views lse_state[b],
// mu_state[b] (narrow(0, b, 1)) it starts row b's next token a new document.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct LatteOpts {
  int64_t chunk = 64;  // C: tokens per chunk of the chunked form (CPU; the GPU always uses 64)
  DocBounds docs;      // defined: the state restarts at every document start (core/doc_bounds.h)
  // GPU, optional: f32 storage of at least latte_saved_state_bytes() where the forward leaves its
  // chunk states and decays, and the backward of the same inputs reads them instead of running the
  // chunk terms and the state scan again (it overwrites them). The CPU forms ignore it.
  Tensor saved_states;
};

enum class LatteForm { Chunked, Recurrent, Quadratic };  // the CPU runs any; the GPU always Chunked

struct LatteLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, L = 0, Dv = 0;
  bool local = false;  // Macchiato: a has L + 1 columns, column 0 weighs `local`
  int64_t chunk = 64;
  DocBounds docs;  // [B, T] bounds on the tensors' device, or undefined (one document per row)
  float* saved_states = nullptr;  // GPU: LatteOpts::saved_states, or null
  int64_t La() const { return local ? L + 1 : L; }
  // The first token of t's document in row b (0 without documents). Host code only on the CPU.
  int64_t doc_start(int64_t b, int64_t t) const { return docs.defined() ? docs.start[b * T + t] : 0; }
  Strides a, b, v, local_s, y, dy, da, db, dv, dlocal;
};

// CPU references, F = float or double. local/dlocal null iff !L.local; mu_final may be null.
template <class F>
void latte_fwd_quadratic_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                             F* mu_final);
template <class F>
void latte_fwd_recurrent_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                             F* mu_final);
template <class F>
void latte_fwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                           F* mu_final);
template <class F>
void latte_bwd_quadratic_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse,
                             const F* dy, F* da, F* db, F* dv, F* dlocal);
template <class F>
void latte_bwd_recurrent_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse,
                             const F* dy, F* da, F* db, F* dv, F* dlocal);
template <class F>
void latte_bwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse,
                           const F* dy, F* da, F* db, F* dv, F* dlocal);

// Decode step. Strides: batch strides of a_t, b_t, v_t, local_t, y_t (head stride = width).
struct LatteStepLayout {
  int64_t B = 0, H = 0, L = 0, Dv = 0;
  bool local = false;
  int64_t a = 0, b = 0, v = 0, local_s = 0, y = 0;
};
template <class F>
void latte_step_cpu(const LatteStepLayout& L, const F* a, const F* b, const F* v, const F* local, F* lse_state,
                    F* mu_state, F* y);

void latte_fwd_cuda(const Ctx& ctx, const LatteLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                    const Tensor& local, const Tensor& y, const Tensor& lse, const Tensor& mu_final);
void latte_bwd_cuda(const Ctx& ctx, const LatteLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                    const Tensor& local, const Tensor& lse, const Tensor& dy, const Tensor& da, const Tensor& db,
                    const Tensor& dv, const Tensor& dlocal);
void latte_step_cuda(const Ctx& ctx, const LatteStepLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                     const Tensor& local, const Tensor& lse_state, const Tensor& mu_state, const Tensor& y);
void latte_state_reset_cuda(const Ctx& ctx, const Tensor& lse_state, const Tensor& mu_state);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
void latte_fwd(const Ctx& ctx, const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& local,
               const Tensor& y, const Tensor& lse, const Tensor& mu_final, const LatteOpts& opts,
               LatteForm form = LatteForm::Chunked);
void latte_bwd(const Ctx& ctx, const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& local,
               const Tensor& lse, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dv,
               const Tensor& dlocal, const LatteOpts& opts, LatteForm form = LatteForm::Chunked);
void latte_step(const Ctx& ctx, const Tensor& a_t, const Tensor& b_t, const Tensor& v_t, const Tensor& local_t,
                const Tensor& lse_state, const Tensor& mu_state, const Tensor& y_t);
void latte_state_reset(const Ctx& ctx, const Tensor& lse_state, const Tensor& mu_state);

// GPU scratch (ctx.workspace) one sequence of T tokens needs: two f32 [H, ceil(T/64), L, Wd]
// arrays of per-chunk states and terms (Wd = Dv + 1 rounded up to 4), per-chunk lse carries
// [H, ceil(T/64), L] and the backward's gP [H, T, L + 1 rounded up to 4].
// The entry points split the batch into groups that fit.
size_t latte_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t L, int64_t Dv, DType act);
// Row length of the GPU's f32 chunk states: Dv + 1 (the backward's scalar state r) rounded up to 4.
constexpr int64_t latte_state_row(int64_t Dv) { return (Dv + 4) / 4 * 4; }
// LatteOpts::saved_states for a [B, T] batch: the chunk states f32 [B, H, ceil(T/64), L, Wd], then
// the chunk decays f32 [B, H, ceil(T/64), L].
size_t latte_saved_state_bytes(int64_t B, int64_t T, int64_t H, int64_t L, int64_t Dv);

}  // namespace linac
