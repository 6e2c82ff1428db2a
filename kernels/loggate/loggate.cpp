// Log-space gate entry points: argument checks and device/dtype dispatch.
#include "loggate/loggate.h"

#include <string>

#include "core/dispatch.h"

namespace linac {

void loggate_check_rows(const Tensor& x, int64_t n, int64_t width, const std::string& what) {
  LINAC_CHECK(x.ndim == 2 && x.size(0) == n && x.size(1) == width,
              what + " must be [" + std::to_string(n) + ", " + std::to_string(width) + "], got " + x.shape_str());
  LINAC_CHECK(x.size(1) <= 1 || x.strides[1] == 1, what + " needs contiguous rows");
  LINAC_CHECK(x.size(0) <= 1 || x.strides[0] >= x.size(1), what + " rows overlap");
}

namespace {
void check_rows(const Tensor& x, const Tensor& z, const char* name) {
  loggate_check_rows(x, z.size(0), z.size(1), std::string("loggate: ") + name);
  LINAC_CHECK(x.device == z.device, std::string("loggate: ") + name + " is on another device");
}
void check_common(const Tensor& z, const Tensor& b, const LogGateOpts& o) {
  LINAC_CHECK(z.ndim == 2, "loggate: z must be [N, D], got " + z.shape_str());
  check_rows(z, z, "z");
  LINAC_CHECK(b.ndim == 1 && b.size(0) == z.size(1) && b.device == z.device, "loggate: b must be [D]");
  LINAC_CHECK(o.tau > 0, "loggate: tau must be positive");
}
}  // namespace

void loggate_fwd(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& g, const LogGateOpts& o) {
  check_common(z, b, o);
  check_rows(g, z, "g");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    loggate_fwd_cuda(ctx, z, b, g, o);
#endif
    return;
  }
  LINAC_CHECK(z.dtype == b.dtype && z.dtype == g.dtype, "loggate: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(
      z.dtype, T,
      loggate_fwd_cpu<T>(z.data<T>(), loggate_ld(z), b.data<T>(), g.data<T>(), loggate_ld(g), z.size(0), z.size(1), o));
}

void loggate_bwd(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& dg, const Tensor& dz,
                 const LogGateOpts& o) {
  check_common(z, b, o);
  check_rows(dg, z, "dg");
  check_rows(dz, z, "dz");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    loggate_bwd_cuda(ctx, z, b, dg, dz, o);
#endif
    return;
  }
  LINAC_CHECK(z.dtype == b.dtype && z.dtype == dg.dtype && z.dtype == dz.dtype, "loggate: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(z.dtype, T,
                     loggate_bwd_cpu<T>(z.data<T>(), loggate_ld(z), b.data<T>(), dg.data<T>(), loggate_ld(dg),
                                        dz.data<T>(), loggate_ld(dz), z.size(0), z.size(1), o));
}

}  // namespace linac
