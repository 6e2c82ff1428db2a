// SwiGLU entry points: argument checks and device/dtype dispatch.
#include "swiglu/swiglu.h"

#include "core/dispatch.h"

namespace linac {

namespace {
void check_args(const Tensor& h, const Tensor& a) {
  LINAC_CHECK(h.ndim == 2 && h.is_contiguous() && h.size(1) % 2 == 0,
              "swiglu: h must be [N, 2F] contiguous, got " + h.shape_str());
  LINAC_CHECK(a.ndim == 2 && a.is_contiguous() && a.size(0) == h.size(0) && 2 * a.size(1) == h.size(1),
              "swiglu: expected [N, F] contiguous for h " + h.shape_str() + ", got " + a.shape_str());
}
}  // namespace

void swiglu_fwd(const Ctx& ctx, const Tensor& h, const Tensor& a, GluAct act) {
  check_args(h, a);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    swiglu_fwd_cuda(ctx, h, a, act);
    return;
  }
  LINAC_CHECK(h.dtype == a.dtype, "swiglu: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(h.dtype, T, swiglu_fwd_cpu<T>(h.data<T>(), a.data<T>(), a.size(0), a.size(1), act));
}

void swiglu_bwd(const Ctx& ctx, const Tensor& h, const Tensor& da, const Tensor& dh, GluAct act) {
  check_args(h, da);
  LINAC_CHECK_SHAPE(h, dh);
  LINAC_CHECK(dh.is_contiguous(), "swiglu: dh must be contiguous");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    swiglu_bwd_cuda(ctx, h, da, dh, act);
    return;
  }
  LINAC_CHECK(h.dtype == da.dtype && h.dtype == dh.dtype, "swiglu: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(h.dtype, T,
                     swiglu_bwd_cpu<T>(h.data<T>(), da.data<T>(), dh.data<T>(), da.size(0), da.size(1), act));
}

}  // namespace linac
