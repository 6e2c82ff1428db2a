// CUDA fused softmax cross-entropy (math in cross_entropy.h). One block per row.
// Rows of up to 32768 logits in groups of four (the 32000, 4096 and 256 vocabularies of
// configs/) are held in registers (cross_entropy_rows.cuh); on Hopper GPUs rows of up to 51,200
// (also 50264 and 50272; not 64000) are, streamed through shared memory by cross_entropy_sm90.cu.
// Other rows take two passes.
// Pass 1: each thread keeps a running max m and sum s = sum exp(x - m) over its elements
// (rescaling s only when the max grows, so one exp per element); the block merges them likewise.
// Pass 2 re-reads the row from its end (what pass 1 read last is the likeliest still in L2) and
// writes the gradient.
// Each thread writes only elements it has itself read, and the target logit is read before the
// block reductions' barriers, so the gradient may overwrite the logits; logits/dlogits are
// deliberately not __restrict__.
// hits (optional): the target is the first index holding the row max when its logit equals the
// max and no element before it reaches the max; a thread flags an earlier element reaching the
// max and one more block reduction merges the flags.
#include <algorithm>
#include <cfloat>
#include <string>
#include <string_view>

#include "common/cuda_common.cuh"
#include "cross_entropy/cross_entropy.h"
#include "cross_entropy/cross_entropy_rows.cuh"

namespace linac {
namespace {

using namespace xent;

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

template <bool kHits, class TL, class TD>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_row_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                             float* __restrict__ losses, float* __restrict__ hits, int64_t v, float grad_scale) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  const TL* x = logits + r * v;
  TD* dx = dlogits + r * v;
  if (t < 0) return ignored_row<true>(dx, v, losses, hits, r);
  const RowSpan<> rs(v);
  F32Row<kRowGroups> row;
  row.load(x, rs);
  const float xt = threadIdx.x == 0 && t < rs.n ? cuda::to_float(x[t]) : NAN;
  finish_row<kHits>(row, rs, t, xt, dx, losses, hits, r, grad_scale, scratch);
}

}  // namespace

const char* cross_entropy_gpu_kernel(const Tensor& logits, const Tensor& dlogits) {
  const bool hopper = hopper_kernels_allowed("LINAC_CROSS_ENTROPY_KERNELS");
  const int64_t v = logits.size(1);
  const bool vec = v % 4 == 0 && cuda::vec4_aligned(logits) && cuda::vec4_aligned(dlogits);
  if (!vec) return "two_pass";
  if (LINAC_WITH_SM90A && hopper && gpu_compute_capability() == 90 && xent::rows_sm90_fit(logits))
    return "rows_sm90";
  // Longer rows in registers would take a whole SM's registers per row with nothing in flight
  // while the block reduces and writes (no bulk copy here): two passes keep several rows reading.
  return v / 4 <= int64_t{kRowGroups} * kMaxThreads ? "rows" : "two_pass";
}

void cross_entropy_fwd_bwd_cuda(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                                const Tensor& losses, const Tensor& hits, float grad_scale) {
  LINAC_CHECK(losses.dtype == DType::F32, "cross_entropy (GPU): losses must be f32");
  float* hits_ptr = hits.ptr ? hits.data<float>() : nullptr;
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  LINAC_CHECK(v > 0, "cross_entropy: empty vocabulary");
  const std::string_view kernel = cross_entropy_gpu_kernel(logits, dlogits);
#if LINAC_WITH_SM90A
  if (kernel == "rows_sm90") return xent::rows_sm90(ctx, logits, targets, dlogits, losses, hits_ptr, grad_scale);
#endif
  const bool vec = v % 4 == 0 && cuda::vec4_aligned(logits) && cuda::vec4_aligned(dlogits);
  const int64_t items = vec ? v / 4 : v;
  auto st = cuda::stream_of(ctx);
  if (kernel == "rows") {
    // Register rows: the fewest warps that hold the row.
    const int threads = row_threads(items, kRowGroups);
    LINAC_GPU_DISPATCH(
        logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
          auto kernel = hits_ptr ? cross_entropy_row_kernel<true, TL, TD> : cross_entropy_row_kernel<false, TL, TD>;
          kernel<<<static_cast<unsigned>(n), threads, 0, st>>>(logits.data<TL>(), targets.data<int32_t>(),
                                                               dlogits.data<TD>(), losses.data<float>(), hits_ptr, v,
                                                               grad_scale);
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
