// Per-head norm + swish gate entry points: argument checks and device/dtype dispatch.
#include "core/dispatch.h"
#include "norm_gate/norm_gate.h"

namespace linac {

namespace {
int64_t row_stride(const Tensor& t, const Tensor& like, const char* name) {
  LINAC_CHECK(t.ndim == 2 && t.size(0) == like.size(0) && t.size(1) == like.size(1),
              std::string("norm_gate: ") + name + " must be " + like.shape_str() + ", got " + t.shape_str());
  LINAC_CHECK(t.strides[1] == 1 || t.size(1) <= 1, std::string("norm_gate: ") + name + " needs contiguous rows");
  LINAC_CHECK(t.device == like.device, std::string("norm_gate: ") + name + " is on another device");
  return t.size(0) > 1 ? t.strides[0] : t.size(1);
}

NormGateLayout layout(const Tensor& x, const Tensor& r, const Tensor& br, const Tensor& mean, const Tensor& rstd,
                      double eps) {
  LINAC_CHECK(x.ndim == 2, "norm_gate: x must be [N, H*D], got " + x.shape_str());
  LINAC_CHECK(mean.ndim == 2 && mean.is_contiguous() && mean.size(0) == x.size(0) && mean.size(1) > 0 &&
                  x.size(1) % mean.size(1) == 0,
              "norm_gate: mean must be [N, H] contiguous with H dividing the width, got " + mean.shape_str());
  LINAC_CHECK(rstd.ndim == 2 && rstd.is_contiguous() && rstd.size(0) == mean.size(0) && rstd.size(1) == mean.size(1),
              "norm_gate: rstd must match mean");
  LINAC_CHECK(br.ndim == 1 && br.size(0) == x.size(1), "norm_gate: br must be [H*D]");
  NormGateLayout L;
  L.N = x.size(0), L.H = mean.size(1), L.D = x.size(1) / L.H, L.eps = eps;
  L.x = row_stride(x, x, "x");
  L.r = row_stride(r, x, "r");
  return L;
}
}  // namespace

void norm_gate_fwd(const Ctx& ctx, const Tensor& x, const Tensor& r, const Tensor& br, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd, double eps) {
  NormGateLayout L = layout(x, r, br, mean, rstd, eps);
  L.y = row_stride(y, x, "y");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    norm_gate_fwd_cuda(ctx, L, x, r, br, y, mean, rstd);
#endif
    return;
  }
  for (const Tensor* t : {&r, &br, &y, &mean, &rstd}) LINAC_CHECK(t->dtype == x.dtype, "norm_gate: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     norm_gate_fwd_cpu<T>(L, x.data<T>(), r.data<T>(), br.data<T>(), y.data<T>(), mean.data<T>(),
                                          rstd.data<T>()));
}

void norm_gate_bwd(const Ctx& ctx, const Tensor& x, const Tensor& r, const Tensor& br, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr) {
  NormGateLayout L = layout(x, r, br, mean, rstd, 0.0);
  L.dy = row_stride(dy, x, "dy");
  L.dx = row_stride(dx, x, "dx");
  L.dr = row_stride(dr, x, "dr");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    norm_gate_bwd_cuda(ctx, L, x, r, br, mean, rstd, dy, dx, dr);
#endif
    return;
  }
  for (const Tensor* t : {&r, &br, &mean, &rstd, &dy, &dx, &dr})
    LINAC_CHECK(t->dtype == x.dtype, "norm_gate: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     norm_gate_bwd_cpu<T>(L, x.data<T>(), r.data<T>(), br.data<T>(), mean.data<T>(), rstd.data<T>(),
                                          dy.data<T>(), dx.data<T>(), dr.data<T>()));
}

}  // namespace linac
