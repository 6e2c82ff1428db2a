// Shared by the Latte CUDA kernels (math in latte.h): the kernel argument block, the chunk
// length, the workspace carve, the chunk loads into shared memory and the chunk's factor tiles.
//
// The GPU runs the chunked form with C = 64. Per (sequence, head) it keeps f32 per-chunk arrays in
// ctx.workspace, [B*H, N, L, Wd] with Wd = Dv + 1 (the extra column carries the backward's scalar
// state r) rounded up to 4: the chunk terms U and the chunk states S; plus the lse carries
// [B*H, N, L] and the backward's gP [B*H, T, Lg] (La rounded up to 4). A CTA per (chunk, sequence*head) does the chunk's products on tensor
// cores with GLA's warp_mma (bf16 operands, f32 accumulators; exact f32 fmas for f32 tensors) over
// shared-memory tiles of the activation dtype: 64 token rows (or Lp latent rows), columns padded
// with zeros to Lp = L and Dp = Dv rounded up to 16. Statistics (lse, softmax, the exponents) stay
// f32. Every sum runs in a fixed order (deterministic, no atomics).
//
// Factorised products (docs/latte.md §3.2, §8.2): with ref_l = lse_{f,l} (the chunk's first row),
//   exp(b_{s,l} - lse_{t,l}) = exp(ref_l - lse_{t,l}) * exp(b_{s,l} - ref_l) = Qe_{t,l} * Kt_{s,l},
// both factors within exp(+-g) where g = max_l lse_{e,l} - lse_{f,l} is the chunk's lse growth. A
// chunk with g > kMaxGrowth forms those products directly in f32 instead (every exponent <= 0), so
// no logit range overflows.
//
// Documents (Args::ds, latte.h): a chunk kernel reads its rows' document starts into shared memory
// as offsets sd[t] = start[b, f+t] - f clamped to -1 (ChunkDocs): row t takes the carried state iff
// sd[t] < 0, its first in-chunk row is max(sd[t], 0) and the factorised products take ref = lse at
// that row (so g is the largest growth of one document's lse inside the chunk); products of two
// documents are masked to zero after forming them (finite: Qt <= 1, Kt <= exp(g)). The chunk
// decays that carry states between chunks are 0 where the chunk's last row's document starts
// inside the chunk, which stops the forward and the reverse state scans at documents alike.
// Without documents every row reads as carried and first row 0: the stream arithmetic.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "common/cuda_common.cuh"
#include "common/mma_sm80.cuh"
#include "latte/latte.h"

namespace linac::latte_cuda {

using sm80::Frag;
using sm80::ld_of;
using sm80::warp_mma;

constexpr int kC = 64;      // tokens per chunk
constexpr int kMaxL = 64;   // latents per head
constexpr int kMaxDv = 128; // value width
constexpr int kThreads = 256;      // threads of every per-chunk kernel
constexpr float kMaxGrowth = 60.f; // lse growth inside a chunk above which products are formed directly

struct Args {
  int T, H, L, La, Dv, N;
  int Wd;      // row length of the f32 chunk states: Dv + 1 (the backward's r) rounded up to kVec
  int Lg;      // row length of the backward's gP: La rounded up to kVec
  int off;     // 1 with a local state (column 0 of a), else 0
  int Lp, Dp;  // L and Dv rounded up to 16: tile widths of the matmul operands
  const int32_t* ds = nullptr;  // document starts [B, T] from the group's first sequence, or null
};

inline Args make_args(const LatteLayout& L) {
  LINAC_CHECK(L.L <= kMaxL, "latte (GPU): at most 64 latents per head, got " + std::to_string(L.L));
  LINAC_CHECK(L.Dv <= kMaxDv && L.Dv % 4 == 0, "latte (GPU): Dv must be a multiple of 4 up to 128, got " +
                                                   std::to_string(L.Dv));
  LINAC_CHECK(L.T < (int64_t{1} << 30), "latte (GPU): T too large");
  // The chunk kernels index within a chunk in 32 bits: kC token strides must fit.
  for (const LatteLayout::Strides* s : {&L.a, &L.b, &L.v, &L.local_s, &L.y, &L.dy, &L.da, &L.db, &L.dv, &L.dlocal})
    LINAC_CHECK(s->t >= 0 && s->t * kC < (int64_t{1} << 31), "latte (GPU): token stride too large");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.L = static_cast<int>(L.L);
  a.La = static_cast<int>(L.La()), a.Dv = static_cast<int>(L.Dv), a.Wd = static_cast<int>(latte_state_row(L.Dv));
  a.Lg = (a.La + 3) / 4 * 4;
  a.N = (a.T + kC - 1) / kC, a.off = L.local ? 1 : 0;
  a.Lp = (a.L + 15) / 16 * 16, a.Dp = (a.Dv + 15) / 16 * 16;
  return a;
}

struct Workspace {
  float* U;      // [B*H, N, L, Wd] chunk terms
  float* S;      // [B*H, N, L, Wd] chunk states
  float* carry;  // [B*H, N, L] lse carries (forward), then each chunk's decay exp(lse_{f-1} - lse_e)
  float* gP;     // [B*H, T, Lg] (backward)
};

// Sequences per group that fit in ctx.workspace.
inline int group_size(const Ctx& ctx, const LatteLayout& L) {
  const size_t per = latte_workspace_bytes_per_seq(L.T, L.H, L.L, L.Dv, DType::F32);
  if (per > ctx.workspace_bytes)
    throw UserError("latte: one sequence of " + std::to_string(L.T) + " tokens needs " +
                    std::to_string((per >> 20) + 1) + " MiB of GPU workspace, more than the " +
                    std::to_string(ctx.workspace_bytes >> 20) + " MiB there are; set LINAC_WORKSPACE_MB");
  return static_cast<int>(std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per)));
}

