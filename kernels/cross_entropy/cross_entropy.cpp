// Cross-entropy entry point: argument checks and device/dtype dispatch.
#include "cross_entropy/cross_entropy.h"

#include "core/dispatch.h"

namespace linac {

void cross_entropy_fwd_bwd(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                           const Tensor& losses, float grad_scale, const Tensor& hits) {
  LINAC_CHECK(logits.ndim == 2 && logits.is_contiguous(),
              "cross_entropy: logits must be [N, V] contiguous, got " + logits.shape_str());
  LINAC_CHECK_SHAPE(logits, dlogits);
  LINAC_CHECK(dlogits.is_contiguous(), "cross_entropy: dlogits must be contiguous");
  LINAC_CHECK(dlogits.ptr != logits.ptr || dlogits.dtype == logits.dtype,
              "cross_entropy: in-place dlogits must have the dtype of logits");
  LINAC_CHECK(targets.dtype == DType::I32 && targets.numel() == logits.size(0),
              "cross_entropy: targets must be [N] i32");
  LINAC_CHECK(losses.numel() == logits.size(0), "cross_entropy: losses must be [N]");
  LINAC_CHECK(!hits.ptr || (hits.numel() == logits.size(0) && hits.dtype == losses.dtype && hits.is_contiguous()),
              "cross_entropy: hits must be [N] contiguous in the losses' dtype");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    cross_entropy_fwd_bwd_cuda(ctx, logits, targets, dlogits, losses, hits, grad_scale);
    return;
  }
  LINAC_CHECK(logits.dtype == dlogits.dtype && logits.dtype == losses.dtype, "cross_entropy: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(logits.dtype, T,
                     cross_entropy_fwd_bwd_cpu<T>(logits.data<T>(), targets.data<int32_t>(), dlogits.data<T>(),
                                                  losses.data<T>(), hits.ptr ? hits.data<T>() : nullptr,
                                                  logits.size(0), logits.size(1), grad_scale));
}

}  // namespace linac
