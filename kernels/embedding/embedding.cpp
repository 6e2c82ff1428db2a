// Embedding entry points: argument checks and device/dtype dispatch.
#include "embedding/embedding.h"

#include "core/dispatch.h"

namespace linac {

namespace {
void check_args(const Tensor& tokens, const Tensor& table, const Tensor& rows) {
  LINAC_CHECK(tokens.dtype == DType::I32 && tokens.ndim == 1 && tokens.is_contiguous(),
              "embedding: tokens must be [N] i32 contiguous, got " + tokens.shape_str());
  LINAC_CHECK(table.ndim == 2 && table.is_contiguous(), "embedding: table must be [V, d] contiguous");
  LINAC_CHECK(rows.ndim == 2 && rows.is_contiguous() && rows.size(0) == tokens.size(0) &&
                  rows.size(1) == table.size(1),
              "embedding: expected [N, d] = [" + std::to_string(tokens.size(0)) + "," +
                  std::to_string(table.size(1)) + "], got " + rows.shape_str());
}
}  // namespace

void embedding_fwd(const Ctx& ctx, const Tensor& tokens, const Tensor& table, const Tensor& out) {
  check_args(tokens, table, out);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    embedding_fwd_cuda(ctx, tokens, table, out);
    return;
  }
  LINAC_CHECK(table.dtype == out.dtype, "embedding: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(table.dtype, T,
                     embedding_fwd_cpu<T>(tokens.data<int32_t>(), table.data<T>(), out.data<T>(), out.size(0),
                                          table.size(0), table.size(1)));
}

void embedding_bwd(const Ctx& ctx, const Tensor& tokens, const Tensor& dout, const Tensor& dtable) {
  check_args(tokens, dtable, dout);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    embedding_bwd_cuda(ctx, tokens, dout, dtable);
    return;
  }
  LINAC_CHECK(dout.dtype == dtable.dtype, "embedding: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(dtable.dtype, T,
                     embedding_bwd_cpu<T>(tokens.data<int32_t>(), dout.data<T>(), dtable.data<T>(), dout.size(0),
                                          dtable.size(0), dtable.size(1)));
}

size_t embedding_bwd_workspace_bytes(int64_t n) {
#if LINAC_WITH_CUDA
  return embedding_bwd_workspace_bytes_cuda(n);
#else
  return 0;
#endif
}

}  // namespace linac
