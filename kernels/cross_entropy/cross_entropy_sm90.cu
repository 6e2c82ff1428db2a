// Hopper cross-entropy (math in cross_entropy.h, row math in cross_entropy_rows.cuh):
// persistent blocks, each taking rows blockIdx.x, + gridDim.x, ...; a row's logits arrive in
// shared memory by bulk copies (cp.async.bulk, completing on mbarriers) issued before the
// math and the gradient writes of the block's previous row, so the copy engine keeps reading
// while the threads reduce and write. The kernels that read their rows straight from global
// memory (cross_entropy.cu) cannot load the next row meanwhile.
// - register rows (rows_sm90, up to kMaxRowBytes): the threads move their groups into registers
//   and the one row buffer takes the next row at once;
// - long rows (long_rows_sm90, up to kMaxLongRowBytes; the 50,272-entry vocabularies in f32):
//   the two passes read shared memory, one row of it per block, in chunks that each take the
//   next row's copy as soon as this row's gradient is written from them. Same threads and sums as
//   the two-pass kernel, so the same bits.
// In place (dlogits = logits) stays safe: a block writes only its current row, and the copy in
// flight reads another.
// Layout: logits, dlogits [N, V] contiguous, V * sizeof(logit) a multiple of 16 bytes (the bulk
// copy's unit).
#include "common/mma_sm80.cuh"
#include "common/sm90.cuh"
#include "cross_entropy/cross_entropy_rows.cuh"

namespace linac::xent {
namespace {

using namespace linac::sm90;

template <class TL, class TD>
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
  const RowSpan rs(v);
  const TL* x = reinterpret_cast<const TL*>(s_row);
  uint32_t parity = 0;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x, parity ^= 1) {
    const int32_t t = targets[r];
    mbar_wait(bar, parity);
    float4 e[kRowGroups];
    load_row(x, rs, e);
    const float xt = threadIdx.x == 0 && t >= 0 && t < rs.n ? cuda::to_float(x[t]) : NAN;
    __syncthreads();  // the row is in registers: the buffer can take the next one
    if (threadIdx.x == 0) fetch(r + gridDim.x);
    TD* dx = dlogits + r * v;
    if (t < 0)
      ignored_row<true>(dx, v, losses, hits, r);
    else
      finish_row(e, rs, t, xt, dx, losses, hits, r, grad_scale, scratch);
  }
}