inline Workspace carve(const Ctx& ctx, const Args& a, int B) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t bh = static_cast<size_t>(B) * a.H;
  const size_t st = align(bh * a.N * a.L * a.Wd * 4), cr = align(bh * a.N * a.L * 4), gp = align(bh * a.T * a.Lg * 4);
  LINAC_CHECK(2 * st + cr + gp <= ctx.workspace_bytes, "latte (GPU): workspace carve overflow");
  char* p = static_cast<char*>(ctx.workspace);
  return {reinterpret_cast<float*>(p), reinterpret_cast<float*>(p + st), reinterpret_cast<float*>(p + 2 * st),
          reinterpret_cast<float*>(p + 2 * st + cr)};
}

// With LatteLayout::saved_states, the group's (sequences from b0) chunk states and decays live
// there instead of in the workspace: the forward leaves them for the backward.
inline void use_saved_states(Workspace& w, const LatteLayout& L, const Args& a, int64_t b0) {
  if (!L.saved_states) return;
  const int64_t per_seq = int64_t{a.H} * a.N * a.L;  // chunk decays of one sequence
  w.S = L.saved_states + b0 * per_seq * a.Wd;
  w.carry = L.saved_states + L.B * per_seq * a.Wd + b0 * per_seq;
}

template <class P>
P* at_batch(P* p, int64_t b0, int64_t stride) {
  return p + b0 * stride;
}

// The Args of the group of sequences from b0: its document starts.
inline Args group_args(const Args& a, const LatteLayout& L, int64_t b0) {
  Args g = a;
  g.ds = L.docs.defined() ? L.docs.start + b0 * L.T : nullptr;
  return g;
}

// A chunk's rows' documents (see the top): sd in shared memory. The kernels are compiled apart
// for kDocs false (the stream form: every row carried, first row 0, no test in any loop) and true.
template <bool kDocs>
struct ChunkDocs {
  const int* sd;
  // The first row of t's document within the chunk.
  __device__ __forceinline__ int first(int t) const {
    if constexpr (kDocs) return max(sd[t], 0);
    return 0;
  }
  // Whether row t's document began before the chunk (so the carried state reaches it; the caller
  // still checks n > 0).
  __device__ __forceinline__ bool carried(int t) const {
    if constexpr (kDocs) return sd[t] < 0;
    return true;
  }
};

// Shared ints a kernel's ChunkDocs takes (none without documents).
__host__ __device__ inline int doc_ints(const Args& a) { return a.ds ? kC : 0; }

