// greedy_pick's entry point: argument checks, device/dtype dispatch.
#include "greedy_pick/greedy_pick.h"

#include "core/dispatch.h"

namespace linac {

void greedy_pick(const Ctx& ctx, const Tensor& logits, const Tensor& id, const Tensor& logprob) {
  LINAC_CHECK(logits.ndim == 2 && logits.is_contiguous() && logits.size(1) >= 1,
              "greedy_pick: logits must be [B, V] contiguous with V >= 1, got " + logits.shape_str());
  const int64_t B = logits.size(0), V = logits.size(1);
  LINAC_CHECK(V < (int64_t{1} << 31), "greedy_pick: vocabulary too large for int32 ids");
  LINAC_CHECK(id.dtype == DType::I32 && id.numel() == B && id.is_contiguous() && id.device == logits.device,
              "greedy_pick: id must be [B] int32 on the logits' device, got " + id.shape_str());
  if (logprob.ptr)
    LINAC_CHECK(logprob.dtype == DType::F64 && logprob.numel() == B && logprob.is_contiguous() &&
                    logprob.device == logits.device,
                "greedy_pick: logprob must be [B] f64 on the logits' device, got " + logprob.shape_str());
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    LINAC_CHECK(logits.dtype == DType::F32, "greedy_pick (GPU): logits must be f32");
    greedy_pick_cuda(ctx, logits, id, logprob);
#endif
    return;
  }
  double* lp = logprob.ptr ? logprob.data<double>() : nullptr;
  LINAC_CPU_DISPATCH(logits.dtype, F, greedy_pick_cpu<F>(logits.data<F>(), B, V, id.data<int32_t>(), lp));
}

}  // namespace linac
