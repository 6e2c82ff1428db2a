// Reduction entry points: argument checks and device/dtype dispatch.
#include "reduce/reduce.h"

#include "core/dispatch.h"

namespace linac {

namespace {
void check_args(const Tensor& x, const Tensor& out) {
  LINAC_CHECK(x.is_contiguous(), "reduce: x must be contiguous, got " + x.shape_str());
  LINAC_CHECK(out.numel() == 1, "reduce: out must have one element, got " + out.shape_str());
}
}  // namespace

void sum_squares(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  check_args(x, out);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    sum_squares_cuda(ctx, x, out);
    return;
  }
  LINAC_CHECK(x.dtype == out.dtype, "sum_squares: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, sum_squares_cpu<T>(x.data<T>(), out.data<T>(), x.numel()));
}

void sum(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  check_args(x, out);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    sum_cuda(ctx, x, out);
    return;
  }
  LINAC_CHECK(x.dtype == out.dtype, "sum: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, sum_cpu<T>(x.data<T>(), out.data<T>(), x.numel()));
}

void count_nonfinite(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  check_args(x, out);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    count_nonfinite_cuda(ctx, x, out);
    return;
  }
  LINAC_CHECK(x.dtype == out.dtype, "count_nonfinite: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(x.dtype, T, count_nonfinite_cpu<T>(x.data<T>(), out.data<T>(), x.numel()));
}

uint64_t hash_words(const Ctx& ctx, const Tensor& x, uint64_t seed) {
  LINAC_CHECK(x.is_contiguous(), "hash_words: x must be contiguous, got " + x.shape_str());
  LINAC_CHECK(x.device == ctx.device, "hash_words: x must be on the context's device");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    return hash_words_cuda(ctx, x, seed);
  }
  return hash_words_cpu(x.ptr, static_cast<int64_t>(x.nbytes()), seed);
}

}  // namespace linac