// Fills sd[0..kC) for rows f..f+rows-1 of sequence b (0 past rows); the caller syncs before use.
template <bool kDocs>
__device__ __forceinline__ ChunkDocs<kDocs> load_docs(const Args& a, int b, int f, int rows, int* sd) {
  if constexpr (kDocs) {
    const int32_t* st = a.ds + static_cast<int64_t>(b) * a.T + f;
    for (int t = threadIdx.x; t < kC; t += blockDim.x) sd[t] = t < rows ? max(st[t] - f, -1) : 0;
  }
  return {sd};
}

// fn(std::integral_constant<bool, a.ds != nullptr>{}): the launchers' choice of kernel instance.
template <class Fn>
void with_docs(const Args& a, Fn&& fn) {
  if (a.ds)
    fn(std::true_type{});
  else
    fn(std::false_type{});
}

// f(r, c) over a rows x cols block: a row per group of lanes (8, 16 or 32 lanes, the fewest that
// cover cols), columns across the group's lanes, so row loads are coalesced and no thread divides.
template <class F>
__device__ __forceinline__ void for_rows(int rows, int cols, F&& f) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int nwarps = static_cast<int>(blockDim.x) >> 5;
  const int g = cols <= 8 ? 8 : cols <= 16 ? 16 : 32, per = 32 / g;
  for (int r = warp * per + lane / g; r < rows; r += nwarps * per)
    for (int c = lane % g; c < cols; c += g) f(r, c);
}

// kVec consecutive values to D (as f32) in one aligned store.
constexpr int kVec = 4;
__device__ __forceinline__ void store_vec(float* p, const float (&x)[kVec]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store_vec(__nv_bfloat16* p, const float (&x)[kVec]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]), hi = __floats2bfloat162_rn(x[2], x[3]);
  *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

// Whether rows at p + r * ld can be read kVec elements at a time (the rows' alignment).
template <class T>
__device__ __forceinline__ bool vec_rows(const T* p, int64_t ld) {
  return ld % kVec == 0 && reinterpret_cast<uintptr_t>(p) % (kVec * sizeof(T)) == 0;
}

// kVec consecutive elements of T as raw bits (bf16: two per word), converted to f32 when read.
template <class T>
struct Slot {
  static constexpr int kWords = kVec * static_cast<int>(sizeof(T)) / 4;
  using Vec = std::conditional_t<kWords == 2, uint2, uint4>;
  uint32_t w[kWords];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void load(const T* p) { *reinterpret_cast<Vec*>(w) = *reinterpret_cast<const Vec*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *reinterpret_cast<const Vec*>(w); }
  // element e from p (or 0 when p is null)
  __device__ __forceinline__ void load_one(int e, const T* p) {
    if constexpr (kWords == 2) {
      const uint32_t u = p ? *reinterpret_cast<const unsigned short*>(p) : 0u;
      w[e >> 1] = e & 1 ? w[e >> 1] | (u << 16) : u;
    } else {
      w[e] = p ? __float_as_uint(*p) : 0u;
    }
  }
  __device__ __forceinline__ float at(int e) const {
    if constexpr (kWords == 2) return __uint_as_float(e & 1 ? w[e >> 1] & 0xffff0000u : w[e >> 1] << 16);
    else return __uint_as_float(w[e]);
  }
};

