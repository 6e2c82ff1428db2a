// Taylor linear attention, the core of the "Based" layer (Arora et al. 2024, arXiv:2402.18668;
// math in docs/based.md §2, §5, §6).
//
// Per batch b and head h, with raw projections q_t, k_t in R^F (F = d', 16 by default) and v_t in
// R^Dv: q^ = q F^(-1/4), k^ = k F^(-1/4), u_ts = q^_t . k^_s, kappa(u) = 1 + u + u^2/2 (>= 1/2), and
//   num_t = sum_{s<=t} kappa(u_ts) v_s,   den_t = sum_{s<=t} kappa(u_ts) + eps,   o_t = num_t / den_t.
// kappa(q^ . k^) = phi(q^) . phi(k^) with the feature map (R = taylor_attn_state_rows(F) = F^2 + F + 1
// rows, in this order): phi(x)[i F + j] = x_i x_j / sqrt(2) (i, j < F), phi(x)[F^2 + i] = x_i,
// phi(x)[F^2 + F] = 1. With v~ = [v, 1] (width Dv + 1) the numerator and the denominator are one
// product, o~_t = sum_{s<=t} kappa(u_ts) v~_s, so no path can forget the denominator (docs/based.md §6.1).
//
// Three forms compute this (all in the CPU reference; the GPU runs the chunked one):
//   quadratic  the masked T x T matrix kappa(U), times v~ (docs/based.md §2.4)
//   recurrent  S_t = S_t-1 + phi(k^_t) v~_t^T, o~_t = S_t^T phi(q^_t)   (inclusive; also the decode step)
//   chunked    chunks of C tokens; S_n = the state of all tokens before chunk n (exclusive):
//                o~ = phi(Q^) S_n + tril(kappa(Q^ K^^T)) V~,   S_n+1 = S_n + phi(K^)^T V~
// Backward (docs/based.md §6; g~_t = [dout_t / den_t, -(dout_t . o_t) / den_t], the gradient of o~_t):
//   P = tril(G~ V~^T), dU = P * (1 + U),  and through the feature map, for G = dL/dphi(x):
//   dx^_i = G[F^2 + i] + (1/sqrt 2) sum_j (G[i F + j] + G[j F + i]) x^_j,   dx = F^(-1/4) dx^.
//   The chunked backward runs two sweeps: forward in time with S_n for dq (dL/dphi(q^_t) = S_n g~_t,
//   plus the intra-chunk dU K^), backward in time with R_n = sum over the chunks after n of
//   phi(q^_t) g~_t^T for dk and dv (dL/dphi(k^_s) = R_n v~_s, dv~_s = R_n^T phi(k^_s), plus the
//   intra-chunk dU^T Q^ and tril(kappa(U))^T G~). The recurrent backward differentiates the
//   recurrence (the same two sweeps token by token), the quadratic one is docs/based.md §6.2; so the
//   three backward passes check each other.
//
// Documents (TaylorAttnOpts::docs, core/doc_bounds.h; st = start[b, t]): every sum above runs over
// s in [st, t] only, so each document is a sequence of its own (den_t >= (t - st + 1) / 2). The
// forms restart there: recurrent: S = 0 before a document's first token (the backward's reverse
// sweep empties dS after it); chunked, for chunk n of tokens [t0, t1]:
//   intra  pairs (t, s) with st <= s <= t;
//   inter  row t reads S_n only if st < t0 (S_n holds the document of token t0 - 1);
//   state  S_n+1 = S_n + the chunk's keys when no document starts in [t0, t1]; otherwise only the
//          keys s >= start[b, t1], the carried S_n dropped;
//   reverse (dk, dv) R_n-1 = R_n + the chunk's queries when no document starts in [t0, t1];
//          otherwise the queries with start < t0 only; key s reads R_n only if s >= start[b, t1].
// s_final (and so a prefill's state) is the state of the row's last document.
// Layout: q, k, dq, dk [B, T, H, F]; v, o, dout, dv [B, T, H, Dv]. The last two dims are contiguous
// (head stride D, unit dim stride); batch and token strides are free (views of a fused projection).
// den [B, H, T] contiguous: written by the forward (den_t including eps), read by the backward.
// States s_final (optional: an undefined Tensor when not wanted) and the decode state:
// [B, H, R, Dv + 1] contiguous, S = sum_s phi(k^_s) v~_s^T in the feature order above (column Dv
// is the normaliser's state), so the decode step reads o~ = S^T phi(q^). dq, dk, dv are overwritten.
// Dtypes: CPU: every tensor f32, or every tensor f64. GPU: q, k, v, o, dout, dq, dk, dv all bf16 or
// all f32; den and the states f32 (sums and the denominator are never rounded to bf16, docs/based.md §10.1).
// GPU limits: F = 16, chunk 64, Dv a multiple of 16 up to 128, any T and B*H, rows of the
// activation tensors 16-byte aligned; scratch from ctx.workspace (the entry points run the
// (batch, head) pairs in groups that fit). Feature tiles (phi padded to 288 rows) only ever live
// on chip (shared memory or registers).
//
// Decode step (recurrent form for one token): q, k [B, H, F], v, o [B, H, Dv] (last two dims
// contiguous, free batch stride), state [B, H, R, Dv + 1] contiguous, zero-initialised by the
// caller and updated in place: the token is added, then read out (inclusive).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct TaylorAttnOpts {
  int64_t chunk = 64;  // C: tokens per chunk (chunked form)
  double eps = 1e-12;  // added to the denominator
  DocBounds docs;      // defined: attention within each document only (core/doc_bounds.h)
  // GPU, optional: storage of at least taylor_attn_saved_carries_bytes() (contiguous, any dtype)
  // where the forward leaves the state it starts each scan segment from, and the backward of the
  // same inputs reads it instead of forming those states again (the same bits). Only calls that
  // run the fused kernels over more than one segment keep carries (T > 2048); others ignore it.
  Tensor saved_carries;
};

