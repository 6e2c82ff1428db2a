// CUDA fused softmax cross-entropy (math in cross_entropy.h). One block per row.
// Rows of up to 32768 logits in groups of four (the 32000, 4096 and 256 vocabularies of
// configs/; not 50264 or 64000) are held in registers: each thread loads its groups once (the
// whole row in flight), takes its own max mt and s = sum exp(x - mt), keeping exp(x - mt) in
// place of x; the block merges (mt, s) with a max and a sum, and the gradient is
// exp(x - mt) * exp(mt - mx) / sum: one read of the row, one write, one exponential per logit.
// Other rows take two passes. Pass 1: each thread keeps a running max m and sum
// s = sum exp(x - m) over its elements (rescaling s only when the max grows, so one exp per
// element); the block merges them likewise. Pass 2 re-reads the row from its end (what pass 1
// read last is the likeliest still in L2) and writes the gradient.
// Each thread writes only elements it has itself read, and the target logit is read before the
// block reductions' barriers, so the gradient may overwrite the logits; logits/dlogits are
// deliberately not __restrict__.
// hits (optional): the target is the first index holding the row max when its logit equals the
// max and no element before it reaches the max; a thread flags an earlier element reaching the
// max and one more block reduction merges the flags.
#include <algorithm>
#include <cfloat>

#include "common/cuda_common.cuh"
#include "cross_entropy/cross_entropy.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kRowGroups = 16;  // register rows: groups of four logits per thread, at most

// An ignored row (target < 0): zero gradient, zero loss, no hit.
template <bool kVec, class TD>
__device__ void ignored_row(TD* dx, int64_t v, float* losses, float* hits, int64_t r) {
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
__device__ void write_hit(float* hits, int64_t r, float xt, float mx, float earlier_max, float* scratch) {
  const float any_earlier = cuda::block_max(earlier_max, scratch);
  if (threadIdx.x == 0) hits[r] = xt >= mx && any_earlier == 0.f ? 1.f : 0.f;
}

// m starts at -FLT_MAX rather than -inf so that a -inf logit adds exp(-inf) = 0, not NaN. The
// exponentials are __expf (ex2.approx, relative error ~2^-21): two per logit are most of the
// kernel's instructions.
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

template <bool kVec, class TL, class TD>
__global__ void cross_entropy_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                                     float* __restrict__ losses, float* __restrict__ hits, int64_t v,
                                     float grad_scale) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  const TL* x = logits + r * v;
  TD* dx = dlogits + r * v;
  if (t < 0) return ignored_row<kVec>(dx, v, losses, hits, r);

  float m = -FLT_MAX, s = 0.f;
  if constexpr (kVec) {
    for (int64_t j = 4 * threadIdx.x; j < v; j += 4 * blockDim.x) {
      online_add4(cuda::load4(x + j), m, s);
    }
  } else {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) online_add(cuda::to_float(x[j]), m, s);
  }
  const float xt = threadIdx.x == 0 && t < v ? cuda::to_float(x[t]) : NAN;
  const float mx = cuda::block_max(m, scratch);
  const float sum = cuda::block_sum(s * __expf(m - mx), scratch);
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - xt;

  const float inv = 1.f / sum;
  float earlier_max = 0.f;  // 1 when an element before the target reaches the row max
  auto grad = [&](float xj, int64_t j) {
    if (j < t && xj >= mx) earlier_max = 1.f;
    return (__expf(xj - mx) * inv - (j == t ? 1.f : 0.f)) * grad_scale;
  };
  const int64_t step = (kVec ? 4 : 1) * int64_t{blockDim.x}, first = (kVec ? 4 : 1) * int64_t{threadIdx.x};
  const int64_t last = first < v ? first + (v - 1 - first) / step * step : -1;
  if constexpr (kVec) {
    for (int64_t j = last; j >= 0; j -= step) {
      const float4 xv = cuda::load4(x + j);
      cuda::store4(dx + j, make_float4(grad(xv.x, j), grad(xv.y, j + 1), grad(xv.z, j + 2), grad(xv.w, j + 3)));
    }
  } else {
    for (int64_t j = last; j >= 0; j -= step) dx[j] = cuda::from_float<TD>(grad(cuda::to_float(x[j]), j));
  }
  if (hits) write_hit(hits, r, xt, mx, earlier_max, scratch);
}

