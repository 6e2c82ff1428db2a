// GPU GEMM through cuBLASLt (math in matmul.h). cuBLASLt is column-major; a row-major
// C[M,N] is the column-major C^T[N,M] with the same leading dimension, and
//   C^T = op(B)^T op(A)^T,
// so cuBLASLt's first operand is our B (trans_b), its second our A (trans_a), with m = N, n = M.
// A row-major stored matrix [R, Cc] with row stride ld is a column-major [Cc, R] with the same ld.
//
// Each distinct problem gets a plan: descriptors plus the heuristic's best algorithm (or the one an
// installed table names, matmul_algos.h), built once and cached for the life of the process. The key holds everything
// the choice depends on: handle and device (an algorithm is only valid where it was chosen), shape, transposes, dtypes,
// strides, pointer alignment, workspace size and whether the bias epilogue is on (its pointer is set per call). Not
// alpha and beta: the heuristic never sees them, and an algorithm serves any values.
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
#include "core/dispatch.h"
#include "core/error.h"
#include "matmul/matmul.h"
#include "matmul/matmul_algos.h"

#if LINAC_WITH_CUDA
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cublaslt.h"
#include "core/cuda_check.h"
#include "core/gpu.h"

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

// A problem's state while tuning: its candidates, the calls in flight and the times measured.
// Its events are destroyed unchecked (at exit the runtime may be gone).
struct Tuning {
  struct Pending {
    int candidate;
    cudaEvent_t start, stop;
  };
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's first `heuristic`, then screened ones
  int heuristic = 0;
  std::vector<std::vector<float>> us;  // per candidate, each timed call
  std::vector<Pending> pending;
  int64_t calls = 0;
  Tuning() = default;
  Tuning(const Tuning&) = delete;
  Tuning& operator=(const Tuning&) = delete;
  ~Tuning() {
    for (const auto& e : pending) cudaEventDestroy(e.start), cudaEventDestroy(e.stop);
  }
};

// Descriptors in cuBLASLt's operand order: la is our B, lb our A, lc is C (and D).
// Destructors run at exit or while unwinding a failed build, so their status is not checked.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::string problem;  // problem_id of its key
  std::unique_ptr<Tuning> tuning;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lc) cublaslt().cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublaslt().cublasLtMatrixLayoutDestroy(lb);
    if (la) cublaslt().cublasLtMatrixLayoutDestroy(la);
    if (op) cublaslt().cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublaslt().cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  void set(cublasLtMatmulPreferenceAttributes_t attr, uint32_t v) {
    LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  }
  void set64(cublasLtMatmulPreferenceAttributes_t attr, uint64_t v) {
    LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
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
  LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatrixLayoutCreate(&l, cuda_type(dt), static_cast<uint64_t>(cols),
                                                           static_cast<uint64_t>(rows), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    LINAC_CUBLAS_CHECK(
        cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                   &batch_stride, sizeof(batch_stride)));
  }
  return l;
}

// Everything in the key but the handle and device, in words: a table's name for the problem.
std::string problem_id(const PlanKey& k) {
  auto n = [](int64_t v) { return std::to_string(v); };
  std::string s = "M=" + n(k.m) + " N=" + n(k.n) + " K=" + n(k.k) + " batch=" + n(k.batch) +
                  " trans_a=" + n(k.trans_a) + " trans_b=" + n(k.trans_b) + " A/B " + dtype_name(k.ab) + " C " +
                  dtype_name(k.c) + " lda=" + n(k.lda) + " ldb=" + n(k.ldb) + " ldc=" + n(k.ldc);
  if (k.batch > 1) s += " strides A/B/C=" + n(k.stride_a) + "/" + n(k.stride_b) + "/" + n(k.stride_c);
  return s + " align A/B/C=" + n(k.align_a) + "/" + n(k.align_b) + "/" + n(k.align_c) + (k.tf32 ? " tf32" : "") +
         (k.bias ? " bias" : "") + " workspace=" + n(static_cast<int64_t>(k.workspace_bytes));
}

std::string describe(const PlanKey& k) { return "matmul (cuBLASLt): " + problem_id(k); }

// The heuristic's preference for a key: the workspace, fixed-order fp32 split-K only (see the top
// of this file), and the operands' alignments (in cuBLASLt's order: its A is our B).
std::unique_ptr<Preference> preference(const PlanKey& k) {
  auto pref = std::make_unique<Preference>();
  pref->set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, k.workspace_bytes);
  pref->set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, kReductionMask);
  pref->set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);
  pref->set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
  pref->set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
  pref->set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c);
  return pref;
}

