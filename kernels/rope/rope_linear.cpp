// Attention input projection with RoPE: argument checks and the choice between the fused Hopper
// kernel and matmul + rope_fwd.
#include "rope/rope_linear.h"

#include <string>
#include <string_view>

#include "matmul/matmul.h"
#include "rope/rope.h"

namespace linac {

const char* rope_linear_gpu_kernel(const Tensor& x, const Tensor& w, const Tensor& y, int64_t head_dim) {
  const bool hopper = hopper_kernels_allowed("LINAC_ROPE_LINEAR_KERNELS");
  const bool bf16 = x.dtype == DType::BF16 && w.dtype == DType::BF16 && y.dtype == DType::BF16;
  if (LINAC_WITH_SM90A && hopper && bf16 && (head_dim == 64 || head_dim == 96 || head_dim == 128) &&
      fused_gemm_operand_ok(x) && fused_gemm_operand_ok(w) && fused_gemm_operand_ok(y) &&
      gpu_compute_capability() == 90)
    return "fused_sm90";
  return "composite";
}

void rope_linear_fwd(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, int64_t T, int64_t n_rot,
                     int64_t head_dim, const RopeFreqs& freqs, const DocBounds& docs, int64_t rot_begin) {
  LINAC_CHECK(x.ndim == 2 && w.ndim == 2 && y.ndim == 2 && w.size(1) == x.size(1) && y.size(0) == x.size(0) &&
                  y.size(1) == w.size(0),
              "rope_linear_fwd: expected x [N, K], W [M, K], y [N, M], got " + x.shape_str() + ", " + w.shape_str() +
                  ", " + y.shape_str());
  LINAC_CHECK(y.is_contiguous(), "rope_linear_fwd: y must be contiguous");
  const int64_t n = x.size(0), m = w.size(0);
  LINAC_CHECK(T > 0 && n % T == 0, "rope_linear_fwd: " + std::to_string(n) +
                                       " rows are not sequences of T = " + std::to_string(T) + " tokens");
  LINAC_CHECK(head_dim > 0 && rot_begin >= 0 && n_rot >= 0 && rot_begin + n_rot <= m && rot_begin % head_dim == 0 &&
                  n_rot % head_dim == 0,
              "rope_linear_fwd: the rotated columns [" + std::to_string(rot_begin) + ", " +
                  std::to_string(rot_begin + n_rot) + ") must be whole heads of " + std::to_string(head_dim) +
                  " within M = " + std::to_string(m));
  if (n_rot > 0 && ctx.is_gpu() && std::string_view(rope_linear_gpu_kernel(x, w, y, head_dim)) == "fused_sm90") {
#if LINAC_WITH_SM90A
    LINAC_CHECK(T <= (int64_t(1) << 24), "rope_linear_fwd: positions must be exact in f32 (T < 2^24)");
    const size_t table_bytes = static_cast<size_t>(T * head_dim / 2) * 2 * sizeof(float);
    LINAC_CHECK(table_bytes <= ctx.workspace_bytes, "rope_linear_fwd: the (cos, sin) table of T = " +
                                                        std::to_string(T) + " does not fit the GPU workspace");
    FusedGemmProfile prof(ctx, "GEMM with RoPE", "GEMM+RoPE", n, m, x.size(1));
    if (n == 0) return;
    auto* table = static_cast<float*>(ctx.workspace);
    rope_table_cuda(ctx, freqs, head_dim, T, table);
    rope_linear_fwd_sm90(ctx, x, w, y, T, rot_begin, n_rot, head_dim, table, docs.start);
    return;
#endif
  }
  matmul(ctx, x, false, w, true, y);
  if (n_rot == 0 || n == 0) return;
  // y's columns [rot_begin, rot_begin + n_rot) as [B, T, heads, head_dim] with token stride M.
  Tensor rot(static_cast<char*>(y.ptr) + rot_begin * dtype_size(y.dtype), y.dtype, y.device,
             {n / T, T, n_rot / head_dim, head_dim});
  rot.strides = {T * m, m, head_dim, 1};
  rope_fwd(ctx, rot, freqs, 0, docs);
}

}  // namespace linac