// A rows x cols block (at most kMaxRows x kMaxCols) of a row-major source of T in the registers of
// a CTA of kThreads, in slots of kVec consecutive columns: G lanes per row (the fewest of 8, 16, 32
// that cover kMaxCols), so a warp holds 32 / G rows at a time. The chunk kernels are
// latency-bound: the constructor issues every load of a thread (predicated, no branches, nothing
// converted) before a store writes any, so a tile costs one memory round trip; a slot is one
// vector load where the rows are aligned (element loads where they are not). The kernels store
// each batch before making the next: several in flight at once took 107-135 registers and
// measured slower (kernels/latte/NOTES.md).
template <class T, int kMaxRows, int kMaxCols>
struct RowBatch {
  static constexpr int kSlots = (kMaxCols + kVec - 1) / kVec;
  static constexpr int G = kSlots > 16 ? 32 : kSlots > 8 ? 16 : 8, kRP = 32 / G, kWarps = kThreads / 32;
  static constexpr int kRW = (kMaxRows + kWarps * kRP - 1) / (kWarps * kRP), kCL = (kSlots + G - 1) / G;
  Slot<T> v[kRW][kCL];
  int rows, cols;
  // The block is rows x cols: the source's rows r < drows at base + r * ld (r * ld < 2^31, checked
  // on the host: make_args), its X columns, zeros elsewhere.
  __device__ __forceinline__ RowBatch(int rows_, int cols_, const T* base, int64_t ld64, int drows, int X)
      : rows(rows_), cols(cols_) {
    const int ld = static_cast<int>(ld64);
    if (vec_rows(base, ld64) && X % kVec == 0) {
      each([&](Slot<T>& x, int r, int c, bool) {
        x.zero();
        if (r < drows && c < X) x.load(base + r * ld + c);
      });
    } else {
      each([&](Slot<T>& x, int r, int c, bool) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) x.load_one(e, r < drows && c + e < X ? base + r * ld + c + e : nullptr);
      });
    }
  }
  // st(r, c, value) for every value of the block.
  template <class St>
  __device__ __forceinline__ void store(St&& st) {
    each([&](Slot<T>& x, int r, int c, bool in) {
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (in && c + e < cols) st(r, c + e, x.at(e));
    });
  }
  // dst[r * ld + c] = value as D: a vector store per whole slot when ld allows (dst 16-byte aligned).
  template <class D>
  __device__ __forceinline__ void store_rows(D* dst, int ld) {
    const bool vec = ld % kVec == 0;
    each([&](Slot<T>& x, int r, int c, bool in) {
      if (!in) return;
      D* p = dst + r * ld + c;
      if (vec && c + kVec <= cols) {
        if constexpr (std::is_same_v<D, T>) {
          x.store(p);
        } else {
          float f[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) f[e] = x.at(e);
          store_vec(p, f);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (c + e < cols) p[e] = cuda::from_float<D>(x.at(e));
      }
    });
  }
  // f(slot, row, first column, inside the block) for each of the thread's slots, in a fixed unrolled order.
  template <class F>
  __device__ __forceinline__ void each(F&& f) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
    for (int k = 0; k < kRW; ++k)
#pragma unroll
      for (int j = 0; j < kCL; ++j) {
        const int r = (warp + kWarps * k) * kRP + lane / G, c = kVec * (lane % G + G * j);
        f(v[k][j], r, c, r < rows && c < cols);
      }
  }
};

// A batch of rows f..f+rows-1 of head h of sequence b, X columns (free token stride); with
// width > X (tiles), the block is kC x width with zeros past `rows` and X.
template <int kMaxCols, class T>
__device__ __forceinline__ RowBatch<T, kC, kMaxCols> rows_of(const T* src, LatteLayout::Strides s, int b, int h,
                                                             int f, int rows, int X, int width = 0) {
  return RowBatch<T, kC, kMaxCols>(width ? kC : rows, width ? width : X,
                                   src + b * s.b + static_cast<int64_t>(f) * s.t + static_cast<int64_t>(h) * X, s.t,
                                   rows, X);
}

// Row f of (b, h) in lse (contiguous [B, T, H, L]): the next row is H L further.
template <class F>
__device__ __forceinline__ F* lse_row(F* lse, const Args& a, int b, int h, int f) {
  return lse + ((static_cast<int64_t>(b) * a.T + f) * a.H + h) * a.L;
}
// lse rows f..f+rows-1 of (b, h).
__device__ __forceinline__ RowBatch<float, kC, kMaxL> lse_rows_of(const float* lse, const Args& a, int b, int h, int f,
                                                                  int rows) {
  return RowBatch<float, kC, kMaxL>(rows, a.L, lse_row(lse, a, b, h, f), a.H * a.L, rows, a.L);
}

// The chunk's rows of a per-latent array (lse, b, a, gP: L or La <= kMaxCols columns X, rows at
// base + r * ld) into the tile dst [rows][X] (f32, or the source's dtype), through a batch of 8 lanes a row when X <=
// kNarrow (X is known at run time only): the kMaxL-wide batch gives a row 16 or 32 lanes, most of
// them idle at L = 16, and each thread 2-4 times the loads to issue.
constexpr int kNarrow = 32;
template <int kMaxCols, class T, class D>
__device__ __forceinline__ void store_latent_rows(int rows, int X, const T* base, int64_t ld, D* dst) {
  if (X <= kNarrow)
    RowBatch<T, kC, kNarrow>(rows, X, base, ld, rows, X).store_rows(dst, X);
  else
    RowBatch<T, kC, kMaxCols>(rows, X, base, ld, rows, X).store_rows(dst, X);
}
// ... of head h of sequence b from rows_of's source,
template <int kMaxCols, class T, class D>
__device__ __forceinline__ void store_head_rows(const T* src, LatteLayout::Strides s, int b, int h, int f, int rows,
                                                int X, D* dst) {
  store_latent_rows<kMaxCols>(rows, X, src + b * s.b + static_cast<int64_t>(f) * s.t + static_cast<int64_t>(h) * X,
                              s.t, dst);
}
// ... and of lse_rows_of's.
__device__ __forceinline__ void store_lse_rows(const float* lse, const Args& a, int b, int h, int f, int rows,
                                               float* dst) {
  store_latent_rows<kMaxL>(rows, a.L, lse_row(lse, a, b, h, f), a.H * a.L, dst);
}