// The heuristic's first `count` algorithms for a planned key, best first.
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(const PlanKey& k, const Plan& plan, int count) {
  std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(count));
  int found = 0;
  const cublasStatus_t st =
      cublaslt().cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(k.handle), plan.op, plan.la, plan.lb,
                                                plan.lc, plan.lc, preference(k)->p, count, res.data(), &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    LINAC_FAIL(describe(k) + ": no cuBLASLt algorithm supports this problem");
  LINAC_CUBLAS_CHECK(st);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) algos.push_back(res[static_cast<size_t>(i)].algo);
  return algos;
}

// Configurations past the heuristic's list (tuning only; matmul_algos.h): every algorithm id's
// tiles, split along K into 1-4 parts (the fixed-order fp32 reduction only, as kReductionMask
// allows), in cluster shapes auto, 1x1, 2x1 and 1x2, at the stages the heuristic's first choice
// uses, where cuBLASLt accepts them for this problem, its alignments and its workspace. The
// heuristic offers few of them: for the weight gradient 2048 x 5632 x 16384 (cuBLASLt's m = 5632)
// its eight are split-K schemes and one 64 x 384 tile, while 88 x 256 tiles in 2x1 clusters (512
// whole tiles, 3.9 waves on 132 SMs) run 9% faster than its first (kernels/matmul/NOTES.md). Each
// configuration is timed on the call's own A and B and a scratch C, once, then the fastest
// kScreenShortlist three times more; returns the `keep` fastest by median that `skip` does not
// hold. Synchronises the stream (tuning steps are eager).
constexpr int kScreenShortlist = 24;

std::vector<cublasLtMatmulAlgo_t> screened_algos(const PlanKey& k, const Plan& plan, const void* a, const void* b,
                                                 float beta, void* workspace, cudaStream_t stream,
                                                 const std::vector<cublasLtMatmulAlgo_t>& skip, int keep) {
  const auto lt = static_cast<cublasLtHandle_t>(k.handle);
  const cublasComputeType_t compute = k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t ab = cuda_type(k.ab), c = cuda_type(k.c);
  int ids[128], n_ids = 0;
  LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmulAlgoGetIds(lt, compute, CUDA_R_32F, ab, ab, c, c, 128, ids, &n_ids));
  uint32_t stages = 0;
  size_t written = 0;
  cublaslt().cublasLtMatmulAlgoConfigGetAttribute(&skip.at(0), CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                                  &written);
  auto same = [](const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
    return std::memcmp(x.data, y.data, sizeof(x.data)) == 0;
  };
  std::vector<cublasLtMatmulAlgo_t> configs;
  for (int i = 0; i < n_ids; ++i) {
    cublasLtMatmulAlgo_t base{};
    if (cublaslt().cublasLtMatmulAlgoInit(lt, compute, CUDA_R_32F, ab, ab, c, c, ids[i], &base) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    uint32_t align[4] = {}, red_mask = 0;
    int32_t splits_ok = 0;
    const cublasLtMatmulAlgoCapAttributes_t align_caps[4] = {
        CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES};
    for (int j = 0; j < 4; ++j)
      cublaslt().cublasLtMatmulAlgoCapGetAttribute(&base, align_caps[j], &align[j], sizeof(align[j]), &written);
    if (align[0] > k.align_b || align[1] > k.align_a || align[2] > k.align_c || align[3] > k.align_c) continue;
    cublaslt().cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splits_ok, sizeof(splits_ok),
                                                 &written);
    cublaslt().cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask,
                                                 sizeof(red_mask), &written);
    const int max_splits = splits_ok && (red_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ? 4 : 1;
    size_t bytes = 0;
    cublaslt().cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes);
    std::vector<uint32_t> tiles(std::max<size_t>(1, bytes / sizeof(uint32_t)), CUBLASLT_MATMUL_TILE_UNDEFINED);
    if (bytes)
      cublaslt().cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &written);
    for (uint32_t tile : tiles)
      for (int32_t splits = 1; splits <= max_splits; ++splits)
        for (uint16_t cluster : {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1}) {
          cublasLtMatmulAlgo_t x = base;
          const uint32_t red = splits > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
          cublaslt().cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
          cublaslt().cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages));
          cublaslt().cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
          cublaslt().cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red));
          cublaslt().cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                          sizeof(cluster));
          cublasLtMatmulHeuristicResult_t check{};
          if (cublaslt().cublasLtMatmulAlgoCheck(lt, plan.op, plan.la, plan.lb, plan.lc, plan.lc, &x, &check) !=
                  CUBLAS_STATUS_SUCCESS ||
              check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > k.workspace_bytes)
            continue;
          if (std::none_of(skip.begin(), skip.end(), [&](const auto& y) { return same(x, y); }) &&
              std::none_of(configs.begin(), configs.end(), [&](const auto& y) { return same(x, y); }))
            configs.push_back(x);
        }
  }
  if (configs.empty()) return {};
  const size_t c_bytes = static_cast<size_t>((k.batch - 1) * k.stride_c + (k.m - 1) * k.ldc + k.n) * dtype_size(k.c);
  const std::unique_ptr<void, void (*)(void*)> scratch(gpu_malloc(c_bytes), gpu_free);
  cudaEvent_t start = nullptr, stop = nullptr;
  LINAC_CUDA_CHECK(cudaEventCreate(&start));
  LINAC_CUDA_CHECK(cudaEventCreate(&stop));
  // Milliseconds of one call with configs[i]; < 0 where cuBLASLt refuses to run it.
  auto time_once = [&](size_t i) {
    const float alpha = 1;
    LINAC_CUDA_CHECK(cudaEventRecord(start, stream));
    const cublasStatus_t st =
        cublaslt().cublasLtMatmul(lt, plan.op, &alpha, b, plan.la, a, plan.lb, &beta, scratch.get(), plan.lc,
                                  scratch.get(), plan.lc, &configs[i], workspace, k.workspace_bytes, stream);
    LINAC_CUDA_CHECK(cudaEventRecord(stop, stream));
    LINAC_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LINAC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return st == CUBLAS_STATUS_SUCCESS ? ms : -1.f;
  };
  std::vector<std::pair<float, size_t>> ranked;  // (ms, config)
  for (size_t i = 0; i < configs.size(); ++i) {
    if (time_once(i) < 0) continue;  // the first call may load the kernel
    ranked.emplace_back(time_once(i), i);
  }
  std::sort(ranked.begin(), ranked.end());
  ranked.resize(std::min<size_t>(ranked.size(), kScreenShortlist));
  for (auto& [ms, i] : ranked) {
    float t[3] = {ms, time_once(i), time_once(i)};
    std::sort(t, t + 3);
    ms = t[1];
  }
  std::sort(ranked.begin(), ranked.end());
  LINAC_CUDA_CHECK(cudaEventDestroy(start));
  LINAC_CUDA_CHECK(cudaEventDestroy(stop));
  std::vector<cublasLtMatmulAlgo_t> out;
  for (size_t j = 0; j < ranked.size() && out.size() < static_cast<size_t>(keep); ++j)
    out.push_back(configs[ranked[j].second]);
  return out;
}

