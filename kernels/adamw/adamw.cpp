// AdamW entry point: argument checks and device/dtype dispatch.
#include "adamw/adamw.h"

#include "core/dispatch.h"

namespace linac {

void adamw_step(const Ctx& ctx, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& compute_copy, const AdamWArgs& a) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&param, &grad, &m, &v})
    LINAC_CHECK(t->is_contiguous() && t->numel() == n, "adamw: param, grad, m, v must be contiguous with " +
                                                           std::to_string(n) + " elements, got " + t->shape_str());
  LINAC_CHECK(!compute_copy.defined() || (compute_copy.is_contiguous() && compute_copy.numel() == n),
              "adamw: compute_copy must be contiguous with param's size");
  LINAC_CHECK(a.step >= 1, "adamw: step is 1-based");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    adamw_step_cuda(ctx, param, grad, m, v, compute_copy, a);
    return;
  }
  LINAC_CHECK(grad.dtype == param.dtype && m.dtype == param.dtype && v.dtype == param.dtype &&
                  (!compute_copy.defined() || compute_copy.dtype == param.dtype),
              "adamw: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(param.dtype, T,
                     adamw_step_cpu<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
                                       compute_copy.data<T>(), n, a));
}

}  // namespace linac
