// Hopper cross-entropy for register rows (math in cross_entropy.h, row math in
// cross_entropy_rows.cuh): persistent blocks, each taking rows blockIdx.x, + gridDim.x, ...; a
// row's logits arrive in shared memory by one bulk copy (cp.async.bulk, completing on an
// mbarrier), the threads move their groups into registers, and the copy of the block's next row
// is issued before the math and the gradient writes of this one. The kernel that reads its row
// straight from global memory (cross_entropy.cu) holds half an SM's registers per row and
// cannot load the next row while it reduces and writes; here the copy engine keeps reading.
// In place (dlogits = logits) stays safe: a block writes only its current row, and the copy in
// flight reads another.
// Rows up to 32,768 logits are held as f32 (F32Row, kRowGroups groups of four per thread); longer
// bf16 rows (the 50,264 and 50,272 vocabularies) packed two logits to a register (Bf16Row,
// kLongRowGroups): 512 threads, one block per SM, the copy in flight keeping the memory busy while
// the block reduces and writes.
// Layout: logits, dlogits [N, V] contiguous, V * sizeof(logit) a multiple of 16 bytes (the bulk
// copy's unit), V <= 4 * kRowGroups * kMaxThreads (f32) or 4 * kLongRowGroups * kMaxThreads (bf16).
#include <type_traits>

#include "common/mma_sm80.cuh"
#include "common/sm90.cuh"
#include "cross_entropy/cross_entropy_rows.cuh"

namespace linac::xent {
namespace {

using namespace linac::sm90;

// kThreads: the block's size fixed at compile time (RowSpan), or 0.
template <bool kHits, class TL, class TD, int G, template <int> class Row, int kThreads>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_rows_sm90_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                                   float* __restrict__ losses, float* __restrict__ hits, int64_t n_rows, int64_t v,
                                   float grad_scale) {
  extern __shared__ __align__(16) unsigned char s_row[];  // one row of logits
  __shared__ float scratch[32];
  __shared__ __align__(8) uint64_t s_bar;
  const uint32_t row_smem = sm80::smem_u32(s_row);
  const uint32_t bar = sm80::smem_u32(&s_bar);
  const uint32_t row_bytes = static_cast<uint32_t>(v * sizeof(TL));
  auto fetch = [&](int64_t r) {  // thread 0
    if (r >= n_rows) return;
    mbar_arrive_expect_tx(bar, row_bytes);
    bulk_load(row_smem, logits + r * v, row_bytes, bar);
  };
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
    fetch(blockIdx.x);
  }
  __syncthreads();
  const RowSpan<kThreads> rs(v);
  const TL* x = reinterpret_cast<const TL*>(s_row);
  uint32_t parity = 0;
  int32_t t_next = targets[blockIdx.x];  // a row ahead: its latency is not waited on each row
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x, parity ^= 1) {
    const int32_t t = t_next;
    if (r + gridDim.x < n_rows) t_next = targets[r + gridDim.x];
    mbar_wait(bar, parity);
    Row<G> row;
    row.load(x, rs);
    const float xt = threadIdx.x == 0 && t >= 0 && t < rs.n ? cuda::to_float(x[t]) : NAN;
    __syncthreads();  // the row is in registers: the buffer can take the next one
    if (threadIdx.x == 0) fetch(r + gridDim.x);
    TD* dx = dlogits + r * v;
    if (t < 0)
      ignored_row<true>(dx, v, losses, hits, r);
    else
      finish_row<kHits>(row, rs, t, xt, dx, losses, hits, r, grad_scale, scratch);
  }
}

template <class TL, class TD, int G, template <int> class Row, int kThreads = 0>
void launch_rows(cudaStream_t st, const TL* logits, const int32_t* targets, TD* dlogits, float* losses, float* hits,
                 int64_t n, int64_t v, float grad_scale) {
  auto kernel = hits ? cross_entropy_rows_sm90_kernel<true, TL, TD, G, Row, kThreads>
                     : cross_entropy_rows_sm90_kernel<false, TL, TD, G, Row, kThreads>;
  const int threads = kThreads > 0 ? kThreads : row_threads(v / 4, G);
  const size_t smem = static_cast<size_t>(v) * sizeof(TL);
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int per_sm = 0;
  LINAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t blocks = std::min<int64_t>(n, int64_t{std::max(per_sm, 1)} * gpu_sm_count());
  kernel<<<static_cast<unsigned>(blocks), threads, smem, st>>>(logits, targets, dlogits, losses, hits, n, v,
                                                               grad_scale);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool rows_sm90_fit(const Tensor& logits) {
  const int64_t v = logits.size(1), bytes = v * static_cast<int64_t>(dtype_size(logits.dtype));
  const int groups = logits.dtype == DType::BF16 ? kLongRowGroups : kRowGroups;
  return v <= int64_t{4} * groups * kMaxThreads && bytes % 16 == 0 && reinterpret_cast<uintptr_t>(logits.ptr) % 16 == 0;
}

void rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& losses,
               float* hits, float grad_scale) {
  LINAC_CHECK(rows_sm90_fit(logits), "cross_entropy (GPU): rows_sm90 cannot hold these rows");
  const int64_t n = logits.size(0), v = logits.size(1);
  const bool long_row = v / 4 > int64_t{kRowGroups} * kMaxThreads;  // bf16 only (rows_sm90_fit)
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
                       const TL* x = logits.data<TL>();
                       TD* dx = dlogits.data<TD>();
                       const int32_t* t = targets.data<int32_t>();
                       float* loss = losses.data<float>();
                       if constexpr (std::is_same_v<TL, __nv_bfloat16>)
                         if (long_row)
                           return launch_rows<TL, TD, kLongRowGroups, Bf16Row, kMaxThreads>(st, x, t, dx, loss, hits, n,
                                                                                            v, grad_scale);
                       if (row_threads(v / 4, kRowGroups) == kMaxThreads)  // the 32,000 vocabularies
                         return launch_rows<TL, TD, kRowGroups, F32Row, kMaxThreads>(st, x, t, dx, loss, hits, n, v,
                                                                                     grad_scale);
                       launch_rows<TL, TD, kRowGroups, F32Row>(st, x, t, dx, loss, hits, n, v, grad_scale);
                     }));
}

}  // namespace linac::xent
