// Matmul entry points: operand checks, the row-major problem description, device/dtype dispatch.
#include <algorithm>
#include <string>

#include "core/dispatch.h"
#include "core/profiler.h"
#include "matmul/matmul.h"

namespace linac {

namespace {

// The stored matrix of a 2-D operand, or of each batch entry of a 3-D one.
struct Stored {
  int64_t rows, cols, ld, batch, batch_stride;
};

Stored stored_of(const Tensor& t, bool batched, const char* name) {
  const int nd = batched ? 3 : 2, r = nd - 2, c = nd - 1;
  LINAC_CHECK(t.ndim == nd, std::string("matmul: ") + name + " must be " + (batched ? "3-D" : "2-D") + ", got " +
                                t.shape_str());
  Stored s{t.shape[r], t.shape[c], 0, batched ? t.shape[0] : 1, batched ? t.strides[0] : 0};
  // A single row or column has no meaningful stride of its own (select/narrow may leave any).
  LINAC_CHECK(s.cols <= 1 || t.strides[c] == 1, std::string("matmul: ") + name + "'s rows must be contiguous");
  s.ld = s.rows > 1 ? t.strides[r] : std::max<int64_t>(s.cols, 1);
  LINAC_CHECK(s.ld >= s.cols, std::string("matmul: ") + name + "'s row stride is smaller than its row");
  LINAC_CHECK(s.batch_stride >= 0, std::string("matmul: ") + name + " has a negative batch stride");
  return s;
}

GemmProblem problem_of(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                       double alpha, double beta, bool batched) {
  LINAC_CHECK(a.device == ctx.device && b.device == ctx.device && c.device == ctx.device,
              "matmul: operands must live on the context's device");
  const Stored sa = stored_of(a, batched, "A"), sb = stored_of(b, batched, "B"), sc = stored_of(c, batched, "C");
  GemmProblem p;
  p.m = trans_a ? sa.cols : sa.rows;
  p.k = trans_a ? sa.rows : sa.cols;
  p.n = trans_b ? sb.rows : sb.cols;
  const int64_t kb = trans_b ? sb.cols : sb.rows;
  const std::string what = std::string("matmul: A") + a.shape_str() + (trans_a ? "^T" : "") + " @ B" + b.shape_str() +
                           (trans_b ? "^T" : "") + " -> C" + c.shape_str();
  LINAC_CHECK(kb == p.k && sc.rows == p.m && sc.cols == p.n, what + ": shapes disagree");
  LINAC_CHECK(sa.batch == sc.batch && sb.batch == sc.batch, what + ": batch sizes disagree");
  LINAC_CHECK(p.k >= 1, what + ": K must be at least 1");
  LINAC_CHECK(sc.batch <= 1 || sc.batch_stride >= (sc.rows - 1) * sc.ld + sc.cols, what + ": C's batches overlap");
  p.batch = sc.batch;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.lda = sa.ld;
  p.ldb = sb.ld;
  p.ldc = sc.ld;
  p.batch_stride_a = sa.batch_stride;
  p.batch_stride_b = sb.batch_stride;
  p.batch_stride_c = sc.batch_stride;
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

// "GEMM M x N x K [xbatch] A^T B bf16>f32": the profile's name of a problem.
std::string problem_name(const GemmProblem& p, DType ab, DType c) {
  return "GEMM " + std::to_string(p.m) + " x " + std::to_string(p.n) + " x " + std::to_string(p.k) +
         (p.batch > 1 ? " x" + std::to_string(p.batch) : "") + (p.trans_a ? " A^T" : " A") +
         (p.trans_b ? " B^T " : " B ") + dtype_name(ab) + ">" + dtype_name(c) + (p.beta != 0.f ? " +C" : "");
}

}  // namespace

FusedGemmProfile::FusedGemmProfile(const Ctx& ctx, const char* op, const char* what, int64_t m, int64_t n, int64_t k)
    : op_(ctx, op, Profiler::Level::Op),
      name_(ctx.profiler
                ? std::string(what) + " " + std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k)
                : std::string()),
      problem_(ctx, name_.c_str(), Profiler::Level::Shape, matmul_flops(m, n, k)) {}

namespace {

// Sets p's addend (matmul_add): C itself is beta 1, another buffer p.c_in as well.
void set_addend(GemmProblem& p, const Tensor& c_in, const Tensor& c) {
  if (!c_in.ptr) return;
  LINAC_CHECK(c_in.device == c.device && c_in.dtype == c.dtype && c_in.ndim == 2 && c_in.size(0) == p.m &&
                  c_in.size(1) == p.n && (p.m <= 1 || c_in.strides[0] == p.ldc) && (p.n <= 1 || c_in.strides[1] == 1),
              "matmul_add: C_in must be [" + std::to_string(p.m) + ", " + std::to_string(p.n) +
                  "] in C's dtype with C's row stride, got " + c_in.shape_str());
  p.beta = 1;
  if (c_in.ptr == c.ptr || p.m == 0 || p.n == 0) return;
  const auto lo = [](const Tensor& t) { return static_cast<const char*>(t.ptr); };
  const auto hi = [&p](const Tensor& t) {
    return static_cast<const char*>(t.ptr) + ((p.m - 1) * p.ldc + p.n) * static_cast<int64_t>(dtype_size(t.dtype));
  };
  LINAC_CHECK(hi(c_in) <= lo(c) || hi(c) <= lo(c_in), "matmul_add: C_in must be C itself or not overlap it");
  p.c_in = c_in.ptr;
}

void run(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  ProfileScope prof(ctx, "GEMM", Profiler::Level::Op);
  const std::string name = ctx.profiler ? problem_name(p, a.dtype, c.dtype) : std::string();
  ProfileScope by_problem(ctx, name.c_str(), Profiler::Level::Shape, matmul_flops(p.m, p.n, p.k, p.batch));
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    matmul_cuda(ctx, p, a, b, c);
#endif
    return;
  }
  LINAC_CHECK(a.dtype == c.dtype && b.dtype == c.dtype, "matmul: CPU dtypes must agree");
  LINAC_CPU_DISPATCH(c.dtype, T, {
    if (p.c_in) copy_rows_cpu<T>(p, static_cast<const T*>(p.c_in), c.data<T>());
    matmul_cpu<T>(p, a.data<T>(), b.data<T>(), c.data<T>());
    if (p.bias) add_bias_rows_cpu<T>(p, static_cast<const T*>(p.bias), c.data<T>());
  });
}

}  // namespace

