// LRPE-d entry points: argument checks and device/dtype dispatch.
#include "lrpe/lrpe.h"

#include "core/dispatch.h"

namespace linac {

namespace {
// Batch and token strides of a [B, T, H, width] operand whose last two dims are contiguous.
LrpeLayout::Strides strides_of(const Tensor& t, const LrpeLayout& L, int64_t width, const char* name) {
  LINAC_CHECK(t.ndim == 4 && t.size(0) == L.B && t.size(1) == L.T && t.size(2) == L.H && t.size(3) == width,
              std::string("lrpe: ") + name + " must be [" + std::to_string(L.B) + ", " + std::to_string(L.T) + ", " +
                  std::to_string(L.H) + ", " + std::to_string(width) + "], got " + t.shape_str());
  LINAC_CHECK((t.strides[3] == 1 || width <= 1) && (t.strides[2] == width || L.H <= 1),
              std::string("lrpe: the last two dimensions of ") + name + " must be contiguous");
  return {t.strides[0], t.strides[1]};
}

LrpeLayout layout(const Tensor& x, const Tensor& theta, int64_t pos0, const DocBounds& docs) {
  LINAC_CHECK(x.ndim == 4, "lrpe: x must be [B, T, H, D], got " + x.shape_str());
  LINAC_CHECK(pos0 >= 0, "lrpe: pos0 must be non-negative");
  LrpeLayout L;
  L.B = x.size(0), L.T = x.size(1), L.H = x.size(2), L.D = x.size(3), L.pos0 = pos0;
  L.doc_start = docs.start;
  L.x = strides_of(x, L, L.D, "x");
  LINAC_CHECK(theta.ndim == 2 && theta.size(0) == L.H && theta.size(1) == L.D && theta.is_contiguous(),
              "lrpe: theta must be [H, D] contiguous, got " + theta.shape_str());
  return L;
}

void run_fwd(const Ctx& ctx, LrpeLayout& L, const Tensor& x, const Tensor& theta, const Tensor& y) {
  L.y = strides_of(y, L, 2 * L.D, "y");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    lrpe_fwd_cuda(ctx, L, x, theta, y);
    return;
  }
  LINAC_CHECK(x.dtype == theta.dtype && x.dtype == y.dtype, "lrpe: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, lrpe_fwd_cpu<T>(L, x.data<T>(), theta.data<T>(), y.data<T>()));
}
}  // namespace

void lrpe_fwd(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& y, int64_t pos0,
              const DocBounds& docs) {
  LrpeLayout L = layout(x, theta, pos0, docs);
  run_fwd(ctx, L, x, theta, y);
}

void lrpe_fwd_at(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& y, const Tensor& positions) {
  LrpeLayout L = layout(x, theta, 0, {});
  LINAC_CHECK(positions.dtype == DType::I32 && positions.ndim == 1 && positions.size(0) == L.B &&
                  positions.is_contiguous() && positions.device == x.device,
              "lrpe: positions must be [" + std::to_string(L.B) + "] int32 on x's device, got " + positions.shape_str());
  L.row_pos = positions.data<int32_t>();
  run_fwd(ctx, L, x, theta, y);
}

void lrpe_bwd(const Ctx& ctx, const Tensor& x, const Tensor& theta, const Tensor& dy, const Tensor& dx,
              const Tensor& dtheta, int64_t pos0, const DocBounds& docs) {
  LrpeLayout L = layout(x, theta, pos0, docs);
  L.dy = strides_of(dy, L, 2 * L.D, "dy");
  L.dx = strides_of(dx, L, L.D, "dx");
  LINAC_CHECK(dtheta.ndim == 2 && dtheta.size(0) == L.H && dtheta.size(1) == L.D && dtheta.is_contiguous(),
              "lrpe: dtheta must be [H, D] contiguous, got " + dtheta.shape_str());
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    lrpe_bwd_cuda(ctx, L, x, theta, dy, dx, dtheta);
    return;
  }
  for (const Tensor* t : {&theta, &dy, &dx, &dtheta}) LINAC_CHECK(t->dtype == x.dtype, "lrpe: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T,
                     lrpe_bwd_cpu<T>(L, x.data<T>(), theta.data<T>(), dy.data<T>(), dx.data<T>(), dtheta.data<T>()));
}

size_t lrpe_bwd_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D) {
  const size_t partial = static_cast<size_t>(lrpe_slabs(B * T) * H * D) * sizeof(float);
  return (partial + 255) / 256 * 256;
}

}  // namespace linac