enum class TaylorAttnForm { Chunk, Recurrent, Quadratic };  // the CPU runs any; the GPU always Chunk

struct TaylorAttnLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, F = 0, Dv = 0;
  int64_t chunk = 64;
  double eps = 1e-12;
  const int32_t* doc_start = nullptr;  // [B, T] document starts (docs.start), null: one document per row
  float* saved_carries = nullptr;      // GPU: TaylorAttnOpts::saved_carries where the call keeps carries, or null
  Strides q, k, v, o, dout, dq, dk, dv;
  // The first token of the document of token t of row b (0 without documents).
  int64_t start(int64_t b, int64_t t) const { return doc_start ? doc_start[b * T + t] : 0; }
};

// Rows of phi (and of a head's state): F^2 + F + 1.
int64_t taylor_attn_state_rows(int64_t F);

// phi(x F^(-1/4)) of one raw vector x in R^F (R = taylor_attn_state_rows(F) values).
template <class Fl>
void taylor_feature_map_cpu(int64_t F, const Fl* x, Fl* phi);
// Its backward: dx += d/dx of G . phi(x F^(-1/4)) (gradient w.r.t. the raw x).
template <class Fl>
void taylor_feature_map_grad_cpu(int64_t F, const Fl* x, const Fl* G, Fl* dx);
// g~_t = [dout_t / den_t, -(dout_t . o_t) / den_t] of one token (Dv + 1 values).
template <class Fl>
void taylor_attn_out_grad_cpu(int64_t Dv, const Fl* o, Fl den, const Fl* dout, Fl* g);

