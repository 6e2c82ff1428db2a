// Shared by the attention kernels: the kernel argument block, the tile ranges that causal,
// sliding-window and document masks leave, and the layout of [rows, D] bf16 tiles (loaded and multiplied with
// the sm_80 toolkit, common/mma_sm80.cuh) kept in shared memory so that the
// eight row addresses of every ldmatrix phase hit eight different bank groups: where a row holds a
// multiple of eight 16-byte chunks (D = 64, 128) by an XOR swizzle (chunk c of row r lives at
// c ^ (r & 7)), otherwise (D = 80, 96, 112) by padding each row with one chunk, which makes the
// row pitch an odd number of chunks.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "attention/attention.h"
#include "common/cuda_common.cuh"
#include "common/mma_sm80.cuh"

namespace linac::attn {

using bf16_t = __nv_bfloat16;

using cuda::kLog2e;

struct Args {
  int T, H, window;
  int D;             // head dim of the tensors (the Hopper kernels' tiles may be wider)
  int Hk;            // key/value heads; query head h reads head h / (H / Hk)
  bool causal;
  bool accumulate_dv;  // the backward adds its dv to the tensor's (AttentionOpts::accumulate_dv)
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e): scores go through exp2
  AttentionLayout::Strides q, k, v, o, dout, dq, dk, dv;
  // Document bounds ([B, T] int32, core/doc_bounds.h), null without documents. Causal only, so
  // for s <= t: s >= start[t] (the query's document reaches back to s) <=> t < end[s] (the key's
  // reaches forward to t); kernels whose rows are keys test the latter.
  const int32_t* doc_start;
  const int32_t* doc_end;
};

inline Args make_args(const AttentionLayout& L) {
  LINAC_CHECK(L.T < (int64_t{1} << 30) && L.window < (int64_t{1} << 30), "attention (GPU): T too large");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.window = static_cast<int>(L.window);
  a.Hk = static_cast<int>(L.Hk);
  a.D = static_cast<int>(L.D);
  a.causal = L.causal;
  a.accumulate_dv = L.accumulate_dv;
  a.scale = static_cast<float>(L.scale);
  a.scale_log2 = static_cast<float>(L.scale * 1.4426950408889634);
  a.q = L.q, a.k = L.k, a.v = L.v, a.o = L.o, a.dout = L.dout, a.dq = L.dq, a.dk = L.dk, a.dv = L.dv;
  a.doc_start = L.docs.start, a.doc_end = L.docs.end;
  return a;
}

// The bf16 kernels move rows with 16-byte cp.async and write bf16 pairs: rows must be 16-byte aligned.
inline void check_bf16_rows(const Tensor& x, const AttentionLayout::Strides& s, const char* name) {
  LINAC_CHECK(reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && s.b % 8 == 0 && s.t % 8 == 0,
              std::string("attention (GPU, bf16): ") + name + " rows must be 16-byte aligned");
}

using cuda::cdiv;

// The key/value head that query head h reads: grouped-query attention's h / (H / Hk).
__device__ __forceinline__ int kv_head(const Args& a, int h) { return h / (a.H / a.Hk); }

// The first token of token t's document and one past its last, in row b; t is clamped to the
// row, so padding rows of a tile read the last token's.
__device__ __forceinline__ int doc_start_of(const Args& a, int b, int t) {
  return __ldg(a.doc_start + int64_t{b} * a.T + min(t, a.T - 1));
}
__device__ __forceinline__ int doc_end_of(const Args& a, int b, int t) {
  return __ldg(a.doc_end + int64_t{b} * a.T + min(t, a.T - 1));
}

// Key blocks [lo, hi] of width bc that queries [q0, q0 + br) of row b reach. With documents
// (kDocs: a.doc_start is set; a compile-time flag, so that kernels without them compile as before)
// the first query's document start bounds them all (starts never decrease along t).
template <bool kDocs>
__device__ __forceinline__ int2 key_blocks(const Args& a, int b, int q0, int br, int bc) {
  int lo = a.causal && a.window > 0 ? max(0, q0 - a.window + 1) / bc : 0;
  if constexpr (kDocs) lo = max(lo, doc_start_of(a, b, q0) / bc);
  const int hi = a.causal ? min(q0 + br - 1, a.T - 1) / bc : (a.T - 1) / bc;
  return make_int2(lo, hi);
}

