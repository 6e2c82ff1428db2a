// Low-rank forget gate entry points: argument checks and device/dtype dispatch.
#include "loggate/loggate_lowrank.h"

#include <string>

#include "core/dispatch.h"

namespace linac {

namespace {

// [N, D] (or [N, R] for u) with unit column stride and a row stride >= its width.
void check_rows(const Tensor& x, int64_t n, int64_t width, const char* name) {
  loggate_check_rows(x, n, width, std::string("loggate_lowrank: ") + name);
}

void check_common(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, int64_t n, const LogGateOpts& o) {
  LINAC_CHECK(w.ndim == 2 && w.is_contiguous(), "loggate_lowrank: W must be [D, R] contiguous, got " + w.shape_str());
  const int64_t d = w.size(0), rank = w.size(1);
  check_rows(u, n, rank, "u");
  LINAC_CHECK(b.ndim == 1 && b.size(0) == d, "loggate_lowrank: b must be [" + std::to_string(d) + "]");
  LINAC_CHECK(o.tau > 0, "loggate_lowrank: tau must be positive");
  for (const Tensor* t : {&u, &w, &b})
    LINAC_CHECK(t->device == ctx.device, "loggate_lowrank: operands must live on the context's device");
}

}  // namespace

bool loggate_lowrank_gpu_ok(const Ctx& ctx, int64_t d, int64_t rank, DType act) {
  if (!ctx.is_gpu()) return true;
  // A CTA's 256 threads cover a row in groups of four columns.
  return act == DType::BF16 && (rank == 8 || rank == 16 || rank == 32) && d % 4 == 0 && d >= 4 && d <= 1024;
}

void loggate_lowrank_fwd(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& g,
                         const LogGateOpts& o) {
  const int64_t n = g.ndim == 2 ? g.size(0) : -1;
  check_common(ctx, u, w, b, n, o);
  check_rows(g, n, w.size(0), "g");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    loggate_lowrank_fwd_cuda(ctx, u, w, b, g, o);
#endif
    return;
  }
  LINAC_CHECK(u.dtype == w.dtype && u.dtype == b.dtype && u.dtype == g.dtype, "loggate_lowrank: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(u.dtype, T,
                     loggate_lowrank_fwd_cpu<T>(u.data<T>(), loggate_ld(u), w.data<T>(), b.data<T>(), g.data<T>(),
                                                loggate_ld(g), n, w.size(0), w.size(1), o));
}

void loggate_lowrank_bwd(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& dg,
                         const Tensor& dz, const Tensor& db, const LogGateOpts& o) {
  const int64_t n = dg.ndim == 2 ? dg.size(0) : -1;
  check_common(ctx, u, w, b, n, o);
  check_rows(dg, n, w.size(0), "dg");
  check_rows(dz, n, w.size(0), "dz");
  LINAC_CHECK(db.ndim == 1 && db.size(0) == w.size(0) && db.is_contiguous(), "loggate_lowrank: db must be [D]");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    loggate_lowrank_bwd_cuda(ctx, u, w, b, dg, dz, db, o);
#endif
    return;
  }
  LINAC_CHECK(
      u.dtype == w.dtype && u.dtype == b.dtype && u.dtype == dg.dtype && u.dtype == dz.dtype && u.dtype == db.dtype,
      "loggate_lowrank: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(
      u.dtype, T,
      loggate_lowrank_bwd_cpu<T>(u.data<T>(), loggate_ld(u), w.data<T>(), b.data<T>(), dg.data<T>(), loggate_ld(dg),
                                 dz.data<T>(), loggate_ld(dz), db.data<T>(), n, w.size(0), w.size(1), o));
}

}  // namespace linac
