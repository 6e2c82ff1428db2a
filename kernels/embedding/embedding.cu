// CUDA embedding (math in embedding.h). Forward: one block per token copies its row (vector
// accesses when d is a multiple of four and the pointers are aligned). Backward, without
// atomics: keys (token id, or V for an out-of-range id) and positions are radix-sorted with
// CUB over just the bits that V needs; DeviceSelect::UniqueByKey then yields each run's token
// and first sorted index. Blocks take runs in turn (grid x) for one tile of kRunThreads columns
// (grid y): each thread sums its column of the run's dout rows in position order and adds the
// sum to dtable once. A very frequent token makes its run the longest; the order is kept.
#include <algorithm>
#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "common/cuda_common.cuh"
#include "embedding/embedding.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kRunThreads = 128;    // columns per backward block
constexpr int kRunBlocks = 1024;    // blocks sharing the runs, per column tile
constexpr size_t kAlign = 256;

size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// The backward's scratch, carved from ctx.workspace in this order.
struct Scratch {
  uint32_t* keys_in;    // [n] token, or V for an out-of-range id
  int32_t* iota;        // [n] 0..n-1: the positions before sorting
  uint32_t* keys;       // [n] sorted keys
  int32_t* pos;         // [n] positions in sorted order
  uint32_t* run_keys;   // [n] token of each run (first num_runs used)
  int32_t* run_starts;  // [n] first sorted index of each run
  int32_t* num_runs;    // [1]
  void* temp;           // CUB temporary storage
  size_t temp_bytes;
};

size_t arrays_bytes(int64_t n) { return 6 * align_up(static_cast<size_t>(n) * 4) + align_up(4); }

Scratch carve(void* base, int64_t n, size_t total) {
  char* p = static_cast<char*>(base);
  const size_t a = align_up(static_cast<size_t>(n) * 4);
  Scratch s{};
  s.keys_in = reinterpret_cast<uint32_t*>(p);
  s.iota = reinterpret_cast<int32_t*>(p + a);
  s.keys = reinterpret_cast<uint32_t*>(p + 2 * a);
  s.pos = reinterpret_cast<int32_t*>(p + 3 * a);
  s.run_keys = reinterpret_cast<uint32_t*>(p + 4 * a);
  s.run_starts = reinterpret_cast<int32_t*>(p + 5 * a);
  s.num_runs = reinterpret_cast<int32_t*>(p + 6 * a);
  s.temp = p + arrays_bytes(n);
  s.temp_bytes = total - arrays_bytes(n);
  return s;
}

size_t sort_temp_bytes(int n, int end_bit, cudaStream_t st) {
  size_t bytes = 0;
  LINAC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                   static_cast<uint32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, end_bit, st));
  return bytes;
}

size_t unique_temp_bytes(int n, cudaStream_t st) {
  size_t bytes = 0;
  LINAC_CUDA_CHECK(cub::DeviceSelect::UniqueByKey(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                  static_cast<const int32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n,
                                                  st));
  return bytes;
}

template <bool kVec, class TT, class TO>
__global__ void embedding_fwd_kernel(const int32_t* __restrict__ tokens, const TT* __restrict__ table,
                                     TO* __restrict__ out, int64_t v, int64_t d) {
  const int64_t i = blockIdx.x;
  const int64_t t = tokens[i];
  if (t < 0 || t >= v) return;
  const TT* src = table + t * d;
  TO* dst = out + i * d;
  if constexpr (kVec) {
    for (int64_t j = 4 * threadIdx.x; j < d; j += 4 * blockDim.x) cuda::store4(dst + j, cuda::load4(src + j));
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dst[j] = cuda::from_float<TO>(cuda::to_float(src[j]));
  }
}

__global__ void sort_keys_kernel(const int32_t* __restrict__ tokens, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ iota, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int t = tokens[i];
  keys[i] = static_cast<uint32_t>(t >= 0 && t < v ? t : v);
  iota[i] = i;
}

// Column j of every run taken by this block; four rows are loaded before they are added (in
// order) so that several loads are in flight.
template <class TG>
__global__ void embedding_bwd_runs_kernel(const uint32_t* __restrict__ run_keys, const int32_t* __restrict__ run_starts,
                                          const int32_t* __restrict__ num_runs, const int32_t* __restrict__ pos,
                                          const TG* __restrict__ dout, float* __restrict__ dtable, int n, uint32_t v,
                                          int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const int runs = *num_runs;
  for (int r = blockIdx.x; r < runs; r += gridDim.x) {
    const uint32_t tok = run_keys[r];
    if (tok >= v) continue;  // the run of out-of-range ids
    const int k1 = r + 1 < runs ? run_starts[r + 1] : n;
    int k = run_starts[r];
    float acc = 0.f;
    for (; k + 4 <= k1; k += 4) {
      const float a0 = cuda::to_float(dout[static_cast<int64_t>(pos[k]) * d + j]);
      const float a1 = cuda::to_float(dout[static_cast<int64_t>(pos[k + 1]) * d + j]);
      const float a2 = cuda::to_float(dout[static_cast<int64_t>(pos[k + 2]) * d + j]);
      const float a3 = cuda::to_float(dout[static_cast<int64_t>(pos[k + 3]) * d + j]);
      acc += a0;
      acc += a1;
      acc += a2;
      acc += a3;
    }
    for (; k < k1; ++k) acc += cuda::to_float(dout[static_cast<int64_t>(pos[k]) * d + j]);
    dtable[static_cast<int64_t>(tok) * d + j] += acc;
  }
}

}  // namespace

