// The packed layout of the GPU VQ-attention block form and the layout of its workspace (host
// code: vq_packed.cpp; the kernels are in the .cu files).
//
// Packed layout. Sequences and heads become pairs p = h B + b (head-major, so one head's rows
// are contiguous), each padded to Tp = R Lb tokens (R = ceil(T / Lb) blocks; padding is zero):
// row p Tp + t, block i = p R + n. The blocks of all pairs then sit at one uniform stride, so
// every per-block product is one strided-batched GEMM over a range of blocks:
//   window   the 2 Lb keys of block i are rows (i-1) Lb .. (i+1) Lb of kp / vp (the previous block
//            and the present one). At a pair's first block that range is the previous pair's
//            last block: masked. Block 0 has no block before it: its GEMMs take the present
//            half only (window_gemm).
//   cache    counts [NB, S] and per-code means ubar [NB, S, Dv] (NB = P R blocks) that block i reads.
// An input already in this layout (one head, T a multiple of Lb, rows contiguous) is used in
// place instead of being packed.
// Documents (VqAttnOpts::docs): the same uniform layout with each row's documents placed one
// after the other in its pairs, so that every document is a sequence of its own (vq_attn.h):
//   placement  a document that would reach two blocks past the block it starts in (it needs a
//              cache) starts on a block boundary instead, the gap being padding; that block
//              starts a cache segment (the cache scan and the reverse gradient sweep restart
//              there). Any other document follows the previous one directly: it spans at most
//              two blocks, so it never reads a cache, and may share blocks with its neighbours.
//   masks      window entries before the row's document start (lo below); cache entries of rows
//              whose document starts after their block's cache segment does (short documents).
//   R          the longest row's packed blocks, at most doc_blocks_bound(T, Lb): a gap g < Lb
//              precedes a document longer than Lb + g, so k gaps add at most
//              min(k (Lb - 1), T - k (Lb + 1)) rows, below T / 2.
// The placement is planned on the host from the bounds (one read-back per call) into the DocMap
// tables at the start of the workspace. Inputs are always packed then (never read in place).
// Entries of a query row: window e = 0..2Lb-1 (key j = (n-1) Lb + e, valid for 0 <= j <= t,
// position term rho_{t-j} for t - j <= Lb) and cache s = 0..S-1 (valid where N_s > 0).
// Scores are q.k (GEMM on the exact inputs) plus f32 bias terms (u.k, vr.rho_d): rounding q+u
// to bf16 would move every score by ~|q||k| 2^-9, which exp amplifies. The f32 codebook and rho
// enter the bf16 GEMMs as hi + lo bf16 parts for the same reason, side by side in each table row
// ([hi | lo], 2 Dk wide), so that q.C = [q | q] . [hi | lo] is one GEMM over K = 2 Dk against a
// copy of q with each row twice (Ws::qq): one pass over the f32 score matrix instead of a second
// GEMM that reads it back to add the lo part.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/gpu.h"
#include "vq_attn/vq_attn.h"

