// Channel-mixer GEMMs with the gate: argument checks and the choice between the fused Hopper
// kernels and matmul + swiglu.
#include "swiglu/swiglu_linear.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "activation/activation.h"
#include "core/dispatch.h"
#include "core/profiler.h"
#include "matmul/matmul.h"

namespace linac {

namespace {

constexpr const char* kProfileOp = "GEMM with the SwiGLU gate";

bool fused(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& h, const Tensor& y) {
  return ctx.is_gpu() && std::string_view(swiglu_linear_gpu_kernel(x, w, h, y)) == "fused_sm90";
}

void check_h(const Tensor& h, const Tensor& a, int64_t n, const char* a_name) {
  LINAC_CHECK(h.ndim == 2 && h.is_contiguous() && h.size(0) == n,
              "swiglu_linear: h must be [N, 2F] contiguous with N = " + std::to_string(n) + ", got " + h.shape_str());
  LINAC_CHECK(a.ndim == 2 && a.is_contiguous() && a.size(0) == n && 2 * a.size(1) == h.size(1),
              std::string("swiglu_linear: ") + a_name + " must be [N, F] contiguous for h " + h.shape_str() + ", got " +
                  a.shape_str());
}

}  // namespace

const char* swiglu_linear_gpu_kernel(const Tensor& x, const Tensor& w, const Tensor& h, const Tensor& y) {
  const bool hopper = hopper_kernels_allowed("LINAC_SWIGLU_KERNELS");
  const bool bf16 =
      x.dtype == DType::BF16 && w.dtype == DType::BF16 && h.dtype == DType::BF16 && y.dtype == DType::BF16;
  // A few rows (decoding) go to matmul's skinny kernel, which streams W at memory speed where the
  // fused kernel's 128-row tiles would read it for mostly empty rows.
  if (LINAC_WITH_SM90A && hopper && bf16 && x.size(0) > kSkinnyMaxRows && fused_gemm_operand_ok(x) && fused_gemm_operand_ok(w) &&
      fused_gemm_operand_ok(h) && fused_gemm_operand_ok(y) && gpu_compute_capability() == 90)
    return "fused_sm90";
  return "composite";
}

bool swiglu_linear_bwd_writes_da(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h,
                                 const Tensor& dh) {
  return !fused(ctx, dy, w_out, h, dh);
}

int swiglu_linear_cluster() {
  const char* env = std::getenv("LINAC_SWIGLU_CLUSTER");
  const std::string choice = env ? env : "";
  if (choice.empty() || choice == "2") return 2;
  if (choice == "1") return 1;
  throw UserError("LINAC_SWIGLU_CLUSTER must be 1 or 2, got '" + choice + "'");
}

void swiglu_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w_in, const Tensor& h, const Tensor& a,
                       GluAct act) {
  LINAC_CHECK(
      x.ndim == 2 && w_in.ndim == 2 && w_in.size(1) == x.size(1),
      "swiglu_linear_fwd: expected x [N, d] and W_in [2F, d], got " + x.shape_str() + " and " + w_in.shape_str());
  check_h(h, a, x.size(0), "a");
  LINAC_CHECK(w_in.size(0) == h.size(1),
              "swiglu_linear_fwd: W_in " + w_in.shape_str() + " does not give h " + h.shape_str());
  if (fused(ctx, x, w_in, h, a)) {
#if LINAC_WITH_SM90A
    FusedGemmProfile prof(ctx, kProfileOp, "GEMM+gate fwd", x.size(0), w_in.size(0), x.size(1));
    if (x.size(0) > 0) swiglu_linear_fwd_sm90(ctx, x, w_in, h, a, act);
    return;
#endif
  }
  matmul(ctx, x, false, w_in, true, h);
  swiglu_fwd(ctx, h, a, act);
}

void swiglu_linear_bwd(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h, const Tensor& da,
                       const Tensor& dh, GluAct act, const Tensor& dots) {
  LINAC_CHECK(
      dy.ndim == 2 && w_out.ndim == 2 && w_out.size(0) == dy.size(1),
      "swiglu_linear_bwd: expected dy [N, d] and W_out [d, F], got " + dy.shape_str() + " and " + w_out.shape_str());
  LINAC_CHECK(h.ndim == 2 && h.is_contiguous() && h.size(0) == dy.size(0) && h.size(1) == 2 * w_out.size(1),
              "swiglu_linear_bwd: h must be [N, 2F] contiguous for dy " + dy.shape_str() + " and W_out " +
                  w_out.shape_str() + ", got " + h.shape_str());
  LINAC_CHECK_SHAPE(h, dh);
  LINAC_CHECK(dh.is_contiguous(), "swiglu_linear_bwd: dh must be contiguous");
  LINAC_CHECK(
      !dots.defined() || (dots.ndim == 2 && dots.is_contiguous() && dots.dtype == DType::F32 &&
                          dots.size(0) == h.size(0) && 16 * dots.size(1) == h.size(1)),
      "swiglu_linear_bwd: dots must be [N, F / 8] f32 contiguous for h " + h.shape_str() + ", got " + dots.shape_str());
  if (fused(ctx, dy, w_out, h, dh)) {
#if LINAC_WITH_SM90A
    FusedGemmProfile prof(ctx, kProfileOp, "GEMM+gate bwd", dy.size(0), w_out.size(1), dy.size(1));
    if (dy.size(0) > 0)
      swiglu_linear_bwd_sm90(ctx, dy, w_out, h, dh, act, dots.defined() ? dots.data<float>() : nullptr);
    return;
#endif
  }
  LINAC_CHECK(da.ptr != nullptr, "swiglu_linear_bwd: the composite path needs da");
  check_h(h, da, dy.size(0), "da");
  matmul(ctx, dy, false, w_out, false, da);
  swiglu_bwd(ctx, h, da, dh, act);
  if (dots.defined()) swiglu_value_dots(ctx, h, dh, dots);
}

void silu_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a, int64_t c0) {
  LINAC_CHECK(x.ndim == 2 && w.ndim == 2 && w.size(1) == x.size(1),
              "silu_linear_fwd: expected x [N, d] and W [M, d], got " + x.shape_str() + " and " + w.shape_str());
  const int64_t n = x.size(0), m = w.size(0);
  LINAC_CHECK(c0 >= 0 && c0 < m,
              "silu_linear_fwd: c0 must be in [0, " + std::to_string(m) + "), got " + std::to_string(c0));
  LINAC_CHECK(y.ndim == 2 && y.is_contiguous() && y.size(0) == n && y.size(1) == m,
              "silu_linear_fwd: y must be [N, M] contiguous for x " + x.shape_str() + " and W " + w.shape_str() +
                  ", got " + y.shape_str());
  LINAC_CHECK(a.ndim == 2 && a.is_contiguous() && a.size(0) == n && a.size(1) == m - c0,
              "silu_linear_fwd: a must be [N, M - c0] contiguous, got " + a.shape_str());
  if (fused(ctx, x, w, y, a) && c0 % 8 == 0) {
#if LINAC_WITH_SM90A
    FusedGemmProfile prof(ctx, "GEMM with SiLU", "GEMM+SiLU", n, m, x.size(1));
    if (n > 0) silu_linear_fwd_sm90(ctx, x, w, y, a, c0);
    return;
#endif
  }
  matmul(ctx, x, false, w, true, y);
  silu_fwd(ctx, y.narrow(1, c0, m - c0), a);
}

}  // namespace linac
