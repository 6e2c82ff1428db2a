// RMSNorm entry points: argument checks and device/dtype dispatch.
#include "rmsnorm/rmsnorm.h"

#include "core/buffer.h"
#include "core/dispatch.h"

namespace linac {

namespace {
void check_args(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd) {
  LINAC_CHECK(x.ndim == 2 && x.is_contiguous(), "rmsnorm: x must be [rows, dim] contiguous, got " + x.shape_str());
  LINAC_CHECK_SHAPE(x, y);
  LINAC_CHECK(w.numel() == x.size(1), "rmsnorm: w must be [dim]");
  LINAC_CHECK(rstd.numel() == x.size(0), "rmsnorm: rstd must be [rows]");
}
}  // namespace

void rmsnorm_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, double eps,
                 const Tensor& add, const Tensor& h) {
  check_args(x, w, y, rstd);
  LINAC_CHECK(!add.ptr == !h.ptr, "rmsnorm: the residual add takes both add and h");
  if (add.ptr) {
    LINAC_CHECK_SHAPE(add, x);
    LINAC_CHECK_SHAPE(h, x);
    LINAC_CHECK(add.dtype == y.dtype && add.is_contiguous(), "rmsnorm: add must be contiguous with y's dtype");
    LINAC_CHECK(h.dtype == x.dtype && h.is_contiguous(), "rmsnorm: h must be contiguous with x's dtype");
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    rmsnorm_fwd_cuda(ctx, x, w, y, rstd, static_cast<float>(eps), add, h);
    return;
  }
  LINAC_CHECK(x.dtype == w.dtype && x.dtype == y.dtype && x.dtype == rstd.dtype, "rmsnorm: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     rmsnorm_fwd_cpu<T>(x.data<T>(), add.ptr ? add.data<T>() : nullptr, w.data<T>(), y.data<T>(),
                                        rstd.data<T>(), h.ptr ? h.data<T>() : nullptr, x.size(0), x.size(1), eps));
}

void rmsnorm_bwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                 const Tensor& dx, const Tensor& dw, const Tensor& dx_copy) {
  check_args(x, w, dy, rstd);
  LINAC_CHECK_SHAPE(x, dx);
  LINAC_CHECK(dw.numel() == w.numel(), "rmsnorm: dw must be [dim]");
  if (dx_copy.ptr) {
    LINAC_CHECK_SHAPE(dx_copy, dx);
    LINAC_CHECK(dx_copy.dtype == dy.dtype && dx_copy.is_contiguous(), "rmsnorm: dx_copy must have dy's dtype");
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    rmsnorm_bwd_cuda(ctx, x, w, rstd, dy, dx, dw, dx_copy);
    return;
  }
  LINAC_CPU_DISPATCH(x.dtype, T,
                     rmsnorm_bwd_cpu<T>(x.data<T>(), w.data<T>(), rstd.data<T>(), dy.data<T>(), dx.data<T>(),
                                        dw.data<T>(), x.size(0), x.size(1)));
  if (dx_copy.ptr) copy_tensor(ctx, dx_copy, dx);
}

}  // namespace linac