// Long rows: the row buffer is cut into chunks of chunk_elems logits (a multiple of the block's
// stride, so a thread's elements and their order are the two-pass kernel's), each with its own
// barrier, completing once per row. Pass 1 takes each chunk as it arrives; pass 2 hands each chunk
// back once every thread has written its gradient, and the copy of the block's next row into it
// starts at once: the next row arrives while this one's gradient is written.
template <class TL, class TD>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_long_rows_sm90_kernel(const TL* logits, const int32_t* __restrict__ targets, TD* dlogits,
                                        float* __restrict__ losses, float* __restrict__ hits, int64_t n_rows, int64_t v,
                                        int64_t chunk_elems, float grad_scale) {
  extern __shared__ __align__(16) unsigned char s_row[];  // one row of logits
  __shared__ float scratch[32];
  __shared__ __align__(8) uint64_t s_bar[kMaxLongRowChunks];
  const int n_chunks = static_cast<int>((v + chunk_elems - 1) / chunk_elems);
  auto fetch = [&](int64_t r, int c) {  // thread 0: chunk c of row r
    if (r >= n_rows) return;
    const int64_t j0 = c * chunk_elems;
    const uint32_t bytes = static_cast<uint32_t>((std::min(v, j0 + chunk_elems) - j0) * sizeof(TL));
    const uint32_t bar = sm80::smem_u32(&s_bar[c]);
    mbar_arrive_expect_tx(bar, bytes);
    bulk_load(sm80::smem_u32(s_row + j0 * sizeof(TL)), logits + r * v + j0, bytes, bar);
  };
  if (threadIdx.x == 0) {
    for (int c = 0; c < n_chunks; ++c) mbar_init(sm80::smem_u32(&s_bar[c]), 1);
    mbar_init_fence();
    for (int c = 0; c < n_chunks; ++c) fetch(blockIdx.x, c);
  }
  __syncthreads();
  const TL* x = reinterpret_cast<const TL*>(s_row);
  uint32_t parity = 0;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x, parity ^= 1) {
    const int64_t t = targets[r];
    TD* dx = dlogits + r * v;
    auto chunk_end = [&](int c) { return std::min(v, (c + 1) * chunk_elems); };
    auto hand_back = [&](int c) {  // every thread is done with chunk c
      __syncthreads();
      if (threadIdx.x == 0) fetch(r + gridDim.x, c);
    };
    if (t < 0) {
      ignored_row<true>(dx, v, losses, hits, r);
      for (int c = 0; c < n_chunks; ++c) mbar_wait(sm80::smem_u32(&s_bar[c]), parity), hand_back(c);
      continue;
    }
    float m = -FLT_MAX, s = 0.f;
    for (int c = 0; c < n_chunks; ++c) {
      mbar_wait(sm80::smem_u32(&s_bar[c]), parity);
      add_to_stats<true>(x, c * chunk_elems, chunk_end(c), m, s);
    }
    const float xt = threadIdx.x == 0 && t < v ? cuda::to_float(x[t]) : NAN;
    const RowStats st = row_stats(m, s, xt, losses, r, scratch);
    float earlier_max = 0.f;
    for (int c = 0; c < n_chunks; ++c) {
      write_gradient<true, false>(x, dx, c * chunk_elems, chunk_end(c), t, st, grad_scale, earlier_max);
      hand_back(c);
    }
    if (hits) write_hit(hits, r, xt, st.mx, earlier_max, scratch);
  }
}

}  // namespace

bool rows_sm90_fit(const Tensor& logits, int64_t max_row_bytes) {
  const int64_t bytes = logits.size(1) * static_cast<int64_t>(dtype_size(logits.dtype));
  return bytes % 16 == 0 && bytes <= max_row_bytes && reinterpret_cast<uintptr_t>(logits.ptr) % 16 == 0;
}

void rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& losses,
               float* hits, float grad_scale) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const int threads = row_threads(v / 4);
  const size_t smem = static_cast<size_t>(v) * dtype_size(logits.dtype);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
                       auto kernel = cross_entropy_rows_sm90_kernel<TL, TD>;
                       LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                             static_cast<int>(smem)));
                       int per_sm = 0;
                       LINAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
                       const int64_t blocks = std::min<int64_t>(n, int64_t{std::max(per_sm, 1)} * gpu_sm_count());
                       kernel<<<static_cast<unsigned>(blocks), threads, smem, st>>>(
                           logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(), hits,
                           n, v, grad_scale);
                     }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void long_rows_sm90(const Ctx& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                    const Tensor& losses, float* hits, float grad_scale) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const int threads = two_pass_threads(v / 4);
  const size_t smem = static_cast<size_t>(v) * dtype_size(logits.dtype);
  // Chunks of about 24 KB, whole strides of the block, kMaxLongRowChunks at most.
  const int64_t stride = 4 * int64_t{threads}, strides = (v + stride - 1) / stride;
  const int64_t per_chunk =
      std::max<int64_t>({int64_t{24576} / (stride * static_cast<int64_t>(dtype_size(logits.dtype))),
                         (strides + kMaxLongRowChunks - 1) / kMaxLongRowChunks, 1});
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(logits.dtype, TL, LINAC_GPU_DISPATCH(dlogits.dtype, TD, {
                       auto kernel = cross_entropy_long_rows_sm90_kernel<TL, TD>;
                       LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                             static_cast<int>(smem)));
                       const int64_t blocks = std::min<int64_t>(n, gpu_sm_count());
                       kernel<<<static_cast<unsigned>(blocks), threads, smem, st>>>(
                           logits.data<TL>(), targets.data<int32_t>(), dlogits.data<TD>(), losses.data<float>(), hits,
                           n, v, per_chunk * stride, grad_scale);
                     }));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac::xent