// Rows of a tile through groups of kRowLanes lanes, a row per group: f(row, the lane's first
// column g, columns) with columns g, g + kRowLanes, ... < columns its share. Every lane of a warp
// makes the same calls (f's butterfly reductions need all of them): rows past `rows` get 0 columns.
// A warp per row left 15 of its lanes idle at La = 17 and ran its ten shuffles once per row; ncu
// put the softmax and da loops at a sixth to a third of the backward kernels' issue slots
// (kernels/latte/NOTES.md).
constexpr int kRowLanes = 8;
template <class F>
__device__ __forceinline__ void for_row_groups(int rows, int cols, F&& f) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int per_warp = 32 / kRowLanes, step = (static_cast<int>(blockDim.x) >> 5) * per_warp;
  for (int r0 = warp * per_warp; r0 < rows; r0 += step) {  // uniform over the warp
    const int r = r0 + lane / kRowLanes;
    f(r, lane % kRowLanes, r < rows ? cols : 0);
  }
}

// pi[rows][La] = softmax of each row of logits[rows][La], in place (La <= kMaxL + 1: at most 9
// columns a lane), fixed-order butterfly reductions.
__device__ __forceinline__ void softmax_rows(float* pi, int rows, int La) {
  for_row_groups(rows, La, [&](int r, int g, int cols) {
    float* p = pi + r * La;
    float m = -INFINITY;
    for (int j = g; j < cols; j += kRowLanes) m = fmaxf(m, p[j]);
    m = cuda::lanes_max<kRowLanes>(m);
    float sum = 0.f;
    for (int j = g; j < cols; j += kRowLanes) sum += p[j] = expf(p[j] - m);
    const float inv = 1.f / cuda::lanes_sum<kRowLanes>(sum);
    for (int j = g; j < cols; j += kRowLanes) p[j] *= inv;
  });
}

// -inf-safe log(exp(x) + exp(y)) (docs/latte.md §8.3).
__device__ __forceinline__ float logaddexpf(float x, float y) {
  const float m = fmaxf(x, y);
  if (m == -INFINITY) return m;
  return m + logf(expf(x - m) + expf(y - m));
}

// Bump allocator over a kernel's dynamic shared memory, 16-byte aligned pieces (ldmatrix rows).
// The host runs the same carve on a null base to size the launch.
struct SmemCarve {
  unsigned char* base;
  size_t bytes = 0;
  template <class X>
  __host__ __device__ X* take(size_t n) {
    X* p = reinterpret_cast<X*>(base + bytes);
    bytes += (n * sizeof(X) + 15) / 16 * 16;
    return p;
  }
};

// x (f32) as the sum of `parts` values of T stored `stride` elements apart: each part is what the
// previous ones leave over, so 3 bf16 parts hold an f32 exactly and 2 leave a relative 2^-17; f32
// tensors take one part. Products of an exact bf16 operand with a split one, summed over the
// parts in f32, keep the split operand's precision on tensor cores.
template <class T>
__host__ __device__ constexpr int parts_of(int bf16_parts) {
  return sizeof(T) == 2 ? bf16_parts : 1;
}
template <class T>
__device__ __forceinline__ void store_parts(T* p, size_t stride, int parts, float x) {
  for (int k = 0; k < parts; ++k) {
    const T h = cuda::from_float<T>(x);
    p[k * stride] = h;
    x -= cuda::to_float(h);
  }
}