size_t embedding_bwd_workspace_bytes_cuda(int64_t n) {
  LINAC_CHECK(n >= 0 && n < (int64_t(1) << 31), "embedding (GPU): N must fit in int32");
  if (n == 0) return 0;
  const int ni = static_cast<int>(n);
  return arrays_bytes(n) + std::max(sort_temp_bytes(ni, 32, nullptr), unique_temp_bytes(ni, nullptr));
}

void embedding_fwd_cuda(const Ctx& ctx, const Tensor& tokens, const Tensor& table, const Tensor& out) {
  const int64_t n = out.size(0), v = table.size(0), d = table.size(1);
  if (n == 0 || d == 0) return;
  LINAC_CHECK(n < (int64_t(1) << 31), "embedding (GPU): N must fit in int32");
  const bool vec = d % 4 == 0 && cuda::vec4_aligned(table) && cuda::vec4_aligned(out);
  const int64_t items = vec ? d / 4 : d;
  const int threads = static_cast<int>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kMaxThreads));
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(table.dtype, TT, LINAC_GPU_DISPATCH(out.dtype, TO, {
    if (vec)
      embedding_fwd_kernel<true, TT, TO><<<static_cast<unsigned>(n), threads, 0, st>>>(
          tokens.data<int32_t>(), table.data<TT>(), out.data<TO>(), v, d);
    else
      embedding_fwd_kernel<false, TT, TO><<<static_cast<unsigned>(n), threads, 0, st>>>(
          tokens.data<int32_t>(), table.data<TT>(), out.data<TO>(), v, d);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void embedding_bwd_cuda(const Ctx& ctx, const Tensor& tokens, const Tensor& dout, const Tensor& dtable) {
  LINAC_CHECK(dtable.dtype == DType::F32, "embedding (GPU): dtable must be f32");
  const int64_t n = dout.size(0), v = dtable.size(0), d = dtable.size(1);
  if (n == 0 || d == 0) return;
  LINAC_CHECK(n < (int64_t(1) << 31) && v < (int64_t(1) << 31) - 1, "embedding (GPU): N and V must fit in int32");
  const int ni = static_cast<int>(n), vi = static_cast<int>(v);
  auto st = cuda::stream_of(ctx);
  // Keys are in [0, V], V marking out-of-range ids, so only bit_width(V) bits need sorting.
  const int end_bit = std::bit_width(static_cast<uint32_t>(v));
  const size_t need = arrays_bytes(n) + std::max(sort_temp_bytes(ni, end_bit, st), unique_temp_bytes(ni, st));
  LINAC_CHECK(need <= ctx.workspace_bytes, "embedding (GPU): workspace of " + std::to_string(ctx.workspace_bytes) +
                                               " bytes too small, need " + std::to_string(need));
  Scratch s = carve(ctx.workspace, n, ctx.workspace_bytes);

  sort_keys_kernel<<<cuda::grid_1d(n, kMaxThreads), kMaxThreads, 0, st>>>(tokens.data<int32_t>(), s.keys_in, s.iota,
                                                                          ni, vi);
  LINAC_CUDA_LAUNCH_CHECK();
  size_t temp_bytes = s.temp_bytes;
  LINAC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, temp_bytes, s.keys_in, s.keys, s.iota, s.pos, ni, 0,
                                                   end_bit, st));
  temp_bytes = s.temp_bytes;
  LINAC_CUDA_CHECK(cub::DeviceSelect::UniqueByKey(s.temp, temp_bytes, static_cast<const uint32_t*>(s.keys),
                                                  static_cast<const int32_t*>(s.iota), s.run_keys, s.run_starts,
                                                  s.num_runs, ni, st));
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(n, kRunBlocks)), cuda::grid_1d(d, kRunThreads));
  LINAC_GPU_DISPATCH(dout.dtype, TG, {
    embedding_bwd_runs_kernel<TG><<<grid, kRunThreads, 0, st>>>(s.run_keys, s.run_starts, s.num_runs, s.pos,
                                                                dout.data<TG>(), dtable.data<float>(), ni,
                                                                static_cast<uint32_t>(v), d);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