void matmul(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
            double beta) {
  run(ctx, problem_of(ctx, a, trans_a, b, trans_b, c, alpha, beta, false), a, b, c);
}

void matmul_batched(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                    double alpha, double beta) {
  run(ctx, problem_of(ctx, a, trans_a, b, trans_b, c, alpha, beta, true), a, b, c);
}

void matmul_add(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                const Tensor& c) {
  GemmProblem p = problem_of(ctx, a, trans_a, b, trans_b, c, 1, 0, false);
  set_addend(p, c_in, c);
  run(ctx, p, a, b, c);
}

void matmul_bias(const Ctx& ctx, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                 const Tensor& c, const Tensor& c_in) {
  GemmProblem p = problem_of(ctx, a, trans_a, b, trans_b, c, 1, 0, false);
  set_addend(p, c_in, c);
  LINAC_CHECK(bias.device == ctx.device && bias.dtype == c.dtype && bias.is_contiguous() && bias.numel() == p.n,
              "matmul_bias: bias must be a contiguous [" + std::to_string(p.n) + "] vector in C's dtype, got " +
                  bias.shape_str());
  LINAC_CHECK(reinterpret_cast<uintptr_t>(bias.ptr) % 16 == 0, "matmul_bias: bias must be 16-byte aligned");
  p.bias = bias.ptr;
  run(ctx, p, a, b, c);
}

}  // namespace linac