// Query blocks [lo, hi] of width br that keys [k0, k0 + bc) of row b are seen by. With documents
// (kDocs) no query at or past the last key's document end sees any of them. (Both ranges describe
// the same (query block, key block) pairs: the Hopper backward's dQ bookkeeping relies on it.)
template <bool kDocs>
__device__ __forceinline__ int2 query_blocks(const Args& a, int b, int k0, int bc, int br) {
  const int lo = a.causal ? k0 / br : 0;
  int hi = a.causal && a.window > 0 ? min(a.T - 1, k0 + bc - 2 + a.window) / br : (a.T - 1) / br;
  if constexpr (kDocs) hi = min(hi, (doc_end_of(a, b, k0 + bc - 1) - 1) / br);
  return make_int2(lo, hi);
}

// Whether some (query, key) pair of the tile is masked (the key tail s >= T is checked separately).
// Documents mask a pair of a causal tile with last query q1 and first key k0 iff start[q1] > k0,
// equivalently end[k0] <= q1; kernels load that bound once and test it beside this.
__device__ __forceinline__ bool tile_needs_mask(const Args& a, int q0, int br, int k0, int bc) {
  return a.causal && (k0 + bc - 1 > q0 || (a.window > 0 && k0 <= q0 + br - 1 - a.window));
}

// Whether some query of [t0, t0 + 16) may see some key of [s0, s0 + 16): a warp's 16 rows against
// one 16-wide mma group. Warps skip the matmuls of groups outside the causal/window band (their
// scores are masked to P = 0 anyway), so a small window costs about (window + 16) keys per query
// row instead of whole tiles, and the diagonal tiles of causal attention cost half. With documents
// the kernels also skip a group whose last key precedes start[t0] (rows are queries) or whose
// first query is at or past end[s0 + 15] (rows are keys): conservative tests, and a group they
// reject lies in a tile that documents mask, so the element mask runs there.
__device__ __forceinline__ bool group_visible(const Args& a, int t0, int s0) {
  if (!a.causal) return true;
  if (s0 > t0 + 15) return false;
  return a.window <= 0 || t0 - (s0 + 15) < a.window;
}

// A warp's group_visible over a tile's groups of 16 as bits (bit np: group np), for the mma.sync
// kernels that skip groups (kBand; the others take ~0u without calling it: called there too, the
// inlined call rescheduled the D = 96 and 112 forward instances); kDocs tests the documents too.
// Rows are queries [t0, t0 + 16), the groups keys from k0: a group that ends before the first
// row's document starts is out (doc_start: the start of the document of the thread's first row,
// read from lane 0).
template <int kGroups, bool kDocs>
__device__ __forceinline__ unsigned key_groups_visible(const Args& a, int t0, int k0, int doc_start) {
  unsigned vis = 0;
#pragma unroll
  for (int np = 0; np < kGroups; ++np) vis |= unsigned{group_visible(a, t0, k0 + np * 16)} << np;
  if constexpr (kDocs) {
    const int doc_first = __shfl_sync(0xffffffffu, doc_start, 0);
#pragma unroll
    for (int np = 0; np < kGroups; ++np)
      if (k0 + np * 16 + 15 < doc_first) vis &= ~(1u << np);
  }
  return vis;
}
// The same with rows that are keys [s0, s0 + 16) and groups that are queries from q0: a group that
// starts at or past the end of the last key's document is out (doc_end: the end of the document of
// the thread's second row, read from lane 28).
template <int kGroups, bool kDocs>
__device__ __forceinline__ unsigned query_groups_visible(const Args& a, int q0, int s0, int doc_end) {
  unsigned vis = 0;
#pragma unroll
  for (int np = 0; np < kGroups; ++np) vis |= unsigned{group_visible(a, q0 + np * 16, s0)} << np;
  if constexpr (kDocs) {
    const int doc_last = __shfl_sync(0xffffffffu, doc_end, 28);
#pragma unroll
    for (int np = 0; np < kGroups; ++np)
      if (q0 + np * 16 >= doc_last) vis &= ~(1u << np);
  }
  return vis;
}

