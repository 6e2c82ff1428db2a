// doc_start_fill entry point: argument checks and device/dtype dispatch.
#include "elementwise/doc_start_fill.h"

#include "core/dispatch.h"

namespace linac {

void doc_start_fill(const Ctx& ctx, const Tensor& x, const DocBounds& docs, double value) {
  if (!docs.defined()) return;
  LINAC_CHECK(x.ndim >= 2 && x.is_contiguous(), "doc_start_fill: x must be a contiguous [B, T, ...] tensor, got " +
                                                    x.shape_str());
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t C = B * T > 0 ? x.numel() / (B * T) : 0;
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    doc_start_fill_cuda(ctx, x, docs.start, value);
    return;
  }
  LINAC_CPU_DISPATCH(x.dtype, F, doc_start_fill_cpu<F>(x.data<F>(), docs.start, B, T, C, value));
}

}  // namespace linac
