// The row algorithms of the cross-entropy (math in cross_entropy.h), shared by the kernels that
// read rows from global memory (cross_entropy.cu) and the Hopper ones that stream rows into
// shared memory ahead of the math (cross_entropy_sm90.cu).
// Register rows (finish_row): a block holds a row of up to 4 * kRowGroups * kMaxThreads logits
// in registers, thread i the groups of four at 4i + g * 4 * blockDim.x. Each thread takes its
// own max mt and s = sum exp(x - mt), keeping exp(x - mt) in place of x; the block merges
// (mt, s) with a max and a sum, and the gradient is exp(x - mt) * exp(mt - mx) / sum: one read
// of the row, one write, one exponential per logit.
// Two passes, for longer rows: pass 1 keeps a running max m and sum s = sum exp(x - m) per thread
// (rescaling s only when the max grows, so one exponential per logit) and the block merges them
// likewise (add_to_stats, row_stats); pass 2 re-reads the row and writes the gradient
// (write_gradient). two_pass_row makes both over a row in global memory.
// Each thread writes only elements it has itself read, and the target logit is read before the
// block reductions' barriers, so the gradient may overwrite the logits.
// hits (optional): the target is the first index holding the row max when its logit equals the
// max and no element before it reaches the max; a thread flags an earlier element reaching the
// max and one more block reduction merges the flags.
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

// m starts at -FLT_MAX rather than -inf so that a -inf logit adds exp(-inf) = 0, not NaN. The
// exponentials are __expf (ex2.approx, relative error ~2^-21): two per logit are most of a
// two-pass row's instructions.
__device__ __forceinline__ void online_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * __expf(m - x) + 1.f;
    m = x;
  } else {
    s += __expf(x - m);
  }
}
// Four logits with one rescale at most.
__device__ __forceinline__ void online_add4(float4 x, float& m, float& s) {
  const float m4 = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
  if (m4 > m) {
    s *= __expf(m - m4);
    m = m4;
  }
  s += (__expf(x.x - m) + __expf(x.y - m)) + (__expf(x.z - m) + __expf(x.w - m));
}

// The thread's elements of x[j0, j1) (j0 a multiple of the block's stride): groups of four at
// j0 + 4 * threadIdx.x + k * 4 * blockDim.x (kVec) or single elements, k = 0 .. count - 1.
template <bool kVec>
struct ThreadRange {
  int64_t first, step, count;
  __device__ ThreadRange(int64_t j0, int64_t j1)
      : first(j0 + (kVec ? 4 : 1) * int64_t{threadIdx.x}),
        step((kVec ? 4 : 1) * int64_t{blockDim.x}),
        count(first < j1 ? (j1 - 1 - first) / step + 1 : 0) {}
};

// Pass 1 over x[j0, j1): the thread's running max m and sum s.
template <bool kVec, class TL>
__device__ __forceinline__ void add_to_stats(const TL* x, int64_t j0, int64_t j1, float& m, float& s) {
  const ThreadRange<kVec> tr(j0, j1);
  for (int64_t k = 0; k < tr.count; ++k) {
    const int64_t j = tr.first + k * tr.step;
    if constexpr (kVec)
      online_add4(cuda::load4(x + j), m, s);
    else
      online_add(cuda::to_float(x[j]), m, s);
  }
}

// Between the passes: the row max mx and sum of exp(x - mx) from the threads' (m, s); thread 0
// writes the loss (xt, the target's logit, is thread 0's).
struct RowStats {
  float mx, sum;
};
__device__ __forceinline__ RowStats row_stats(float m, float s, float xt, float* losses, int64_t r, float* scratch) {
  const float mx = cuda::block_max(m, scratch);
  const float sum = cuda::block_sum(s * __expf(m - mx), scratch);
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - xt;
  return {mx, sum};
}

// Pass 2 over x[j0, j1) (kBackward: from the end), gradient into dx; earlier_max becomes 1 when
// an element before the target t reaches the row max.
template <bool kVec, bool kBackward, class TL, class TD>
__device__ __forceinline__ void write_gradient(const TL* x, TD* dx, int64_t j0, int64_t j1, int64_t t,
                                               const RowStats& st, float grad_scale, float& earlier_max) {
  const float inv = 1.f / st.sum;
  auto grad = [&](float xj, int64_t j) {
    if (j < t && xj >= st.mx) earlier_max = 1.f;
    return (__expf(xj - st.mx) * inv - (j == t ? 1.f : 0.f)) * grad_scale;
  };
  const ThreadRange<kVec> tr(j0, j1);
  for (int64_t i = 0; i < tr.count; ++i) {
    const int64_t j = tr.first + (kBackward ? tr.count - 1 - i : i) * tr.step;
    if constexpr (kVec) {
      const float4 xv = cuda::load4(x + j);
      cuda::store4(dx + j, make_float4(grad(xv.x, j), grad(xv.y, j + 1), grad(xv.z, j + 2), grad(xv.w, j + 3)));
    } else {
      dx[j] = cuda::from_float<TD>(grad(cuda::to_float(x[j]), j));
    }
  }
}

// Row r (logits x, gradient dx, target t) in two passes over x in global memory, the second from
// the row's end (what the first read last is the likeliest still in L2): groups of four (kVec;
// x, dx aligned to four elements) or single elements. Every thread of the block calls it (block
// reductions).
template <bool kVec, class TL, class TD>
__device__ __forceinline__ void two_pass_row(const TL* x, int64_t t, TD* dx, float* losses, float* hits, int64_t r,
                                             int64_t v, float grad_scale, float* scratch) {
  if (t < 0) return ignored_row<kVec>(dx, v, losses, hits, r);
  float m = -FLT_MAX, s = 0.f;
  add_to_stats<kVec>(x, 0, v, m, s);
  const float xt = threadIdx.x == 0 && t < v ? cuda::to_float(x[t]) : NAN;
  const RowStats st = row_stats(m, s, xt, losses, r, scratch);
  float earlier_max = 0.f;
  write_gradient<kVec, true>(x, dx, 0, v, t, st, grad_scale, earlier_max);
  if (hits) write_hit(hits, r, xt, st.mx, earlier_max, scratch);
}

// Threads of a two-pass block: about eight elements (or groups of four) per thread in each pass.
inline int two_pass_threads(int64_t items) {
  return static_cast<int>(std::clamp<int64_t>((items / 8 + 31) / 32 * 32, 32, kMaxThreads));
}

// Threads of a register-row block: the fewest warps that hold `items` groups of four.
inline int row_threads(int64_t items) {
  return static_cast<int>(std::max<int64_t>((items + kRowGroups * 32 - 1) / (kRowGroups * 32), 1) * 32);
}

// ---- Hopper (cross_entropy_sm90.cu, sm_90a): rows streamed through shared memory ----------------
constexpr int64_t kMaxRowBytes = int64_t{4} * kRowGroups * kMaxThreads * sizeof(float);
// Whether rows_sm90 takes these logits: a row of at most kMaxRowBytes, a whole number of 16-byte
// units, 16-byte aligned.
bool rows_sm90_fit(const Tensor& logits);
void rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& losses,
               float* hits, float grad_scale);

}  // namespace linac::xent
