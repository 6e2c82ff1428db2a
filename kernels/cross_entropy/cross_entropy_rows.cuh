// The register-row cross-entropy (math in cross_entropy.h), shared by the kernel that reads each
// row from global memory (cross_entropy.cu) and the Hopper one that streams rows into shared
// memory ahead of the math (cross_entropy_sm90.cu). A block holds a row of up to
// 4 * G * kMaxThreads logits in registers (G groups of four per thread: kRowGroups, or for bf16
// rows on Hopper kLongRowGroups), thread i the groups of four at 4i + g * 4 * blockDim.x. Each
// thread takes its own max mt and s = sum exp(x - mt); the block merges (mt, s) with a max and a
// sum, and the gradient is exp(x - mt) * exp(mt - mx) / sum: one read of the row, one write.
#pragma once

#include <algorithm>
#include <cfloat>

#include "common/cuda_common.cuh"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac::xent {

constexpr int kMaxThreads = 512;
constexpr int kRowGroups = 16;  // register rows (F32Row): groups of four logits per thread, at most
// Hopper's streamed bf16 rows up to 51,200 logits (the 50,264 and 50,272 vocabularies; Bf16Row):
// 50 registers of row per thread, one block of 512 threads per SM.
constexpr int kLongRowGroups = 25;

// An ignored row (target < 0): zero gradient, zero loss, no hit.
template <bool kVec, class TD>
__device__ __forceinline__ void ignored_row(TD* dx, int64_t v, float* losses, float* hits, int64_t r) {
  if constexpr (kVec) {
    for (int64_t j = 4 * threadIdx.x; j < v; j += 4 * blockDim.x) cuda::store4(dx + j, make_float4(0, 0, 0, 0));
  } else {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dx[j] = cuda::from_float<TD>(0.f);
  }
  if (threadIdx.x == 0) {
    losses[r] = 0.f;
    if (hits) hits[r] = 0.f;
  }
}

// Writes the row's hit from each thread's flag: whether one of its elements before the target
// reaches the row max.
__device__ __forceinline__ void write_hit(float* hits, int64_t r, float xt, float mx, float earlier_max,
                                          float* scratch) {
  const float any_earlier = cuda::block_max(earlier_max, scratch);
  if (threadIdx.x == 0) hits[r] = xt >= mx && any_earlier == 0.f ? 1.f : 0.f;
}

// A thread's columns of a row: groups of four at col(g) = first + g * step(), those with
// g < groups inside the row (in-row indices fit an int: v <= 4 * kLongRowGroups * kMaxThreads).
// kThreads > 0 fixes the block's size at compile time, so that the stride between groups is an
// immediate and a group's address takes no register of its own (the 25 groups of the bf16 rows
// spilt without it); 0 reads blockDim.x.
template <int kThreads = 0>
struct RowSpan {
  int first, n, groups;
  __device__ explicit RowSpan(int64_t v)
      : first(4 * static_cast<int>(threadIdx.x)),
        n(static_cast<int>(v)),
        groups(n > first ? (n - first + step() - 1) / step() : 0) {}
  __device__ __forceinline__ int step() const { return 4 * (kThreads > 0 ? kThreads : static_cast<int>(blockDim.x)); }
  __device__ __forceinline__ int col(int g) const { return first + g * step(); }
  __device__ __forceinline__ bool has(int g) const { return g < groups; }
};

// exp(x - m) for a row's logits x and a thread's max m as 2^(x log2 e - m log2 e), m log2 e taken
// once per row: one FFMA and one ex2.approx per logit. A thread whose logits are all -inf (or that
// holds none) has m = -FLT_MAX, kept finite in log2 units so that a -inf logit still gives 0.
struct ExpMinus {
  float ml2e;
  __device__ explicit ExpMinus(float m) : ml2e(fmaxf(m, -1e38f) * cuda::kLog2e) {}
  __device__ __forceinline__ float operator()(float x) const { return cuda::fast_exp2(fmaf(x, cuda::kLog2e, -ml2e)); }
  __device__ __forceinline__ float4 operator()(float4 x) const {
    return make_float4((*this)(x.x), (*this)(x.y), (*this)(x.z), (*this)(x.w));
  }
};

// A thread's groups of four of a row, held in registers as f32: each value becomes exp(x - mt)
// as the sum takes it, and the gradient reads it back (one exponential per logit).
template <int G>
struct F32Row {
  float4 e[G];
  template <class TL, class Span>  // global or shared memory
  __device__ __forceinline__ void load(const TL* x, const Span& rs) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.has(g)) e[g] = cuda::load4(x + rs.col(g));
  }
  __device__ __forceinline__ float4 logits(int g) const { return e[g]; }
  // The thread's max, from -FLT_MAX (so that a -inf logit adds exp(-inf) = 0, not NaN).
  template <class Span>
  __device__ __forceinline__ float max(const Span& rs) const {
    float m = -FLT_MAX;
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.has(g)) m = fmaxf(m, fmaxf(fmaxf(e[g].x, e[g].y), fmaxf(e[g].z, e[g].w)));
    return m;
  }
  __device__ __forceinline__ void keep_exp(int g, float4 ex) { e[g] = ex; }
  __device__ __forceinline__ float4 exp_of(int g, const ExpMinus&) const { return e[g]; }
};