// A chunk state [L][Wd] (f32, its first Dv columns) as a zero-padded Lp x Dp batch.
using StateBatch = RowBatch<float, kMaxL, kMaxDv>;
__device__ __forceinline__ StateBatch state_of(const float* S, const Args& a) {
  return StateBatch(a.Lp, a.Dp, S, a.Wd, a.L, a.Dv);
}
// ... stored into `parts` tiles [Lp][ld] (store_parts, a vector store per slot and part).
template <class D>
__device__ __forceinline__ void store_state(StateBatch&& x, D* dst, int ld, const Args& a, int parts) {
  x.each([&](Slot<float>& s, int l, int j, bool in) {
    if (!in) return;
    float v[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = s.at(e);
    for (int k = 0; k < parts; ++k) {
      float h[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) h[e] = cuda::rounded<D>(v[e]), v[e] -= h[e];
      store_vec(dst + static_cast<size_t>(k) * a.Lp * ld + l * ld + j, h);
    }
  });
}

// The warps of the CTA take the 16 x (8 NT) tiles of an M x N output in turn (M, N multiples of
// 16): f(m0, n0, valid n-tiles of 8).
template <int NT, class F>
__device__ __forceinline__ void for_tiles(int M, int N, F&& f) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, nwarps = static_cast<int>(blockDim.x) >> 5;
  const int tn = (N + 8 * NT - 1) / (8 * NT);
  for (int i = warp; i < (M / 16) * tn; i += nwarps) {
    const int m0 = 16 * (i / tn), n0 = 8 * NT * (i % tn);
    f(m0, n0, min(NT, (N - n0) / 8));
  }
}

// g(row, col, value) for every accumulator element of a warp's 16 x (8 NT) tile at (m0, n0).
template <int NT, class G>
__device__ __forceinline__ void each_acc(const float (&acc)[NT][4], int m0, int n0, int ntv, G&& g) {
  const Frag fr;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    if (nt < ntv)
#pragma unroll
      for (int e = 0; e < 4; ++e) g(fr.row(m0, e), fr.col(n0, nt, e), acc[nt][e]);
}

// g(row, col, x, y) over the elements of two accumulators of the same tile.
template <int NT, class G>
__device__ __forceinline__ void each_acc2(const float (&x)[NT][4], const float (&y)[NT][4], int m0, int n0, int ntv,
                                          G&& g) {
  const Frag fr;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    if (nt < ntv)
#pragma unroll
      for (int e = 0; e < 4; ++e) g(fr.row(m0, e), fr.col(n0, nt, e), x[nt][e], y[nt][e]);
}

// g(row, col, x, x') for the accumulator pairs (col, col + 1) of a warp's tile (col even).
template <int NT, class G>
__device__ __forceinline__ void each_acc_pair(const float (&acc)[NT][4], int m0, int n0, int ntv, G&& g) {
  const Frag fr;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    if (nt < ntv)
#pragma unroll
      for (int e = 0; e < 4; e += 2) g(fr.row(m0, e), fr.col(n0, nt, e), acc[nt][e], acc[nt][e + 1]);
}

// Whether pairs p[r * ld + 2i], p[r * ld + 2i + 1] can be stored as one.
template <class T>
__host__ __device__ bool vec_pairs(const T* p, int64_t ld) {
  return ld % 2 == 0 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
}
// p[0] = x, p[1] = y (if two): one store when vec.
template <class T>
__device__ __forceinline__ void store_pair(T* p, float x, float y, bool vec, bool two = true) {
  if (vec && two) {
    sm80::store2(p, x, y);
    return;
  }
  p[0] = cuda::from_float<T>(x);
  if (two) p[1] = cuda::from_float<T>(y);
}

