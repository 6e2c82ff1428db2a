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

void swiglu_value_dots(const Ctx& ctx, const Tensor& h, const Tensor& dh, const Tensor& dots) {
  LINAC_CHECK(h.ndim == 2 && h.is_contiguous() && h.size(1) % 16 == 0,
              "swiglu_value_dots: h must be [N, 2F] contiguous with F a multiple of 8, got " + h.shape_str());
  LINAC_CHECK_SHAPE(h, dh);
  LINAC_CHECK(dh.is_contiguous(), "swiglu_value_dots: dh must be contiguous");
  LINAC_CHECK(dots.ndim == 2 && dots.is_contiguous() && dots.dtype == DType::F32 && dots.size(0) == h.size(0) &&
                  dots.size(1) == h.size(1) / 16 && dots.device == h.device,
              "swiglu_value_dots: dots must be [N, F / 8] f32 contiguous on h's device for h " + h.shape_str() +
                  ", got " + dots.shape_str());
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    swiglu_value_dots_cuda(ctx, h, dh, dots);
    return;
  }
  LINAC_CHECK(h.dtype == dh.dtype, "swiglu_value_dots: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(h.dtype, T,
                     swiglu_value_dots_cpu<T>(h.data<T>(), dh.data<T>(), dots.data<float>(), h.size(0), h.size(1) / 2));
}

}  // namespace linac
