// Matrix multiplication (GEMM) on row-major 2-D operands, optionally batched:
//   C[M,N] = alpha * op(A) @ op(B) + beta * C,      op(X) = X or X^T
//   A is stored [M,K] (trans_a = false) or [K,M] (trans_a = true)
//   B is stored [K,N] (trans_b = false) or [N,K] (trans_b = true)
// beta = 0 never reads C (it may hold NaN); beta = 1 accumulates into C.
//
// Linear layers keep W as [out, in] (PyTorch convention):
//   Y  = X W^T    matmul(ctx, X,  false, W, true,  Y)
//   dX = dY W     matmul(ctx, dY, false, W, false, dX)
//   dW += dY^T X  matmul(ctx, dY, true,  X, false, dW, 1, 1)
//
// Layouts: each operand is a 2-D tensor whose rows may be strided (strides[1] == 1,
// strides[0] >= cols), e.g. a narrow() of a wider buffer. matmul_batched takes 3-D tensors
// [batch, rows, cols]; strides[0] is each operand's batch stride (0 broadcasts A or B over the
// batch; C's batches must not overlap). K >= 1; C must not overlap A or B.
//
// Dtypes. GPU (cuBLASLt, or matmul_skinny below for up to 16 rows of A; fp32 accumulation): A
// and B both bf16 with C bf16 or f32 (bf16 x bf16 -> f32 is the weight-gradient / logits path),
// or A, B, C all f32, computed in true fp32 (CUBLAS_COMPUTE_32F) unless GemmProblem::tf32_exact
// says that every A and B value is exactly a TF32 number (e.g. a bf16 value, or a hi/lo split):
// then the TF32 tensor cores give the same products, accumulated in fp32. CPU: A, B, C all f32
// or all f64.
//
// Determinism: the CPU sums every C element's K terms in one fixed order whatever the thread
// count; the GPU uses one cached cuBLASLt algorithm per problem and allows only split-K schemes
// that reduce in fp32 in a fixed order (matmul_cublaslt.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "core/gpu.h"
#include "core/profiler.h"
#include "core/tensor.h"

namespace linac {

// One strided-batched problem after the entry point has checked its operands (k >= 1). Leading
// dimensions are row strides of the stored (row-major) matrices, in elements.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;
  double alpha = 1, beta = 0;  // f32 on the GPU; the CPU computes in its dtype (fp64 checks)
  bool tf32_exact = false;     // f32 operands: all values exact in TF32 (the caller's promise)
  const void* bias = nullptr;  // matmul_bias: [n] in C's dtype, added to every row of C
  const void* c_in = nullptr;  // matmul_add: the addend when it is another buffer than C (beta 1)
};

template <class T>
void matmul_cpu(const GemmProblem& p, const T* a, const T* b, T* c);
// C[i, j] += bias[j] for every row i (matmul_bias's CPU epilogue, after matmul_cpu).
template <class T>
void add_bias_rows_cpu(const GemmProblem& p, const T* bias, T* c);
// C[i, j] = c_in[i, j], both at row stride p.ldc (matmul_add's addend, before matmul_cpu with beta 1).
template <class T>
void copy_rows_cpu(const GemmProblem& p, const T* c_in, T* c);

void matmul_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c);

// Decoding's products (matmul_skinny.cu): C = alpha A W^T + beta C for at most kSkinnyMaxRows
// rows of A, bf16 A and W, bf16 or f32 C, K and the row strides multiples of 8, A and W 16-byte
// aligned, A's rows (padded to 8 or 16) fitting in shared memory. matmul_cuda sends such problems
// there: a kernel that streams W once on the tensor cores, where cuBLASLt's tiles read it at a
// fraction of the bandwidth (kernels/matmul/NOTES.md has the measurements).
constexpr int64_t kSkinnyMaxRows = 16;
bool matmul_skinny_applies(const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c);
void matmul_skinny_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c);

// Decoding's MLP output in one launch (GPU): C = glu(H) W^T for H [M, 2F] bf16, W [N, F], C [M, N]
// bf16, glu(H) = act(H[:, :F]) * H[:, F:] as swiglu.h defines it, rounded to bf16 as swiglu_fwd
// rounds it: bitwise swiglu_fwd followed by matmul, for the problems the skinny kernel takes
// (matmul_skinny_glu_applies; otherwise run those two). Every CTA forms all of glu(H) for itself,
// so it pays for small batches only: callers use it up to kSkinnyGluMaxRows rows.
constexpr int64_t kSkinnyGluMaxRows = 4;
enum class GluAct;  // swiglu/swiglu.h
bool matmul_skinny_glu_applies(const Tensor& h, const Tensor& w, const Tensor& c);
void matmul_skinny_glu(const Ctx& ctx, const Tensor& h, const Tensor& w, const Tensor& c, GluAct act);

// Entry points: check shapes, strides and dtypes, dispatch on ctx.device.
void matmul(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            double alpha = 1, double beta = 0);
void matmul_batched(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                    double alpha = 1, double beta = 0);
// C = op(A) @ op(B) + C_in, 2-D: C_in [M, N] in C's dtype with C's row stride, either C itself (beta
// 1) or a buffer that does not overlap C and is left as it was. On the GPU the addend is read by
// cuBLASLt's epilogue (the sum rounded to C's dtype once), so a residual add costs no pass of its
// own; on the CPU C_in is copied into C first. An empty C_in makes it matmul.
void matmul_add(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                const Tensor& c);
// C = op(A) @ op(B) + 1 bias^T [+ C_in as matmul_add takes it]: bias [N] in C's dtype, 16-byte
// aligned, added to every row. On the GPU it is cuBLASLt's bias epilogue (the sum rounded to C's
// dtype once; no skinny path); on the CPU a pass over C after the product.
void matmul_bias(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                 const Tensor& c, const Tensor& c_in = Tensor());

// Floating-point operations of one call, 2*M*N*K*batch, for benchmarks and MFU.
inline double matmul_flops(int64_t m, int64_t n, int64_t k, int64_t batch = 1) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
}

// Whether t can be an operand of one of our Hopper GEMM kernels with a fused epilogue, which copy
// it by TMA: a contiguous matrix whose base and rows are 16-byte aligned (bf16: width a multiple of 8).
inline bool fused_gemm_operand_ok(const Tensor& t) {
  return t.ndim == 2 && t.is_contiguous() && reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.size(1) % 8 == 0;
}

// Profile regions of one of our GEMM kernels with a fused epilogue (not cuBLASLt's): an op of its
// own (e.g. "GEMM with the SwiGLU gate") and, inside it, the problem "<what> M x N x K" with its FLOPs.
class FusedGemmProfile {
 public:
  FusedGemmProfile(const Ctx& ctx, const char* op, const char* what, int64_t m, int64_t n, int64_t k);

 private:
  ProfileScope op_;
  std::string name_;
  ProfileScope problem_;
};

}  // namespace linac