__device__ __forceinline__ bool allowed(const Args& a, int t, int s) {
  // s <= t && s > t - window as one unsigned compare, and no short circuit: the element masks run
  // this per score, and branches there showed up in the Hopper backward's profile.
  const unsigned band = a.window > 0 ? static_cast<unsigned>(a.window) : 0x80000000u;
  return !a.causal | (static_cast<unsigned>(t - s) < band);
}

using cuda::fast_exp2;

// ---- tensor-core primitives: the sm_80 toolkit's (common/mma_sm80.cuh) --------------------

using cuda::pack_bf16;
using sm80::cp_async16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldsm_x4;
using sm80::ldsm_x4_trans;
using sm80::mma_bf16;
using sm80::smem_u32;

// The accumulators of two adjacent 16x8 C tiles are, rounded to bf16, the A fragment of the
// 16x16 block they span: P and dS feed the next matmul straight from registers.
__device__ __forceinline__ void c_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// ---- [rows, D] bf16 tiles in shared memory --------------------------------------------------

// Calls fn(std::integral_constant<int, D>{}) for a head dim D that attention_gpu_head_dim_ok() accepts.
template <class Fn>
void with_head_dim(int D, Fn&& fn) {
  switch (D) {
    case 64: return fn(std::integral_constant<int, 64>{});
    case 80: return fn(std::integral_constant<int, 80>{});
    case 96: return fn(std::integral_constant<int, 96>{});
    case 112: return fn(std::integral_constant<int, 112>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    default: LINAC_CHECK(false, "attention (GPU): no kernel for head dim " + std::to_string(D));
  }
}

// Whether rows of D bf16 are XOR-swizzled (a multiple of eight chunks) rather than padded.
template <int D>
constexpr bool kSwizzled = (D / 8) % 8 == 0;

// Bytes from one tile row to the next.
template <int D>
constexpr int kRowBytes = kSwizzled<D> ? D * 2 : D * 2 + 16;

template <int D>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  if constexpr (kSwizzled<D>)
    return static_cast<uint32_t>(row * kRowBytes<D> + ((chunk ^ (row & 7)) << 4));
  else
    return static_cast<uint32_t>(row * kRowBytes<D> + (chunk << 4));
}

// All NT threads copy rows [0, ROWS) of a tile whose row r starts at src + r * stride; rows at
// or past `valid` are zero-filled, so they contribute nothing to any product.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16_t* src, int64_t stride, int valid) {
  constexpr int kChunks = D / 8, kTotal = ROWS * kChunks, kRounds = (kTotal + NT - 1) / NT;
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const int idx = i * NT + static_cast<int>(threadIdx.x), r = idx / kChunks, c = idx % kChunks;
    if (kTotal % NT != 0 && idx >= kTotal) break;
    const bool ok = r < valid;
    cp_async16(dst + swz<D>(r, c), src + (ok ? r * stride + c * 8 : 0), ok);
  }
}

// Row 0 of head h of sequence b of a [B,T,H,D] tensor with (batch, token) strides s.
template <int D>
__device__ __forceinline__ const bf16_t* head_rows(const bf16_t* x, const AttentionLayout::Strides& s, int b, int h) {
  return x + b * s.b + h * D;
}

// Rows [t0, t0 + ROWS) of a head (rows `stride` apart from `head`): load_tile's copies, not
// committed; rows at or past T zero-filled.
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows(uint32_t dst, const bf16_t* head, int64_t stride, int t0, int T) {
  load_tile<ROWS, D, NT>(dst, head + t0 * stride, stride, T - t0);
}

// Key block kb (keys [kb * BC, kb * BC + BC)) of a head's K and V into the tiles sK and sV,
// committed as one cp.async group together with any copies issued before.
template <int BC, int D, int NT>
__device__ __forceinline__ void load_kv_block(const Args& a, uint32_t sK, uint32_t sV, const bf16_t* k_head,
                                              const bf16_t* v_head, int kb) {
  load_rows<BC, D, NT>(sK, k_head, a.k.t, kb * BC, a.T);
  load_rows<BC, D, NT>(sV, v_head, a.v.t, kb * BC, a.T);
  cp_async_commit();
}

