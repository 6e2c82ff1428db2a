// CUDA fused softmax cross-entropy (math in cross_entropy.h). One block per row.
// Rows of up to 32768 logits in groups of four (the 32000, 4096 and 256 vocabularies of
// configs/; not 50264 or 64000) are held in registers (cross_entropy_rows.cuh; on Hopper GPUs
// streamed through shared memory by cross_entropy_sm90.cu). Other rows take two passes over
// global memory (two_pass_row in cross_entropy_rows.cuh), the second mostly from L2.
// logits/dlogits are deliberately not __restrict__: the gradient may overwrite the logits.
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

template <bool kVec, class TL, class TD>
__global__ void cross_entropy_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                                     float* __restrict__ losses, float* __restrict__ hits, int64_t v,
                                     float grad_scale) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  two_pass_row<kVec>(logits + r * v, targets[r], dlogits + r * v, losses, hits, r, v, grad_scale, scratch);
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
  const RowSpan rs(v);
  float4 e[kRowGroups];
  load_row(x, rs, e);
  const float xt = threadIdx.x == 0 && t < rs.n ? cuda::to_float(x[t]) : NAN;
  finish_row(e, rs, t, xt, dx, losses, hits, r, grad_scale, scratch);
}

}  // namespace

const char* cross_entropy_gpu_kernel(const Tensor& logits, const Tensor& dlogits) {
  const bool hopper =
      hopper_kernels_allowed("LINAC_CROSS_ENTROPY_KERNELS") && LINAC_WITH_SM90A && gpu_compute_capability() == 90;
  const int64_t v = logits.size(1);
  const bool vec = v % 4 == 0 && cuda::vec4_aligned(logits) && cuda::vec4_aligned(dlogits);
  if (vec && v / 4 <= int64_t{kRowGroups} * kMaxThreads)
    return hopper && xent::rows_sm90_fit(logits) ? "rows_sm90" : "rows";
  return "two_pass";
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
    const int threads = row_threads(items);
    LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
                         cross_entropy_row_kernel<TL, TD><<<static_cast<unsigned>(n), threads, 0, st>>>(
                             logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(),
                             hits_ptr, v, grad_scale);
                       }));
    LINAC_CUDA_LAUNCH_CHECK();
    return;
  }
  const int threads = two_pass_threads(items);
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