// CPU references, Fl = float or double. s_final may be null.
template <class Fl>
void taylor_attn_fwd_quadratic_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                                   Fl* s_final);
template <class Fl>
void taylor_attn_fwd_recurrent_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                                   Fl* s_final);
template <class Fl>
void taylor_attn_fwd_chunk_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                               Fl* s_final);
template <class Fl>
void taylor_attn_bwd_quadratic_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                                   const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv);
template <class Fl>
void taylor_attn_bwd_recurrent_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                                   const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv);
template <class Fl>
void taylor_attn_bwd_chunk_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                               const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv);

// Decode step. Strides: batch strides of q, k, v, o (head stride D, unit dim stride).
struct TaylorStepLayout {
  int64_t B = 0, H = 0, F = 0, Dv = 0;
  double eps = 1e-12;
  int64_t q = 0, k = 0, v = 0, o = 0;
};
template <class Fl>
void taylor_attn_step_cpu(const TaylorStepLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* state, Fl* o);

void taylor_attn_fwd_cuda(const Ctx& ctx, const TaylorAttnLayout& L, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& den, const Tensor& s_final);
void taylor_attn_bwd_cuda(const Ctx& ctx, const TaylorAttnLayout& L, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& den, const Tensor& dout, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv);
void taylor_attn_step_cuda(const Ctx& ctx, const TaylorStepLayout& L, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& state, const Tensor& o);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
void taylor_attn_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& den, const Tensor& s_final, const TaylorAttnOpts& opts,
                     TaylorAttnForm form = TaylorAttnForm::Chunk);
void taylor_attn_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& den, const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const TaylorAttnOpts& opts, TaylorAttnForm form = TaylorAttnForm::Chunk);
void taylor_attn_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& state,
                      const Tensor& o, double eps = 1e-12);

// Whether a GPU call runs the fused kernels (scan and per-chunk products in one pass): bf16 and
// Dv <= 64, with or without document bounds (unless LINAC_TAYLOR_KERNELS=chunk). Other calls run the
// prep + scan + chunk launches.
inline bool taylor_attn_fused_case(DType act, int64_t Dv) { return act == DType::BF16 && Dv <= 64; }
// What the fused cases run, by LINAC_TAYLOR_KERNELS (auto, sm80 or chunk; UserError otherwise):
// "sm90", the fused kernels with their walks over the state on warpgroup wgmma (compute capability
// 9.0 in a build whose CUDA architectures include 90; auto), "sm80", their mma.sync walks (auto on
// other GPUs, or asked for), or "chunk", the launches every other call runs. The three round
// differently, each deterministically; at one scan segment the last two give the same bits.
const char* taylor_attn_gpu_kernels();

// GPU scratch (ctx.workspace) that B x H (batch, head) pairs of T tokens need to run in one group
// (the backward; the forward needs less); `act`, the dtype of q/k/v, picks the kernels (bf16 at
// Dv <= 64 runs the fused ones, which keep only g~ and the segment carries; LINAC_TAYLOR_KERNELS=chunk
// runs the launches in the groups that fit). With less workspace the entry points run the pairs in
// groups that fit (at least one pair must).
size_t taylor_attn_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv, DType act = DType::BF16);
// The same for the prep + scan + chunk launches (every call outside the fused cases, and all of them
// with LINAC_TAYLOR_KERNELS=chunk).
size_t taylor_attn_launches_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv,
                                            DType act = DType::BF16);
// Above one scan segment the fused cases first sum each segment's state update (a CTA per pair
// and segment, taylor_attn_totals.cu), or split each such CTA's work over two where that puts less
// of it on the busiest of the GPU's `sms` SMs; public so that the tests can pick shapes that run
// each way.
inline bool taylor_attn_totals_in_halves(int64_t ctas, int64_t sms) {
  return (2 * ctas + sms - 1) / sms < 2 * ((ctas + sms - 1) / sms);
}
// TaylorAttnOpts::saved_carries for a [B, T] call: f32 [B*H, segments of 2048 tokens,
// F*F+2F, Dv+16] where the call runs the fused kernels over more than one segment, else 0.
size_t taylor_attn_saved_carries_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv, DType act = DType::BF16);

}  // namespace linac