// The chunk's factor tiles [64][ld] (ld = ld_of<T>(Lp)): Qt_{t,l} = pi_{t,l} exp(ref_{t,l} - lse_{t,l})
// (when Qt is not null) and Kt_{s,l} = exp(b_{s,l} - ref_{s,l}), zero past `rows` and L; ref_t is the
// lse at t's first row in the chunk (row 0 without documents). lam, bq: the chunk's lse and b rows
// [64][L], pi [64][La] (softmaxed), f32 (bq also as b's own dtype: its values exactly). Returns,
// the same on every thread of the CTA, whether some document's lse grows by more than kMaxGrowth
// in the chunk: then the tiles are not written and the caller forms the products directly.
template <class T, bool kDocs, class TB>
__device__ bool factor_tiles(const Args& a, int rows, const float* lam, const TB* bq, const float* pi,
                             const ChunkDocs<kDocs>& dc, T* Qt, T* Kt) {
  bool big = false;
  if constexpr (!kDocs) {  // lse is non-decreasing: the last row grows most
    for (int l = threadIdx.x; l < a.L; l += blockDim.x) big |= lam[(rows - 1) * a.L + l] - lam[l] > kMaxGrowth;
  } else {
    for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
      const int t = i / a.L, l = i % a.L;
      big |= lam[i] - lam[dc.first(t) * a.L + l] > kMaxGrowth;
    }
  }
  if (__syncthreads_or(big)) return true;
  const int ld = ld_of<T>(a.Lp);
  for_rows(kC, a.Lp, [&](int t, int l) {
    const bool ok = t < rows && l < a.L;
    const float ref = ok ? lam[dc.first(t) * a.L + l] : 0.f;
    if (Qt) Qt[t * ld + l] = cuda::from_float<T>(ok ? pi[t * a.La + a.off + l] * expf(ref - lam[t * a.L + l]) : 0.f);
    Kt[t * ld + l] = cuda::from_float<T>(ok ? expf(cuda::to_float(bq[t * a.L + l]) - ref) : 0.f);
  });
  return false;
}

// A_{t,s} = sum_l pi_{t,l} exp(b_{s,l} - lse_{t,l}) for first(t) <= s <= t < rows, else 0, into
// At[64][ld_of<T>(64)]: Qt Kt^T on tensor cores, or (direct) with exact f32 exponents (bq as in
// factor_tiles). Call after a barrier that follows factor_tiles; the caller syncs before reading At.
template <class T, bool kDocs, class TB>
__device__ void form_A(const Args& a, int rows, bool direct, const T* Qt, const T* Kt, const float* lam, const TB* bq,
                       const float* pi, const ChunkDocs<kDocs>& dc, T* At) {
  const int ld = ld_of<T>(kC), ldl = ld_of<T>(a.Lp);
  if (direct) {
    for_rows(kC, kC, [&](int t, int s) {
      float acc = 0.f;
      if (s <= t && t < rows && s >= dc.first(t))
        for (int l = 0; l < a.L; ++l)
          acc = fmaf(pi[t * a.La + a.off + l], expf(cuda::to_float(bq[s * a.L + l]) - lam[t * a.L + l]), acc);
      At[t * ld + s] = cuda::from_float<T>(acc);
    });
    return;
  }
  for_tiles<2>(kC, kC, [&](int m0, int n0, int ntv) {
    float acc[2][4] = {};
    if (n0 <= m0) warp_mma<T, false, false, 2>(acc, Qt, ldl, m0, 0, Kt, ldl, 0, n0, a.Lp / 16, ntv);
    each_acc(acc, m0, n0, ntv, [&](int t, int s, float x) {
      At[t * ld + s] = cuda::from_float<T>(s <= t && s >= dc.first(t) ? x : 0.f);
    });
  });
}

// Launchers of latte_scan.cu (B = sequences in the group; pointers at the group's first one).
// lse of b: chunk-local logcumsumexp, carries across chunks, then (with the chunk terms) the final lse.
template <class T>
void launch_lse_scan(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, float* lse,
                     float* carry);
// U[n][l][0..Dv) = sum_{s in n} exp(b_s - lse_e) v_s (lse_e: the chunk's last row), and each
// chunk's decay exp(lse_{f-1} - lse_e) (0 for chunk 0) into carry [B*H, N, L]. With finalise
// (forward), first turns the chunk's local lse into the final one, logaddexp(carry, local lse).
template <class T>
void launch_chunk_terms(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, const T* v,
                        LatteLayout::Strides vs, float* lse, bool finalise, float* carry, float* U);
// Forward (reverse = false): S[n] = mu at the start of chunk n, mu = decay[n] mu + U[n] over `width`
// columns, mu after the last chunk to mu_final (may be null).
// Reverse: S[n] = state at the end of chunk n, R = decay[n] R + U[n] going down.
void launch_state_scan(const Ctx& ctx, const Args& a, int B, bool reverse, int width, const float* decay,
                       const float* U, float* S, float* mu_final);

}  // namespace linac::latte_cuda