// Top of iteration `it` of a loop over blocks [first, last] whose tiles alternate between two
// shared-memory buffers (block `first` already issued into buffer 0): waits until block `it` has
// landed and every warp is done with the other buffer, then starts block it + 1 there with
// load_next(it + 1, buffer). Returns the buffer of block `it`.
template <class LoadNext>
__device__ __forceinline__ int double_buffer_step(int it, int first, int last, LoadNext&& load_next) {
  const int buf = (it - first) & 1;
  if (it > first) {
    cp_async_wait<0>();
    __syncthreads();
  }
  if (it < last) load_next(it + 1, buf ^ 1);
  return buf;
}

// A fragment: rows r0..r0+15 (r0 % 16 == 0), k columns 16kk..16kk+15 of a row-major tile.
template <int D>
__device__ __forceinline__ void lds_a(uint32_t tile, int r0, int kk, uint32_t (&a)[4]) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(tile + swz<D>(r0 + (lane & 15), 2 * kk + (lane >> 4)), a);
}

// The A fragments of rows r0..r0+15 over all D columns: a warp's operand kept in registers.
template <int D>
__device__ __forceinline__ void lds_a_rows(uint32_t tile, int r0, uint32_t (&f)[D / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) lds_a<D>(tile, r0, kk, f[kk]);
}

// B fragments of two n8 tiles from an [n][k] tile (n rows n0..n0+15, k columns 16kk..):
// {b[0], b[1]} for n0..n0+7 and {b[2], b[3]} for n0+8..n0+15.
template <int D>
__device__ __forceinline__ void lds_b_nk(uint32_t tile, int n0, int kk, uint32_t (&b)[4]) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(tile + swz<D>(n0 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)), b);
}

// B fragments of two n8 tiles from a [k][n] tile (k rows 16kk..16kk+15, n columns n0..n0+15),
// transposed on the fly by ldmatrix: same register order as lds_b_nk.
template <int D>
__device__ __forceinline__ void lds_b_kn(uint32_t tile, int kk, int n0, uint32_t (&b)[4]) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_trans(tile + swz<D>(16 * kk + (lane & 15), (n0 >> 3) + (lane >> 4)), b);
}

// acc (the warp's 16 rows x D) += C T: C the warp's 16 x BC f32 accumulators of a score-like
// product (P, dS), rounded to bf16 A fragments, T the [BC, D] tile at `tile`. The k-steps of 16
// columns whose bit in `vis` is clear (no row of the warp sees them) are skipped.
template <int D, int BC>
__device__ __forceinline__ void mma_rows_times_tile(float (&acc)[D / 8][4], const float (&c)[BC / 8][4], uint32_t vis,
                                                    uint32_t tile) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    if (!(vis >> kk & 1u)) continue;
    uint32_t a[4];
    c_to_a(c[2 * kk], c[2 * kk + 1], a);
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t b[4];
      lds_b_kn<D>(tile, kk, dd * 16, b);
      mma_bf16(acc[2 * dd], a, b[0], b[1]);
      mma_bf16(acc[2 * dd + 1], a, b[2], b[3]);
    }
  }
}

// ---- f32 SIMT path (attention_f32.cu) -------------------------------------------------------

void fwd_f32(const Ctx& ctx, const Args& a, int B, int D, const float* q, const float* k, const float* v, float* o,
             float* lse);
void bwd_f32(const Ctx& ctx, const Args& a, int B, int D, const float* q, const float* k, const float* v,
             const float* lse, const float* delta, const float* dout, float* dq, float* dk, float* dv);

// ---- Hopper path (attention_fwd_sm90.cu, attention_bwd_sm90.cu: wgmma + TMA, sm_90a) ----------

inline bool use_sm90(const AttentionLayout& L) { return std::string_view(attention_gpu_kernels(L.D)) == "sm90"; }
void fwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& o, const Tensor& lse);
// rope_cs (D = 64 only; nullptr: none): rope_table_cuda of positions 0 .. T-1; dq and dk are
// rotated back by -angle as they are written (position t - start[b,t] with documents).
void bwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
              const Tensor& v, const float* lse, const float* delta, const Tensor& dout, const Tensor& dq,
              const Tensor& dk, const Tensor& dv, const float* rope_cs);

}  // namespace linac::attn
