// SimpleRMSNorm entry points: argument checks and device/dtype dispatch.
#include "srmsnorm/srmsnorm.h"

#include "core/dispatch.h"

namespace linac {

namespace {
// The row stride of an [N, C] operand shaped like `like`, with unit column stride.
int64_t row_stride(const Tensor& t, const Tensor& like, const char* name) {
  LINAC_CHECK(t.ndim == 2 && t.size(0) == like.size(0) && t.size(1) == like.size(1),
              std::string("srmsnorm: ") + name + " must be " + like.shape_str() + ", got " + t.shape_str());
  LINAC_CHECK(t.strides[1] == 1 || t.size(1) <= 1, std::string("srmsnorm: ") + name + " needs a unit column stride");
  LINAC_CHECK(t.device == like.device, std::string("srmsnorm: ") + name + " is on another device");
  return t.size(0) > 1 ? t.strides[0] : t.size(1);
}

SrmsnormLayout layout(const Tensor& x, const Tensor& rstd) {
  LINAC_CHECK(x.ndim == 2 && x.size(1) > 0 && x.size(1) <= kSrmsnormMaxDim,
              "srmsnorm: x must be [N, C] with 0 < C <= " + std::to_string(kSrmsnormMaxDim) + ", got " +
                  x.shape_str());
  LINAC_CHECK(rstd.ndim == 1 && rstd.size(0) == x.size(0) && rstd.is_contiguous() && rstd.device == x.device,
              "srmsnorm: rstd must be [N] contiguous, got " + rstd.shape_str());
  SrmsnormLayout L;
  L.N = x.size(0), L.C = x.size(1);
  L.x = row_stride(x, x, "x");
  return L;
}

void run_fwd(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& y, const Tensor& rstd, double eps,
             const Tensor& add, const Tensor& h, const Tensor& u) {
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    srmsnorm_fwd_cuda(ctx, L, x, y, rstd, static_cast<float>(eps), add, h, u);
    return;
  }
  LINAC_CHECK(x.dtype == y.dtype && x.dtype == rstd.dtype && (!u.ptr || u.dtype == x.dtype),
              "srmsnorm: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     srmsnorm_fwd_cpu<T>(L, x.data<T>(), ptr_or_null<T>(add), ptr_or_null<T>(u), y.data<T>(),
                                         rstd.data<T>(), ptr_or_null<T>(h), eps));
}

void run_bwd(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& rstd, const Tensor& dy,
             const Tensor& dx, bool accumulate, const Tensor& u, const Tensor& du, const Tensor& t) {
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    srmsnorm_bwd_cuda(ctx, L, x, rstd, dy, dx, accumulate, u, du, t);
    return;
  }
  LINAC_CHECK(x.dtype == rstd.dtype && x.dtype == dy.dtype && x.dtype == dx.dtype &&
                  (!u.ptr || (u.dtype == x.dtype && du.dtype == x.dtype)) && (!t.ptr || t.dtype == x.dtype),
              "srmsnorm: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     srmsnorm_bwd_cpu<T>(L, x.data<T>(), ptr_or_null<T>(u), ptr_or_null<T>(t), rstd.data<T>(),
                                         dy.data<T>(), dx.data<T>(), ptr_or_null<T>(du), accumulate));
}
}  // namespace

void srmsnorm_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y, const Tensor& rstd, double eps, const Tensor& add,
                  const Tensor& h) {
  SrmsnormLayout L = layout(x, rstd);
  L.y = row_stride(y, x, "y");
  LINAC_CHECK(!add.ptr == !h.ptr, "srmsnorm: the residual add takes both add and h");
  if (add.ptr) {
    L.add = row_stride(add, x, "add");
    L.h = row_stride(h, x, "h");
    LINAC_CHECK(add.dtype == y.dtype && h.dtype == x.dtype, "srmsnorm: add must have y's dtype and h x's");
  }
  run_fwd(ctx, L, x, y, rstd, eps, add, h, Tensor());
}

void srmsnorm_bwd(const Ctx& ctx, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                  bool accumulate) {
  SrmsnormLayout L = layout(x, rstd);
  L.dy = row_stride(dy, x, "dy");
  L.dx = row_stride(dx, x, "dx");
  run_bwd(ctx, L, x, rstd, dy, dx, accumulate, Tensor(), Tensor(), Tensor());
}

void srmsnorm_scaled_fwd(const Ctx& ctx, const Tensor& x, const Tensor& y, const Tensor& rstd, double eps,
                         double scale) {
  SrmsnormLayout L = layout(x, rstd);
  L.y = row_stride(y, x, "y");
  L.scale = scale;
  run_fwd(ctx, L, x, y, rstd, eps, Tensor(), Tensor(), Tensor());
}

void srmsnorm_scaled_bwd(const Ctx& ctx, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                         double scale, bool accumulate, const Tensor& target, double pull) {
  SrmsnormLayout L = layout(x, rstd);
  L.dy = row_stride(dy, x, "dy");
  L.dx = row_stride(dx, x, "dx");
  L.scale = scale;
  if (target.ptr) {
    L.t = row_stride(target, x, "target");
    L.pull = pull;
    LINAC_CHECK(target.dtype == dy.dtype, "srmsnorm: the target must have dy's dtype");
  }
  run_bwd(ctx, L, x, rstd, dy, dx, accumulate, Tensor(), Tensor(), target);
}

void srmsnorm_gate_fwd(const Ctx& ctx, const Tensor& x, const Tensor& u, const Tensor& y, const Tensor& rstd,
                       double eps) {
  SrmsnormLayout L = layout(x, rstd);
  L.y = row_stride(y, x, "y");
  L.u = row_stride(u, x, "u");
  LINAC_CHECK(u.dtype == y.dtype, "srmsnorm: the gate u must have y's dtype");
  run_fwd(ctx, L, x, y, rstd, eps, Tensor(), Tensor(), u);
}

void srmsnorm_gate_bwd(const Ctx& ctx, const Tensor& x, const Tensor& u, const Tensor& rstd, const Tensor& dy,
                       const Tensor& dx, const Tensor& du) {
  SrmsnormLayout L = layout(x, rstd);
  L.dy = row_stride(dy, x, "dy");
  L.dx = row_stride(dx, x, "dx");
  L.u = row_stride(u, x, "u");
  L.du = row_stride(du, x, "du");
  LINAC_CHECK(u.dtype == dy.dtype && du.dtype == dx.dtype, "srmsnorm: u must have dy's dtype and du dx's");
  run_bwd(ctx, L, x, rstd, dy, dx, false, u, du, Tensor());
}

}  // namespace linac
