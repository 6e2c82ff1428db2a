// SiLU entry points: argument checks and device/dtype dispatch.
#include "activation/activation.h"

#include "core/dispatch.h"

namespace linac {

namespace {
// The row stride of an [N, C] operand shaped like `like`, with unit column stride.
int64_t row_stride(const Tensor& t, const Tensor& like, const char* name) {
  LINAC_CHECK(t.ndim == 2 && t.size(0) == like.size(0) && t.size(1) == like.size(1),
              std::string("silu: ") + name + " must be " + like.shape_str() + ", got " + t.shape_str());
  LINAC_CHECK(t.strides[1] == 1 || t.size(1) <= 1, std::string("silu: ") + name + " needs a unit column stride");
  LINAC_CHECK(t.device == like.device, std::string("silu: ") + name + " is on another device");
  return t.size(0) > 1 ? t.strides[0] : t.size(1);
}

SiluLayout layout(const Tensor& x) {
  LINAC_CHECK(x.ndim == 2, "silu: x must be [N, C], got " + x.shape_str());
  SiluLayout L;
  L.N = x.size(0), L.C = x.size(1);
  L.x = row_stride(x, x, "x");
  return L;
}
}  // namespace

void silu_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y) {
  SiluLayout L = layout(x);
  L.y = row_stride(y, x, "y");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    silu_fwd_cuda(ctx, L, x, y);
    return;
  }
  LINAC_CHECK(x.dtype == y.dtype, "silu: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, silu_fwd_cpu<T>(L, x.data<T>(), y.data<T>()));
}

void silu_bwd(const Ctx& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  SiluLayout L = layout(x);
  L.dy = row_stride(dy, x, "dy");
  L.dx = row_stride(dx, x, "dx");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    silu_bwd_cuda(ctx, L, x, dy, dx);
    return;
  }
  LINAC_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "silu: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, silu_bwd_cpu<T>(L, x.data<T>(), dy.data<T>(), dx.data<T>()));
}

}  // namespace linac
