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

// In-row indices fit an int (v <= 4 * kLongRowGroups * kMaxThreads).
struct RowSpan {
  int first, step, n;  // the thread's first column, the stride between its groups, the row length
  __device__ RowSpan(int64_t v)
      : first(4 * static_cast<int>(threadIdx.x)), step(4 * static_cast<int>(blockDim.x)), n(static_cast<int>(v)) {}
};

// A thread's groups of four of a row, held in registers as f32: each value becomes exp(x - mt)
// as the sum takes it, and the gradient reads it back (one exponential per logit).
template <int G>
struct F32Row {
  float4 e[G];
  template <class TL>  // global or shared memory
  __device__ __forceinline__ void load(const TL* x, const RowSpan& rs) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.first + g * rs.step < rs.n) e[g] = cuda::load4(x + rs.first + g * rs.step);
  }
  __device__ __forceinline__ float4 logits(int g) const { return e[g]; }
  __device__ __forceinline__ void keep_exp(int g, float4 ex) { e[g] = ex; }
  __device__ __forceinline__ float4 exp_of(int g, float) const { return e[g]; }
};

__device__ __forceinline__ float4 exp_minus(float4 x, float m) {
  return make_float4(__expf(x.x - m), __expf(x.y - m), __expf(x.z - m), __expf(x.w - m));
}

// bf16 logits packed two to a register: half the registers of F32Row, so that a row of 51,200
// fits 512 threads (100 values each). The gradient recomputes exp(x - mt): the same values as
// F32Row keeps, so the same bits, for a second exponential per logit.
template <int G>
struct Bf16Row {
  uint2 p[G];
  __device__ __forceinline__ void load(const __nv_bfloat16* x, const RowSpan& rs) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (rs.first + g * rs.step < rs.n) p[g] = *reinterpret_cast<const uint2*>(x + rs.first + g * rs.step);
  }
  __device__ __forceinline__ float4 logits(int g) const {  // bf16 -> f32 is a shift of its bits
    return make_float4(__uint_as_float(p[g].x << 16), __uint_as_float(p[g].x & 0xffff0000u),
                       __uint_as_float(p[g].y << 16), __uint_as_float(p[g].y & 0xffff0000u));
  }
  __device__ __forceinline__ void keep_exp(int, float4) {}
  __device__ __forceinline__ float4 exp_of(int g, float mt) const { return exp_minus(logits(g), mt); }
};

// Row r with target t >= 0 and its logit xt (thread 0; NaN past the row) once its groups are in
// row (F32Row or Bf16Row of G groups): loss, gradient into dx, hit. Every thread of the block
// calls it (block reductions).
template <class TD, int G, template <int> class Row>
__device__ __forceinline__ void finish_row(Row<G>& row, const RowSpan& rs, int32_t t, float xt, TD* dx, float* losses,
                                           float* hits, int64_t r, float grad_scale, float* scratch) {
  // The thread's max (from -FLT_MAX, so that a -inf logit adds exp(-inf) = 0, not NaN) and the
  // first index holding it.
  float mt = -FLT_MAX;
  int first_max = rs.n;
  auto take_max = [&](float xj, int j) {
    if (xj > mt) mt = xj, first_max = j;
  };
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int j = rs.first + g * rs.step;
    if (j >= rs.n) continue;
    const float4 x = row.logits(g);
    take_max(x.x, j), take_max(x.y, j + 1), take_max(x.z, j + 2), take_max(x.w, j + 3);
  }
  float s = 0.f;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (rs.first + g * rs.step >= rs.n) continue;
    const float4 ex = exp_minus(row.logits(g), mt);
    row.keep_exp(g, ex);
    s += (ex.x + ex.y) + (ex.z + ex.w);
  }
  const float mx = cuda::block_max(mt, scratch);
  const float sum = cuda::block_sum(s * __expf(mt - mx), scratch);
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - xt;

  const float c = __expf(mt - mx) / sum * grad_scale;
  auto grad = [&](float ej, int j) { return ej * c - (j == t ? grad_scale : 0.f); };
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int j = rs.first + g * rs.step;
    if (j >= rs.n) continue;
    const float4 ex = row.exp_of(g, mt);
    cuda::store4(dx + j, make_float4(grad(ex.x, j), grad(ex.y, j + 1), grad(ex.z, j + 2), grad(ex.w, j + 3)));
  }
  if (hits) write_hit(hits, r, xt, mx, mt >= mx && first_max < t ? 1.f : 0.f, scratch);
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