// Installed choices (gemm_algos_install) by problem, and where they came from.
struct Installed {
  std::unordered_map<std::string, std::array<uint64_t, 8>> algos;
  std::string source;
};

// Sets plan.algo to an installed choice for its problem, if there is one that cuBLASLt accepts.
void apply_installed(const PlanKey& k, Plan& plan, const Installed& inst) {
  const auto it = inst.algos.find(plan.problem);
  if (it == inst.algos.end()) return;
  cublasLtMatmulAlgo_t algo{};
  static_assert(sizeof(algo.data) == sizeof(it->second));
  std::memcpy(algo.data, it->second.data(), sizeof(algo.data));
  cublasLtMatmulHeuristicResult_t check{};
  if (cublaslt().cublasLtMatmulAlgoCheck(static_cast<cublasLtHandle_t>(k.handle), plan.op, plan.la, plan.lb, plan.lc,
                                         plan.lc, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > k.workspace_bytes)
    throw UserError(inst.source + ": cuBLASLt refuses the algorithm given for " + plan.problem +
                    " (a table from another build or GPU? tune again with linac bench --tune-gemms)");
  plan.algo = algo;
}

std::unique_ptr<Plan> build_plan(const PlanKey& k, const Installed& inst) {
  auto plan = std::make_unique<Plan>();
  LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmulDescCreate(
      &plan->op, k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LINAC_CUBLAS_CHECK(
      cublaslt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LINAC_CUBLAS_CHECK(
      cublaslt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (k.bias) {  // a bias per row of cuBLASLt's column-major D, i.e. per column of our C
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LINAC_CUBLAS_CHECK(
        cublaslt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  // Stored shapes: B is [K,N] or [N,K], A is [M,K] or [K,M], C is [M,N].
  plan->la = make_layout(k.ab, k.trans_b ? k.n : k.k, k.trans_b ? k.k : k.n, k.ldb, k.batch, k.stride_b);
  plan->lb = make_layout(k.ab, k.trans_a ? k.k : k.m, k.trans_a ? k.m : k.k, k.lda, k.batch, k.stride_a);
  plan->lc = make_layout(k.c, k.m, k.n, k.ldc, k.batch, k.stride_c);
  plan->problem = problem_id(k);
  plan->algo = heuristic_algos(k, *plan, 1)[0];
  apply_installed(k, *plan, inst);
  return plan;
}

// The plans of this process, what is installed, and whether tuning is on. Plans are never
// removed, so a reference to one outlives the lock.
struct Plans {
  std::mutex mu;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> by_key;
  Installed installed;
  bool tuning = false;
};

Plans& plans() {
  static Plans* p = new Plans();  // never destroyed: plans may be used until exit
  return *p;
}

Plan& plan_for(const PlanKey& key, bool& tuning) {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  auto it = ps.by_key.find(key);
  if (it == ps.by_key.end()) it = ps.by_key.emplace(key, build_plan(key, ps.installed)).first;
  tuning = ps.tuning;
  return *it->second;
}

// Folds a plan's finished timings into its samples; with wait, all of them.
void collect(Tuning& t, bool wait) {
  std::vector<Tuning::Pending> open;
  for (const auto& e : t.pending) {
    if (wait) LINAC_CUDA_CHECK(cudaEventSynchronize(e.stop));
    if (cudaEventQuery(e.stop) == cudaErrorNotReady) {
      open.push_back(e);
      continue;
    }
    float ms = 0;
    LINAC_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    t.us[static_cast<size_t>(e.candidate)].push_back(1e3f * ms);
    LINAC_CUDA_CHECK(cudaEventDestroy(e.start));
    LINAC_CUDA_CHECK(cudaEventDestroy(e.stop));
  }
  t.pending.swap(open);
}

// A candidate's median call time, its first call (which may load the kernel) left out; 0 when it
// has fewer than kGemmTuneMinCalls calls after that.
double median_us(std::vector<float> v) {
  if (v.size() < static_cast<size_t>(kGemmTuneMinCalls) + 1) return 0;
  v.erase(v.begin());
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2.0;
}

std::array<uint64_t, 8> algo_words(const cublasLtMatmulAlgo_t& a) {
  std::array<uint64_t, 8> w{};
  std::memcpy(w.data(), a.data, sizeof(a.data));
  return w;
}

}  // namespace

void matmul_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  LINAC_CHECK(a.dtype == b.dtype, "matmul (GPU): A and B must have the same dtype");
  LINAC_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F32, "matmul (GPU): A and B must be bf16 or f32");
  LINAC_CHECK(c.dtype == DType::F32 || (c.dtype == DType::BF16 && a.dtype == DType::BF16),
              "matmul (GPU): C must be f32, or bf16 with bf16 inputs");
  LINAC_CHECK(p.m <= INT32_MAX && p.n <= INT32_MAX && p.k <= INT32_MAX && p.batch <= INT32_MAX,
              "matmul (GPU): M, N, K and batch must fit in int32");
  if (!p.bias && !p.c_in && matmul_skinny_applies(p, a, b, c)) return matmul_skinny_cuda(ctx, p, a, b, c);
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
  // An addend of its own is read through C's layout, so the algorithm must suit both pointers.
  key.align_c = std::min(alignment(c.ptr, p.batch, p.batch_stride_c, c.dtype),
                         p.c_in ? alignment(p.c_in, p.batch, p.batch_stride_c, c.dtype) : UINT32_MAX);
  key.ab = a.dtype;
  key.c = c.dtype;
  key.trans_a = p.trans_a;
  key.trans_b = p.trans_b;
  key.tf32 = p.tf32_exact && a.dtype == DType::F32;
  key.bias = p.bias != nullptr;
  bool tuning = false;
  Plan& plan = plan_for(key, tuning);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const cublasLtMatmulAlgo_t* algo = &plan.algo;
  if (p.bias) {
    // The pointer is an attribute of the cached descriptor; cublasLtMatmul reads it as it enqueues,
    // and a plan serves one handle, which one thread drives at a time.
    const void* bias = p.bias;
    LINAC_CUBLAS_CHECK(
        cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  Tuning::Pending timed{-1, nullptr, nullptr};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (tuning) LINAC_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (tuning && capture == cudaStreamCaptureStatusNone) {  // a captured call would be replayed untimed
    if (!plan.tuning) {
      plan.tuning = std::make_unique<Tuning>();
      std::vector<cublasLtMatmulAlgo_t>& cands = plan.tuning->candidates;
      cands = heuristic_algos(key, plan, kGemmTuneCandidates);
      plan.tuning->heuristic = static_cast<int>(cands.size());
      for (const auto& x :
           screened_algos(key, plan, a.ptr, b.ptr, beta, ctx.workspace, stream, cands, kGemmTuneScreened))
        cands.push_back(x);
      plan.tuning->us.resize(cands.size());
    }
    Tuning& t = *plan.tuning;
    collect(t, false);
    timed.candidate = static_cast<int>(t.calls++ % static_cast<int64_t>(t.candidates.size()));
    algo = &t.candidates[static_cast<size_t>(timed.candidate)];
    LINAC_CUDA_CHECK(cudaEventCreate(&timed.start));
    LINAC_CUDA_CHECK(cudaEventCreate(&timed.stop));
    LINAC_CUDA_CHECK(cudaEventRecord(timed.start, stream));
  }
  LINAC_CUBLAS_CHECK(cublaslt().cublasLtMatmul(static_cast<cublasLtHandle_t>(ctx.blaslt), plan.op, &alpha, b.ptr,
                                               plan.la, a.ptr, plan.lb, &beta, p.c_in ? p.c_in : c.ptr, plan.lc, c.ptr,
                                               plan.lc, algo, ctx.workspace, ctx.workspace_bytes, stream));
  if (timed.candidate >= 0) {
    LINAC_CUDA_CHECK(cudaEventRecord(timed.stop, stream));
    plan.tuning->pending.push_back(timed);
  }
}

GemmAlgoEnv gemm_algo_env() { return {gpu_info().name, static_cast<int64_t>(cublaslt().cublasLtGetVersion())}; }

void gemm_algos_install(const std::vector<GemmAlgoChoice>& choices, const std::string& source) {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  ps.installed.source = source;
  for (const GemmAlgoChoice& c : choices) ps.installed.algos[c.problem] = c.algo;
  for (auto& [key, plan] : ps.by_key) apply_installed(key, *plan, ps.installed);
}

void gemm_algos_clear() {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  ps.installed = Installed{};
  for (auto& [key, plan] : ps.by_key) plan->algo = heuristic_algos(key, *plan, 1)[0];
}

std::vector<GemmAlgoChoice> gemm_algos_in_use() {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  std::vector<GemmAlgoChoice> out;
  for (const auto& [key, plan] : ps.by_key) {
    GemmAlgoChoice c;
    c.problem = plan->problem;
    c.algo = algo_words(plan->algo);
    out.push_back(c);
  }
  return out;
}

void gemm_tuning_start() {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  for (auto& [key, plan] : ps.by_key) plan->tuning.reset();
  ps.tuning = true;
}

std::vector<GemmAlgoChoice> gemm_tuning_finish() {
  Plans& ps = plans();
  std::vector<GemmAlgoChoice> out;
  {
    std::lock_guard<std::mutex> lock(ps.mu);
    ps.tuning = false;
    for (auto& [key, plan] : ps.by_key) {
      if (!plan->tuning) continue;
      Tuning& t = *plan->tuning;
      collect(t, true);
      std::vector<double> med;
      for (const auto& v : t.us) med.push_back(median_us(v));
      size_t best = 0;
      for (size_t i = 1; i < med.size(); ++i) {
        const double margin = static_cast<int>(i) < t.heuristic ? kGemmTuneMargin : kGemmTuneScreenMargin;
        if (med[0] > 0 && med[i] > 0 && med[i] < margin * med[0] && med[i] < med[best]) best = i;
      }
      GemmAlgoChoice c;
      c.problem = plan->problem;
      c.algo = algo_words(t.candidates[best]);
      c.candidate = static_cast<int>(best) < t.heuristic ? static_cast<int>(best)
                                                         : kGemmTuneCandidates + static_cast<int>(best) - t.heuristic;
      c.heuristic_us = med[0];
      c.chosen_us = med[best];
      c.calls = t.calls;
      c.candidates = static_cast<int>(t.candidates.size());
      out.push_back(c);
      plan->tuning.reset();
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.problem < b.problem; });
  gemm_algos_install(out, "tuning");
  return out;
}

}  // namespace linac

#else  // !LINAC_WITH_CUDA

namespace linac {

GemmAlgoEnv gemm_algo_env() { return {}; }
void gemm_algos_install(const std::vector<GemmAlgoChoice>&, const std::string&) { LINAC_REQUIRE_CUDA(); }
void gemm_algos_clear() {}
std::vector<GemmAlgoChoice> gemm_algos_in_use() { return {}; }
void gemm_tuning_start() { LINAC_REQUIRE_CUDA(); }
std::vector<GemmAlgoChoice> gemm_tuning_finish() {
  LINAC_REQUIRE_CUDA();
  return {};
}

}  // namespace linac

#endif  // LINAC_WITH_CUDA
