// GPU GEMM through cuBLASLt (math in matmul.h). cuBLASLt is column-major; a row-major
// C[M,N] is the column-major C^T[N,M] with the same leading dimension, and
//   C^T = op(B)^T op(A)^T,
// so cuBLASLt's first operand is our B (trans_b), its second our A (trans_a), with m = N, n = M.
// A row-major stored matrix [R, Cc] with row stride ld is a column-major [Cc, R] with the same ld.
//
// Each distinct problem gets a plan: descriptors plus the heuristic's best algorithm, built once
// and cached for the life of the process. The key holds everything the choice depends on:
// handle and device (an algorithm is only valid where it was chosen), shape, transposes,
// dtypes, strides, pointer alignment, workspace size and whether the bias epilogue is on (its
// pointer is set per call). Not alpha and beta: the heuristic never sees them, and an algorithm
// serves any values.
//
// Determinism. For a fixed algorithm cuBLAS gives bit-identical results run to run on the same
// GPU model and toolkit, provided the workspace it is handed is not shared with concurrent work
// (ours is ctx.workspace, ordered on ctx.stream). The cached plan fixes the algorithm. What is
// left is the split-K reduction scheme (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK); we allow
//   CUBLASLT_REDUCTION_SCHEME_NONE          no split-K: each dot product runs in one sequence;
//   CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE  partial sums kept in fp32 in the workspace and summed
//                                           by a separate kernel in a fixed order;
// and exclude
//   CUBLASLT_REDUCTION_SCHEME_INPLACE       partials added into C itself, in C's dtype, with
//                                           counters in the workspace that "guarantee the
//                                           sequentiality" (one at a time; no order is promised),
//                                           and a bf16 C would accumulate in bf16;
//   CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE   partials rounded to C's dtype (bf16) before the sum.
// The mask thus leaves only fp32 reductions in a fixed order (cuBLASLt documents no atomics-based
// scheme; cublasSetAtomicsMode concerns legacy cuBLAS routines, not cublasLtMatmul).
#include "matmul/matmul.h"

#if LINAC_WITH_CUDA

#include <cublasLt.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/cuda_check.h"

namespace linac {
namespace {

constexpr uint32_t kReductionMask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

struct PlanKey {
  void* handle;
  int device;
  int64_t m, n, k, batch, lda, ldb, ldc, stride_a, stride_b, stride_c;
  size_t workspace_bytes;
  uint32_t align_a, align_b, align_c;
  DType ab, c;
  bool trans_a, trans_b, tf32, bias;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = std::hash<void*>()(k.handle);
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {k.m, k.n, k.k, k.batch, k.lda, k.ldb, k.ldc, k.stride_a, k.stride_b, k.stride_c})
      mix(static_cast<uint64_t>(v));
    mix(k.workspace_bytes);
    mix(static_cast<uint64_t>(k.device));
    mix((uint64_t(k.align_a) << 32) | (uint64_t(k.align_b) << 16) | k.align_c);
    mix((uint64_t(k.ab) << 8) | uint64_t(k.c));
    mix(uint64_t(k.trans_a) | uint64_t(k.trans_b) << 1 | uint64_t(k.tf32) << 2 | uint64_t(k.bias) << 3);
    return h;
  }
};

// Descriptors in cuBLASLt's operand order: la is our B, lb our A, lc is C (and D).
// Destructors run at exit or while unwinding a failed build, so their status is not checked.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { LINAC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  void set(cublasLtMatmulPreferenceAttributes_t attr, uint32_t v) {
    LINAC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  }
  void set64(cublasLtMatmulPreferenceAttributes_t attr, uint64_t v) {
    LINAC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  }
};

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (up to 256, cuBLASLt's default assumption) dividing the address of every
// batch entry.
uint32_t alignment(const void* p, int64_t batch, int64_t batch_stride, DType dt) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride) * dtype_size(dt);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// Column-major view of a stored row-major [rows, cols] matrix (see the top of this file).
cublasLtMatrixLayout_t make_layout(DType dt, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  LINAC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(dt), static_cast<uint64_t>(cols),
                                                static_cast<uint64_t>(rows), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    LINAC_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    LINAC_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                        sizeof(batch_stride)));
  }
  return l;
}