namespace linac::vq_cuda {

inline constexpr size_t kBlasBytes = size_t{32} << 20;        // cuBLASLt's share of the workspace
inline constexpr size_t kChunkBytesGoal = size_t{1} << 30;    // chunk scratch vq_attn_workspace_bytes asks for

// The documents' placement (device tables, all int32; null pointers: no documents).
struct DocMap {
  const int32_t *src = nullptr;         // [B Tp]: the token t of packed row (b, tp); -1 for padding
  const int32_t *start = nullptr;       // [B Tp]: the packed position of that row's document start
  const int32_t *cache_from = nullptr;  // [B R]: the block where block n's cache segment starts
  const int32_t *packed = nullptr;      // [B T]: the packed position of token t
};

struct Geo {
  int64_t B, T, H, Dk, Dv, S, Lb;
  int64_t R, Tp, P, NB;  // blocks per sequence, padded length, pairs, blocks in all
  int64_t ldw, lds, ldp;  // row strides of the window [.., 2Lb], cache [.., S] and distance [.., Lb+1] matrices
  int64_t ldkey;          // row stride of the backward's key-major window weights [.., Lb] (Ws::pwin)
  DocMap docs;
};

inline int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

// The most blocks a row of T tokens takes with documents (the placement above).
inline int64_t doc_blocks_bound(int64_t T, int64_t Lb) {
  int64_t gaps = 0;
  for (int64_t k = 1; k <= T / (Lb + 1); ++k) gaps = std::max(gaps, std::min(k * (Lb - 1), T - k * (Lb + 1)));
  return (T + gaps + Lb - 1) / Lb;
}

// R: blocks per pair (0: ceil(T / Lb), the stream layout).
inline Geo geo_of(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t S, int64_t Lb, int64_t R = 0) {
  Geo g{B, T, H, Dk, Dv, S, Lb, 0, 0, 0, 0, 0, 0, 0, 0, {}};
  g.R = R > 0 ? R : (T + Lb - 1) / Lb;
  g.Tp = g.R * Lb;
  g.P = H * B;
  g.NB = g.P * g.R;
  g.ldw = round8(2 * Lb);
  g.lds = round8(S);
  g.ldp = round8(Lb + 1);
  g.ldkey = round8(Lb);
  return g;
}
inline Geo geo_of(const VqAttnLayout& L) { return geo_of(L.B, L.T, L.H, L.Dk, L.Dv, L.S, L.Lb); }

// Workspace pointers. `act` pointers hold the activation dtype (bf16 or f32), the rest f32.
struct Ws {
  // Whole call: packed inputs, the cache, the bias tables.
  void *qp, *kp, *vp, *ubar;  // act: [P Tp, Dk] (q, khat), [P Tp, Dv], [NB, S, Dv]; prepare may point
                              //  qp, kp, vp at the inputs themselves
  void *ctab, *rtab;          // act: codebook [H, S, ldt], rho [H, ldp, ldt] (rows past Lb zero; ldp:
                              //  even GEMM dimensions); a row is [hi | lo] in bf16, the value in f32
  int64_t ldt = 0;            // the tables' row stride: 2 Dk in bf16, Dk in f32
  void *qq;                   // act, bf16 only: [P Tp, 2 Dk], packed q with each row twice (null in f32)
  float *counts, *ub;         // [NB, S]; u.khat_j per packed row
  float *ucb, *vrho;          // u.C_s [H, S]; vr.rho_d [H, ldp] (zero past Lb: the pos GEMM's bias)
  float *cbias;               // [NB, lds]: u.C_s + log N_s of the cache block i reads, -inf where
                              //  N_s = 0 and past S (the cache scores' every term but q.C)
  void *lists;                // scratch of the tokens' lists by (block, code), code_lists_bytes
  size_t lists_bytes;
  // Whole call, backward only.
  void *qu, *qr, *dop;          // act: q+u, q+vr [P Tp, Dk]; dout [P Tp, Dv] (or dout itself)
  float *delta, *dqu, *dqr, *dk, *ones;  // dout.o; dq's two parts, dkhat [P Tp, *]; [B Tp]
  void *dvp;                    // act: dv's window part [P Tp, Dv] (in bf16 half the bytes to write and read)
  void *gcache;                 // act: the cache means' gradients [NB, S, Dv], swept in place
  float* drho;                  // [H, ldp, Dk]
  // One chunk of `cap` blocks (rows = cap Lb).
  float *swin, *scache, *pos;   // scores q.k, q.C, q.rho: [rows, ldw], [rows, lds], [rows, ldp]
  void *pwin, *pcache;          // act: softmax weights; the backward's pwin is key-major (below)
  float *ochunk;                // forward: output rows [rows, Dv]
  float *dpwin, *dpcache;       // backward: dout.value
  void *gswin, *gscache, *gpos; // act, backward: score gradients; gpos by distance [rows, ldp] (zero past Lb)
  int64_t cap = 0;
  Ctx blas;  // ctx with the workspace's last kBlasBytes, for the GEMMs
};

// VqAttnOpts::saved_cache laid out from `base` (nullptr: sizes only): the means ubar [NB, S, Dv]
// (act), then the counts [NB, S] (f32), as the workspace's.
struct SavedCache {
  void *ubar = nullptr;
  float *counts = nullptr;
  size_t bytes = 0;
};
SavedCache saved_cache(const Geo &g, size_t act_bytes, void *base);

// VqAttnOpts::saved_weights laid out from `base` (nullptr: sizes only): the window weights
// [P Tp, ldw], then the cache weights [P Tp, lds] (act), query-major as the forward's chunks
// (Ws::pwin, Ws::pcache) at the packed rows: the chunk of blocks from i0 starts at row i0 Lb.
struct SavedWeights {
  void *pwin = nullptr, *pcache = nullptr;
  size_t bytes = 0;
};
SavedWeights saved_weights(const Geo &g, size_t act_bytes, void *base);

// The backward's window weights, key-major: slot s = i - i0 + 1 of a chunk [i0, i0 + c) is
// [2 Lb, ldkey], rows 0..Lb the weights of block i's queries for block i's keys (present), rows
// Lb..2 Lb those of block i+1's queries for block i's keys (previous), so the value gradient of
// block i's keys is one GEMM over 2 Lb queries. Slot 0 holds block i0 - 1's previous rows.
// constexpr: device code calls it too (--expt-relaxed-constexpr).
constexpr int64_t key_slot_elems(const Geo &g) { return 2 * g.Lb * g.ldkey; }

// Blocks 0 and 1 of a pair read an empty cache (block n's holds blocks <= n - 2): no cache weights
// to apply in the forward, no cache-mean gradient to send back, so the cache products skip them.
// gemm_at(i, batch, stride) is called for the chunk [i0, i0 + c)'s other blocks, each once: block
// i and batch - 1 more, stride blocks apart. Per block index n >= 2 (stride R, over the chunk's
// pairs) or per pair (stride 1, its blocks n >= 2 in the chunk), whichever takes fewer calls: two
// calls at R = 4 and 16 pairs (half the work of one call over the chunk). Past kCacheSkipMaxR
// blocks per pair the two empty blocks are too small a share to pay for the extra calls and their
// wave tails (the 190M model's op on an H200: 3.5% slower at R = 8 with six calls of 8 blocks, and
// at R = 16 with four of 14, than one call over the chunk), so one call takes the whole chunk, the
// empty caches' products included (zero weights, zero gradients).
constexpr int64_t kCacheSkipMaxR = 4;
template <class Fn>
void for_cached_blocks(const Geo &g, int64_t i0, int64_t c, Fn &&gemm_at) {
  if (g.R > kCacheSkipMaxR) {
    gemm_at(i0, c, int64_t{1});
    return;
  }
  const int64_t first = i0 / g.R, pairs = (i0 + c - 1) / g.R - first + 1;
  if (g.R - 2 <= pairs) {
    for (int64_t n = 2; n < g.R; ++n) {
      const int64_t p0 = i0 <= n ? 0 : (i0 - n + g.R - 1) / g.R, last = i0 + c - 1 - n;
      const int64_t batch = last < 0 ? 0 : last / g.R - p0 + 1;
      if (batch > 0) gemm_at(p0 * g.R + n, batch, g.R);
    }
    return;
  }
  for (int64_t p = first; p < first + pairs; ++p) {
    const int64_t lo = std::max(i0, p * g.R + 2), hi = std::min(i0 + c, (p + 1) * g.R);
    if (hi > lo) gemm_at(lo, hi - lo, int64_t{1});
  }
}

// Scratch of code_lists (vq_code_lists.cu) for R segments per pair.
size_t code_lists_bytes(int64_t B, int64_t T, int64_t H, int64_t S, int64_t R);

// The documents' placement of a [B, T] call with blocks of Lb, from the bounds' ends on the host
// (core/doc_bounds.h): R and the DocMap tables' contents, one after the other (src, start,
// cache_from, packed; vq_documents.cpp).
struct DocPlan {
  int64_t R = 0;
  std::vector<int32_t> tables;
};
DocPlan plan_documents(const int32_t *end, int64_t B, int64_t T, int64_t Lb);
// Bytes of the DocMap tables for R blocks per pair, rounded to 256.
size_t doc_tables_bytes(int64_t B, int64_t T, int64_t Lb, int64_t R);
// The geometry of a call: geo_of(L) without documents; with them, the placement planned from
// the bounds (read back once) and its tables copied to the start of ctx.workspace, or the
// tables already there where L.doc_blocks holds their block count (VqAttnOpts::doc_blocks); *rest
// is the context with the workspace after them (ctx itself without documents). CUDA builds only.
Geo geo_of_call(const Ctx &ctx, const VqAttnLayout &L, Ctx *rest);

// Lays the workspace out from `base` (nullptr: sizes only) for chunks of `cap` blocks; returns
// the bytes used, kBlasBytes included.
size_t layout(const Geo& g, size_t act_bytes, bool backward, int64_t cap, char* base, Ws* ws);

}  // namespace linac::vq_cuda