template <class TL, class TD>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_row_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                             float* __restrict__ losses, float* __restrict__ hits, int64_t v, float grad_scale) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  const TL* x = logits + r * v;
  TD* dx = dlogits + r * v;
  if (t < 0) return ignored_row<true>(dx, v, losses, hits, r);

  // In-row indices fit an int here (v <= 4 * kRowGroups * kMaxThreads).
  const int first = 4 * static_cast<int>(threadIdx.x), step = 4 * static_cast<int>(blockDim.x), n = static_cast<int>(v);
  float4 e[kRowGroups];
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g)
    if (first + g * step < n) e[g] = cuda::load4(x + first + g * step);
  const float xt = threadIdx.x == 0 && t < n ? cuda::to_float(x[t]) : NAN;
  // The thread's max (from -FLT_MAX, so that a -inf logit adds exp(-inf) = 0, not NaN) and the
  // first index holding it.
  float mt = -FLT_MAX;
  int first_max = n;
  auto take_max = [&](float xj, int j) {
    if (xj > mt) mt = xj, first_max = j;
  };
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g) {
    const int j = first + g * step;
    if (j < n) take_max(e[g].x, j), take_max(e[g].y, j + 1), take_max(e[g].z, j + 2), take_max(e[g].w, j + 3);
  }
  float s = 0.f;
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g) {
    if (first + g * step >= n) continue;
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
    const int j = first + g * step;
    if (j < n)
      cuda::store4(dx + j, make_float4(grad(e[g].x, j), grad(e[g].y, j + 1), grad(e[g].z, j + 2), grad(e[g].w, j + 3)));
  }
  if (hits) write_hit(hits, r, xt, mx, mt >= mx && first_max < t ? 1.f : 0.f, scratch);
}

}  // namespace

void cross_entropy_fwd_bwd_cuda(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                                const Tensor& losses, const Tensor& hits, float grad_scale) {
  LINAC_CHECK(losses.dtype == DType::F32, "cross_entropy (GPU): losses must be f32");
  float* hits_ptr = hits.ptr ? hits.data<float>() : nullptr;
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  LINAC_CHECK(v > 0, "cross_entropy: empty vocabulary");
  const bool vec = v % 4 == 0 && cuda::vec4_aligned(logits) && cuda::vec4_aligned(dlogits);
  const int64_t items = vec ? v / 4 : v;
  auto st = cuda::stream_of(ctx);
  if (vec && items <= int64_t{kRowGroups} * kMaxThreads) {
    // Register rows: the fewest warps that hold the row.
    const int threads = static_cast<int>(std::max<int64_t>((items + kRowGroups * 32 - 1) / (kRowGroups * 32), 1) * 32);
    LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
                         cross_entropy_row_kernel<TL, TD><<<static_cast<unsigned>(n), threads, 0, st>>>(
                             logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(),
                             hits_ptr, v, grad_scale);
                       }));
    LINAC_CUDA_LAUNCH_CHECK();
    return;
  }
  // About eight elements (or vector groups) per thread in each pass.
  const int threads = static_cast<int>(std::clamp<int64_t>((items / 8 + 31) / 32 * 32, 32, kMaxThreads));
  LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
    if (vec)
      cross_entropy_kernel<true, TL, TD><<<static_cast<unsigned>(n), threads, 0, st>>>(
          logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(), hits_ptr, v,
          grad_scale);
    else
      cross_entropy_kernel<false, TL, TD><<<static_cast<unsigned>(n), threads, 0, st>>>(
          logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(), hits_ptr, v,
          grad_scale);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