std::string describe(const PlanKey& k) {
  return "matmul (cuBLASLt): M=" + std::to_string(k.m) + " N=" + std::to_string(k.n) + " K=" + std::to_string(k.k) +
         " batch=" + std::to_string(k.batch) + " trans_a=" + std::to_string(k.trans_a) +
         " trans_b=" + std::to_string(k.trans_b) + " A/B " + dtype_name(k.ab) + " C " + dtype_name(k.c) +
         " lda=" + std::to_string(k.lda) + " ldb=" + std::to_string(k.ldb) + " ldc=" + std::to_string(k.ldc) +
         " align A/B/C=" + std::to_string(k.align_a) + "/" + std::to_string(k.align_b) + "/" +
         std::to_string(k.align_c) + (k.tf32 ? " tf32" : "") + (k.bias ? " bias" : "");
}

std::unique_ptr<Plan> build_plan(const PlanKey& k) {
  auto plan = std::make_unique<Plan>();
  LINAC_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&plan->op, k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LINAC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LINAC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (k.bias) {  // a bias per row of cuBLASLt's column-major D, i.e. per column of our C
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LINAC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  // Stored shapes: B is [K,N] or [N,K], A is [M,K] or [K,M], C is [M,N].
  plan->la = make_layout(k.ab, k.trans_b ? k.n : k.k, k.trans_b ? k.k : k.n, k.ldb, k.batch, k.stride_b);
  plan->lb = make_layout(k.ab, k.trans_a ? k.k : k.m, k.trans_a ? k.m : k.k, k.lda, k.batch, k.stride_a);
  plan->lc = make_layout(k.c, k.m, k.n, k.ldc, k.batch, k.stride_c);

  Preference pref;
  pref.set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, k.workspace_bytes);
  pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, kReductionMask);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(k.handle), plan->op, plan->la,
                                     plan->lb, plan->lc, plan->lc, pref.p, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    LINAC_FAIL(describe(k) + ": no cuBLASLt algorithm supports this problem");
  LINAC_CUBLAS_CHECK(st);
  plan->algo = result.algo;
  return plan;
}

const Plan& plan_for(const PlanKey& key) {
  static std::mutex mu;
  static std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, build_plan(key)).first;
  return *it->second;  // plans are never removed, so the reference outlives the lock
}

}  // namespace

void matmul_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  LINAC_CHECK(a.dtype == b.dtype, "matmul (GPU): A and B must have the same dtype");
  LINAC_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F32, "matmul (GPU): A and B must be bf16 or f32");
  LINAC_CHECK(c.dtype == DType::F32 || (c.dtype == DType::BF16 && a.dtype == DType::BF16),
              "matmul (GPU): C must be f32, or bf16 with bf16 inputs");
  LINAC_CHECK(p.m <= INT32_MAX && p.n <= INT32_MAX && p.k <= INT32_MAX && p.batch <= INT32_MAX,
              "matmul (GPU): M, N, K and batch must fit in int32");
  if (!p.bias && matmul_skinny_applies(p, a, b, c)) return matmul_skinny_cuda(ctx, p, a, b, c);
  int device = 0;
  LINAC_CUDA_CHECK(cudaGetDevice(&device));
  const bool batched = p.batch > 1;
  PlanKey key{};
  key.handle = ctx.blaslt;
  key.device = device;
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.batch = p.batch;
  key.lda = p.lda;
  key.ldb = p.ldb;
  key.ldc = p.ldc;
  key.stride_a = batched ? p.batch_stride_a : 0;
  key.stride_b = batched ? p.batch_stride_b : 0;
  key.stride_c = batched ? p.batch_stride_c : 0;
  key.workspace_bytes = ctx.workspace_bytes;
  key.align_a = alignment(a.ptr, p.batch, p.batch_stride_a, a.dtype);
  key.align_b = alignment(b.ptr, p.batch, p.batch_stride_b, b.dtype);
  key.align_c = alignment(c.ptr, p.batch, p.batch_stride_c, c.dtype);
  key.ab = a.dtype;
  key.c = c.dtype;
  key.trans_a = p.trans_a;
  key.trans_b = p.trans_b;
  key.tf32 = p.tf32_exact && a.dtype == DType::F32;
  key.bias = p.bias != nullptr;
  const Plan& plan = plan_for(key);
  if (p.bias) {
    // The pointer is an attribute of the cached descriptor; cublasLtMatmul reads it as it enqueues,
    // and a plan serves one handle, which one thread drives at a time.
    const void* bias = p.bias;
    LINAC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  LINAC_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(ctx.blaslt), plan.op, &alpha, b.ptr, plan.la, a.ptr,
                                    plan.lb, &beta, c.ptr, plan.lc, c.ptr, plan.lc, &plan.algo, ctx.workspace,
                                    ctx.workspace_bytes, static_cast<cudaStream_t>(ctx.stream)));
}

}  // namespace linac

#endif  // LINAC_WITH_CUDA
