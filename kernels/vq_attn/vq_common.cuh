// Shared by the CUDA VQ-attention kernels: the carve of ctx.workspace, a GEMM on raw pointers,
// the tokens' lists by code (per-code sums without atomics), the score of one (query, entry)
// pair.
//
// Packed layout, workspace: vq_packed.h.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_common.cuh"
#include "matmul/matmul.h"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_packed.h"

namespace linac::vq_cuda {

// Carves ctx.workspace with the largest chunk that fits (at most one head's blocks); refuses a
// workspace below one block's chunk in one line naming `op` and the bytes needed.
Ws carve(const Ctx& ctx, const Geo& g, size_t act_bytes, bool backward, const char* op);

// ctx with the last kBlasBytes of its workspace (start aligned down to 256 bytes, so callers keep
// 256 bytes spare) as the workspace, for the GEMMs of a kernel that uses the rest.
inline Ctx blas_tail(const Ctx& ctx) {
  Ctx blas = ctx;
  blas.workspace = static_cast<char*>(ctx.workspace) + (ctx.workspace_bytes - kBlasBytes) / 256 * 256;
  blas.workspace_bytes = kBlasBytes;
  return blas;
}

// C = A @ B (+ beta C) over `batch` matrices at the given element strides; A and B of dtype ab
// (bf16 or f32) on the GPU, stored row-major with transposes as in matmul.h; C f32, or of dtype
// ab (cd). bias (f32 C, beta 0, 16-byte aligned): [n] added to every row in the epilogue.
struct Operand {
  const void* p;
  int64_t ld, stride;
  bool trans;
};
// tf32_exact: f32 operands whose values are all exact in TF32 (GemmProblem::tf32_exact).
void gemm(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, int64_t batch, Operand a, Operand b, void* c,
          int64_t ldc, int64_t stride_c, float beta, bool tf32_exact = false, DType cd = DType::F32,
          const float* bias = nullptr);
// The same GEMM with an f32 table (codebook or rho, Ws::ctab / rtab: one head's [rows, ldt]) as
// B, the same for every batch entry: its hi part, then in bf16 its lo part (the columns beside it)
// accumulated.
void gemm_table(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, int64_t batch, Operand a, const void* tab,
                int64_t ldt, float* c, int64_t ldc, int64_t stride_c, float beta);

// Packs q, khat (+ u.khat), v (or points w's qp, kp, vp at them where they already are in the
// packed layout), the cache (scan), the bias tables and the hi/lo parts, for the forward and
// the backward alike (vq_prepare.cu). With L.saved_cache the cache lives there: the forward
// writes it, the backward reads it. A backward with L.saved_weights skips what only the scores read.
template <class T>
void prepare(const Ctx& ctx, const Geo& g, const VqAttnLayout& L, Ws& w, const T* q, const T* khat, const int32_t* z,
             const T* v, const float* codebook, const float* u, const float* vr, const float* rho, bool backward);
// Whether a [B, T, H, D] input with strides s is the packed layout itself ([P Tp, D] rows).
bool is_packed(const Geo& g, VqAttnLayout::Strides s, int64_t D);
// The row stride (>= D) at which such an input holds the packed rows, each row's D values
// contiguous (one head, T a multiple of Lb, rows at one stride across sequences); 0 if it does not.
int64_t packed_row_stride(const Geo& g, VqAttnLayout::Strides s, int64_t D);
// The batched GEMM over blocks [i0, i0 + c) with the window of block i (rows (i-1) Lb ..
// (i+1) Lb of the packed [*, D] matrix x) as B: on the N side (C_i [Lb, 2 Lb] = A_i [Lb, D]
// window_i^T, the scores) or on the K side (C_i [Lb, D] = A_i [Lb, 2 Lb] window_i). Block 0 has
// no block before it: its GEMM takes only the present half (columns Lb.. of C, or of A); on the
// N side the first Lb columns of its C are left unwritten. C is f32, or of dtype act (cd).
void window_gemm(const Geo& g, const Ws& w, DType act, int64_t i0, int64_t c, bool n_side, Operand a, const void* x,
                 int64_t D, void* cc, int64_t ldc, int64_t stride_c, float beta, DType cd = DType::F32);
// The backward's dP GEMMs of blocks [i0, i0 + c) with the score gradients in their epilogue, from
// dout's packed rows at `dop` (row stride ldo) and the forward's saved weights (whole, at the
// packed rows): w's gswin, gscache, gpos and key-major pwin, as the rows kernel of vq_attn_bwd.cu
// writes them (vq_score_grads_sm90.cu; bf16, Lb and Dv multiples of 8, sm_90a builds).
void score_grads_sm90(const Ctx& ctx, const Geo& g, const Ws& w, int64_t i0, int64_t c, const void* dop, int64_t ldo,
                      const void* sp_win, const void* sp_cache);
// The score GEMMs of blocks [i0, i0 + c) of head h: swin, scache, pos (with vr.rho_d added).
void chunk_scores(const Geo& g, const Ws& w, DType act, int64_t h, int64_t i0, int64_t c);
// Per (p, t, d): dst[p Tp + t, d] = src(b, s, h, d) + add[h, d] (add may be null) for the token s at
// packed position t (source_token), zero for padding;
// with copies > 1 each row `copies` times side by side (dst rows copies * D wide).
template <class T>
void pack(const Ctx& ctx, const Geo& g, const T* src, VqAttnLayout::Strides s, int64_t D, const float* add, T* dst,
          int copies = 1);
// Per packed row: out[p Tp + t] = x(b,s,h,:) . (vec[h,:] if y is null, else y(b,s,h,:)) for its token s,
// 0 for padding.
template <class T>
void row_dots(const Ctx& ctx, const Geo& g, const T* x, VqAttnLayout::Strides xs, int64_t D, const float* vec,
              const T* y, VqAttnLayout::Strides ys, float* out);
// Per packed row: out[p Tp + t] = the sum of head h's Dv / 8 entries of units (b, s, :), the
// [B, T, H Dv / 8] table of VqAttnOpts::delta_units, for its token s, 0 for padding; in a fixed
// order (lane-strided, then a warp tree).
void unit_sums(const Ctx& ctx, const Geo& g, const float* units, float* out);

// The tokens of each segment (h, b, m) (packed positions [m Ls, (m + 1) Ls) of sequence b, head
// h: the token's own position, or packed[b T + t] with documents) by code, in token order: those
// with code s are tok[start[key] .. start[key + 1]) for key = ((h B + b) R + m) S + s. Sorted in
// `scratch` (code_lists_bytes), which holds the lists; a too small scratch is refused in one line
// naming `op` (vq_code_lists.cu).
struct CodeLists {
  const int32_t* start;  // [H B R S + 1]
  const int32_t* tok;    // [B T H] token indices t
};
CodeLists code_lists(const Ctx& ctx, const int32_t* z, const int32_t* packed, int64_t B, int64_t T, int64_t H,
                     int64_t S, int64_t Ls, int64_t R, void* scratch, size_t bytes, const char* op);

// Counts and means of the cache each block reads (blocks <= n-2 of its cache segment), from the
// lists by (block, code); vq_cache_scan.cu.
template <class T>
void cache_scan(const Ctx& ctx, const Geo& g, const T* v, VqAttnLayout::Strides vs, CodeLists lists, float* counts,
                T* ubar);
// gcache^(m) <- sum_{n >= m+2} gcache^(n) / N^(n) over the blocks n of m's cache segment (0 where
// N = 0), [NB, S, Dv] in T, in place (f32 sums); vq_cache_scan.cu.
template <class T>
void cache_grad_sweep(const Ctx& ctx, const Geo& g, const float* counts, T* gcache);

// The token of packed position tp of sequence b: tp itself, or the documents' map; -1 for padding.
__device__ __forceinline__ int64_t source_token(const Geo& g, uint32_t b, uint32_t tp) {
  if (g.docs.src) return g.docs.src[int64_t{b} * g.Tp + tp];
  return tp < g.T ? int64_t{tp} : -1;
}

// Row r of a chunk starting at block i0, as block, pair, packed position t, head, sequence and
// token s (-1 for padding) (32-bit divisions: carve checks that the packed rows fit).
struct Row {
  int64_t i, l, p, n, t, h, b, s;
};
__device__ __forceinline__ Row row_of(const Geo& g, int64_t i0, int64_t r) {
  const uint32_t Lb = static_cast<uint32_t>(g.Lb), R = static_cast<uint32_t>(g.R), B = static_cast<uint32_t>(g.B);
  const uint32_t rr = static_cast<uint32_t>(r), di = rr / Lb;
  const uint32_t i = static_cast<uint32_t>(i0) + di, p = i / R, n = i - p * R, h = p / B;
  Row w;
  w.i = i;
  w.l = rr - di * Lb;
  w.p = p;
  w.n = n;
  w.t = int64_t{n} * Lb + w.l;
  w.h = h;
  w.b = p - h * B;
  w.s = source_token(g, static_cast<uint32_t>(w.b), static_cast<uint32_t>(w.t));
  return w;
}

// The scores of row r of a chunk (row w), everything but the GEMM terms resolved once per row
// so an entry costs 32-bit index math and its loads. Window entry e is key j = (n-1) Lb + e:
// valid for lo <= e <= hi (lo = Lb at a pair's first block: no block before it, or with
// documents the entry of the row's document start where that is later; hi = Lb + l: j <= t);
// distance t - j = hi - e, with a position term (pos, vr.rho_d included) where it is <= Lb
// (e >= l). Cache entry s: q.C_s plus Ws::cbias (-inf where masked; every entry of a row in a
// pair's first two blocks, whose q.C_s chunk_scores may leave unwritten, or whose document starts
// after its block's cache segment does). Masked entries are -inf.
// Entries go in groups of four (one 16-byte load of the GEMM scores, and of the key biases ub
// where Lb % 4 == 0: a group then lies in one block): the score rows are padded to ldw =
// round8(2 Lb) and lds = round8(S), so a group that starts inside a row ends inside its padding,
// whose entries come out masked.
struct RowScores {
  const float *swin, *scache, *pos, *ub, *cbias;
  int lo, hi, l, Lb;
  bool cache_on;
  __device__ __forceinline__ RowScores(const Geo& g, const Row& w, int64_t r, const Ws& ws) {
    swin = ws.swin + r * g.ldw;
    scache = ws.scache + r * g.lds;
    pos = ws.pos + r * g.ldp;
    ub = ws.ub + w.p * g.Tp + w.n * g.Lb;  // the present block's key biases: entry e's is ub[e - Lb]
    cbias = ws.cbias + w.i * g.lds;
    l = static_cast<int>(w.l);
    Lb = static_cast<int>(g.Lb);
    lo = w.n == 0 ? Lb : 0;
    hi = Lb + l;
    cache_on = w.n >= 2;  // a pair's first two blocks have an empty cache (their scores may not be computed)
    if (g.docs.start) {
      const int ds = g.docs.start[w.b * g.Tp + w.t];  // packed, like (n - 1) Lb + e
      lo = max(lo, ds - (static_cast<int>(w.n) - 1) * Lb);
      cache_on = cache_on && ds <= g.docs.cache_from[w.b * g.R + w.n] * Lb;
    }
  }
  __device__ __forceinline__ float window(int e, float qk, float uk) const {
    if (e < lo || e > hi) return -INFINITY;
    float s = qk + uk;
    if (e >= l) s += pos[hi - e];
    return s;
  }
  // Entries e0 .. e0 + 3 (e0 a multiple of 4).
  __device__ __forceinline__ float4 window4(int e0) const {
    const float4 q = *reinterpret_cast<const float4*>(swin + e0);
    const float* u = ub + (e0 - Lb);
    if (Lb % 4 != 0)
      return make_float4(window(e0, q.x, e0 >= lo && e0 <= hi ? u[0] : 0.f),
                         window(e0 + 1, q.y, e0 + 1 >= lo && e0 + 1 <= hi ? u[1] : 0.f),
                         window(e0 + 2, q.z, e0 + 2 >= lo && e0 + 2 <= hi ? u[2] : 0.f),
                         window(e0 + 3, q.w, e0 + 3 >= lo && e0 + 3 <= hi ? u[3] : 0.f));
    if (e0 + 3 < lo || e0 > hi) return make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    const float4 uk = *reinterpret_cast<const float4*>(u);
    return make_float4(window(e0, q.x, uk.x), window(e0 + 1, q.y, uk.y), window(e0 + 2, q.z, uk.z),
                       window(e0 + 3, q.w, uk.w));
  }
  __device__ __forceinline__ float4 cache4(int s0) const {
    if (!cache_on) return make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    const float4 q = *reinterpret_cast<const float4*>(scache + s0), b = *reinterpret_cast<const float4*>(cbias + s0);
    return make_float4(q.x + b.x, q.y + b.y, q.z + b.z, q.w + b.w);
  }
};

// Applies f to the four lanes of a float4 with their offsets 0..3, returning the results.
template <class F>
__device__ __forceinline__ float4 map4(float4 x, F f) {
  return make_float4(f(x.x, 0), f(x.y, 1), f(x.z, 2), f(x.w, 3));
}

}  // namespace linac::vq_cuda
