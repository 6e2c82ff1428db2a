// The register-row cross-entropy (math in cross_entropy.h), shared by the kernel that reads each
// row from global memory (cross_entropy.cu) and the Hopper one that streams rows into shared
// memory ahead of the math (cross_entropy_sm90.cu). A block holds a row of up to
// 4 * kRowGroups * kMaxThreads logits in registers, thread i the groups of four at 4i + g * 4 *
// blockDim.x. Each thread takes its own max mt and s = sum exp(x - mt), keeping exp(x - mt) in
// place of x; the block merges (mt, s) with a max and a sum, and the gradient is
// exp(x - mt) * exp(mt - mx) / sum: one read of the row, one write, one exponential per logit.
#pragma once

#include <algorithm>
#include <cfloat>

#include "common/cuda_common.cuh"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac::xent {

constexpr int kMaxThreads = 512;
constexpr int kRowGroups = 16;  // register rows: groups of four logits per thread, at most

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

// In-row indices fit an int (v <= 4 * kRowGroups * kMaxThreads).
struct RowSpan {
  int first, step, n;  // the thread's first column, the stride between its groups, the row length
  __device__ RowSpan(int64_t v)
      : first(4 * static_cast<int>(threadIdx.x)), step(4 * static_cast<int>(blockDim.x)), n(static_cast<int>(v)) {}
};

// The thread's groups of row x (global or shared memory).
template <class TL>
__device__ __forceinline__ void load_row(const TL* x, const RowSpan& rs, float4 (&e)[kRowGroups]) {
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g)
    if (rs.first + g * rs.step < rs.n) e[g] = cuda::load4(x + rs.first + g * rs.step);
}

// Row r with target t >= 0 and its logit xt (thread 0; NaN past the row) once its values are in
// e: loss, gradient into dx, hit. Every thread of the block calls it (block reductions).
template <class TD>
__device__ __forceinline__ void finish_row(float4 (&e)[kRowGroups], const RowSpan& rs, int32_t t, float xt, TD* dx,
                                           float* losses, float* hits, int64_t r, float grad_scale, float* scratch) {
  // The thread's max (from -FLT_MAX, so that a -inf logit adds exp(-inf) = 0, not NaN) and the
  // first index holding it.
  float mt = -FLT_MAX;
  int first_max = rs.n;
  auto take_max = [&](float xj, int j) {
    if (xj > mt) mt = xj, first_max = j;
  };
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g) {
    const int j = rs.first + g * rs.step;
    if (j < rs.n) take_max(e[g].x, j), take_max(e[g].y, j + 1), take_max(e[g].z, j + 2), take_max(e[g].w, j + 3);
  }
  float s = 0.f;
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g) {
    if (rs.first + g * rs.step >= rs.n) continue;
    e[g] = make_float4(__expf(e[g].x - mt), __expf(e[g].y - mt), __expf(e[g].z - mt), __expf(e[g].w - mt));
    s += (e[g].x + e[g].y) + (e[g].z + e[g].w);
  }
  const float mx = cuda::block_max(mt, scratch);
  const float sum = cuda::block_sum(s * __expf(mt - mx), scratch);
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - xt;

  const float c = __expf(mt - mx) / sum * grad_scale;
  auto grad = [&](float ej, int j) { return ej * c - (j == t ? grad_scale : 0.f); };
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g) {
    const int j = rs.first + g * rs.step;
    if (j < rs.n)
      cuda::store4(dx + j, make_float4(grad(e[g].x, j), grad(e[g].y, j + 1), grad(e[g].z, j + 2), grad(e[g].w, j + 3)));
  }
  if (hits) write_hit(hits, r, xt, mx, mt >= mx && first_max < t ? 1.f : 0.f, scratch);
}

// Threads of a register-row block: the fewest warps that hold `items` groups of four.
inline int row_threads(int64_t items) {
  return static_cast<int>(std::max<int64_t>((items + kRowGroups * 32 - 1) / (kRowGroups * 32), 1) * 32);
}

// ---- Hopper (cross_entropy_sm90.cu, sm_90a): rows streamed through shared memory ----------------
constexpr int64_t kMaxRowBytes = int64_t{4} * kRowGroups * kMaxThreads * sizeof(float);
// Whether rows_sm90 takes these logits: a row a whole number of 16-byte units, 16-byte aligned.
bool rows_sm90_fit(const Tensor& logits);
void rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& losses,
               float* hits, float grad_scale);

}  // namespace linac::xent
