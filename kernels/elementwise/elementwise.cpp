// Elementwise entry points: argument checks and device/dtype dispatch.
#include "elementwise/elementwise.h"

#include "core/buffer.h"
#include "core/dispatch.h"

namespace linac {

namespace {
void check_pair(const char* op, const Tensor& dst, const Tensor& src) {
  LINAC_CHECK(dst.is_contiguous() && src.is_contiguous(), std::string(op) + ": tensors must be contiguous");
  LINAC_CHECK(dst.numel() == src.numel(), std::string(op) + ": size mismatch " + dst.shape_str() + " vs " +
                                              src.shape_str());
}
}  // namespace

void add_inplace(const Ctx& ctx, const Tensor& dst, const Tensor& src, float alpha) {
  check_pair("add_inplace", dst, src);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    add_inplace_cuda(ctx, dst, src, alpha);
    return;
  }
  LINAC_CHECK(dst.dtype == src.dtype, "add_inplace: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(dst.dtype, T, add_inplace_cpu<T>(dst.data<T>(), src.data<T>(), alpha, dst.numel()));
}

void cast(const Ctx& ctx, const Tensor& dst, const Tensor& src) {
  check_pair("cast", dst, src);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    cast_cuda(ctx, dst, src);
    return;
  }
  // The CPU kernels take f32/f64 only; bf16 (gradients reduced in bf16 on CPU ranks) goes through
  // the host conversion, which rounds like the GPU.
  if (dst.dtype == DType::BF16 || src.dtype == DType::BF16) {
    convert_host(dst, src);
    return;
  }
  LINAC_CPU_DISPATCH(dst.dtype, TD,
                     LINAC_CPU_DISPATCH(src.dtype, TS, cast_cpu<TD, TS>(dst.data<TD>(), src.data<TS>(), dst.numel())));
}

void scale_inplace(const Ctx& ctx, const Tensor& x, double s) {
  LINAC_CHECK(x.is_contiguous(), "scale_inplace: tensor must be contiguous");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    scale_inplace_cuda(ctx, x, static_cast<float>(s));
    return;
  }
  LINAC_CPU_DISPATCH(x.dtype, T, scale_inplace_cpu<T>(x.data<T>(), s, x.numel()));
}

void increment_i32(const Ctx& ctx, const Tensor& x) {
  LINAC_CHECK(x.is_contiguous() && x.dtype == DType::I32, "increment_i32: tensor must be contiguous int32");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    increment_i32_cuda(ctx, x);
    return;
  }
  increment_i32_cpu(x.data<int32_t>(), x.numel());
}

}  // namespace linac