// bf16 logits packed two to a register: half the registers of F32Row, so that a row of 51,200
// fits 512 threads (100 values each). The gradient recomputes exp(x - mt): the same values as
// F32Row keeps, so the same bits, for a second exponential per logit.
template <int G>
struct Bf16Row {
  uint2 p[G];
  template <class Span>
  __device__ __forceinline__ void load(const __nv_bfloat16* x, const Span& rs) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.has(g)) p[g] = *reinterpret_cast<const uint2*>(x + rs.col(g));
  }
  static __device__ __forceinline__ __nv_bfloat162 pair(uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); }
  __device__ __forceinline__ float4 logits(int g) const {
    const float2 lo = cuda::unpack_bf16(p[g].x), hi = cuda::unpack_bf16(p[g].y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  // As F32Row's, taken on the packed pairs (a bf16 max is exact), so that no logit is unpacked
  // twice; -inf where the thread holds none, as the pairs start.
  template <class Span>
  __device__ __forceinline__ float max(const Span& rs) const {
    __nv_bfloat162 m = __bfloat162bfloat162(__ushort_as_bfloat16(0xff80));
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.has(g)) m = __hmax2(m, __hmax2(pair(p[g].x), pair(p[g].y)));
    return fmaxf(fmaxf(__low2float(m), __high2float(m)), -FLT_MAX);
  }
  __device__ __forceinline__ void keep_exp(int, float4) {}
  __device__ __forceinline__ float4 exp_of(int g, const ExpMinus& exp_minus) const { return exp_minus(logits(g)); }
};

// Row r with target t >= 0 and its logit xt (thread 0; NaN past the row) once its groups are in
// row (F32Row or Bf16Row of G groups): loss, gradient into dx, and with kHits the hit. Every
// thread of the block calls it (block reductions).
// Per logit the training loss (no hits) issues a max, an FFMA and an exponential, an add, and for
// the gradient a multiply: the max is a tree (Row::max), the target's gradient is fixed in the one
// group that holds it, and no per-logit index arithmetic is left. The hits need the first index
// holding the max, one compare-and-select chain through the thread's logits: only the kHits
// kernel runs it. A max is exact in any order, so both find the same one, and the sum and the
// gradient that follow are the same code: the same bits with and without hits.
template <bool kHits, class TD, int G, template <int> class Row, class Span>
__device__ __forceinline__ void finish_row(Row<G>& row, const Span& rs, int32_t t, float xt, TD* dx, float* losses,
                                           float* hits, int64_t r, float grad_scale, float* scratch) {
  // The thread's max mt, from -FLT_MAX so that a -inf logit adds exp(-inf) = 0, not NaN; with
  // kHits one chain that also keeps the first index holding it.
  float mt = -FLT_MAX;
  int first_max = rs.n;
  if constexpr (kHits) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (!rs.has(g)) continue;
      const int j = rs.col(g);
      const float4 x = row.logits(g);
      const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int l = 0; l < 4; ++l)
        if (xs[l] > mt) mt = xs[l], first_max = j + l;
    }
  } else {
    mt = row.max(rs);
  }
  const ExpMinus exp_minus(mt);
  float s = 0.f;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (!rs.has(g)) continue;
    const float4 ex = exp_minus(row.logits(g));
    row.keep_exp(g, ex);
    s += (ex.x + ex.y) + (ex.z + ex.w);
  }
  const float mx = cuda::block_max(mt, scratch);
  const float sum = cuda::block_sum(s * __expf(mt - mx), scratch);
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - xt;

  // The thread's group holding the target, if any (tg), and the target's place in it (tl).
  const int rel = t - rs.first;
  const int tg = rel >= 0 && rel % rs.step() < 4 ? rel / rs.step() : -1, tl = rel % rs.step();
  const float c = __expf(mt - mx) / sum * grad_scale;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (!rs.has(g)) continue;
    const float4 ex = row.exp_of(g, exp_minus);
    float4 d = make_float4(ex.x * c, ex.y * c, ex.z * c, ex.w * c);
    if (g == tg) {
      d.x -= tl == 0 ? grad_scale : 0.f;
      d.y -= tl == 1 ? grad_scale : 0.f;
      d.z -= tl == 2 ? grad_scale : 0.f;
      d.w -= tl == 3 ? grad_scale : 0.f;
    }
    cuda::store4(dx + rs.col(g), d);
  }
  if constexpr (kHits) write_hit(hits, r, xt, mx, mt >= mx && first_max < t ? 1.f : 0.f, scratch);
}

// Threads of a register-row block: the fewest warps that hold `items` groups of four, `groups`
// per thread.
inline int row_threads(int64_t items, int groups) {
  return static_cast<int>(std::max<int64_t>((items + groups * 32 - 1) / (groups * 32), 1) * 32);
}

// ---- Hopper (cross_entropy_sm90.cu, sm_90a): rows streamed through shared memory ----------------
// Whether rows_sm90 takes these logits: a row a whole number of 16-byte units, 16-byte aligned, of
// at most 4 * kRowGroups * kMaxThreads logits (f32) or 4 * kLongRowGroups * kMaxThreads (bf16).
bool rows_sm90_fit(const Tensor& logits);
void rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& losses,
               float* hits, float grad_scale);

}  // namespace linac::xent
