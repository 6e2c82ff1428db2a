// Lists of the tokens of each segment by code, so per-code sums (the compressive cache) read
// only their own tokens, in token order, without atomics:
//   segment (h, b, m) = tokens t of sequence b and head h at packed positions [m Ls, (m + 1) Ls)
//   (the position t itself, or packed[b T + t] with documents: vq_packed.h), m < R;
//   key = ((h B + b) R + m) S + z_t, value t.
// CUB's radix sort over the key's bits is stable, and the entries go in in token order, so each
// key's tokens stay in order; start[key] is the key's first sorted index (start[NK] = n).
// Layout: z [B, T, H] int32, n = B T H entries; every z in [0, S).
#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace vq_cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;

size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

struct Dims {
  int64_t n, R, NK;
  int end_bit;
};
Dims dims_of(int64_t B, int64_t T, int64_t H, int64_t S, int64_t R) {
  Dims d;
  d.n = B * T * H;
  d.R = R;
  d.NK = H * B * d.R * S;
  d.end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(d.NK))));
  return d;
}

size_t sort_temp_bytes(int64_t n, int end_bit) {
  size_t bytes = 0;
  LINAC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                   static_cast<uint32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, end_bit));
  return bytes;
}

// Thread per entry i = (b T + t) H + h of z.
__global__ void list_keys_kernel(const int32_t* __restrict__ z, const int32_t* __restrict__ packed, int64_t B,
                                 int64_t T, int64_t H, int64_t S, int64_t Ls, int64_t R, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ toks) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= B * T * H) return;
  const int64_t h = i % H, bt = i / H, b = bt / T, t = bt % T, tp = packed ? packed[bt] : t;
  keys[i] = static_cast<uint32_t>((((h * B + b) * R + tp / Ls) * S) + z[i]);
  toks[i] = static_cast<int32_t>(t);
}

// Thread per sorted index i in [0, n]: every key in (key[i-1], key[i]] starts at i (key[n] = NK).
__global__ void list_starts_kernel(const uint32_t* __restrict__ keys, int64_t n, int64_t NK,
                                   int32_t* __restrict__ start) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i > n) return;
  const int64_t k = i < n ? int64_t{keys[i]} : NK, prev = i > 0 ? int64_t{keys[i - 1]} : -1;
  for (int64_t key = prev + 1; key <= k; ++key) start[key] = static_cast<int32_t>(i);
}

}  // namespace

size_t code_lists_bytes(int64_t B, int64_t T, int64_t H, int64_t S, int64_t R) {
  const Dims d = dims_of(B, T, H, S, R);
  return 4 * align_up(static_cast<size_t>(d.n) * 4) + align_up(static_cast<size_t>(d.NK + 1) * 4) +
         align_up(sort_temp_bytes(d.n, d.end_bit));
}

CodeLists code_lists(const Ctx& ctx, const int32_t* z, const int32_t* packed, int64_t B, int64_t T, int64_t H,
                     int64_t S, int64_t Ls, int64_t R, void* scratch, size_t bytes, const char* op) {
  const Dims d = dims_of(B, T, H, S, R);
  LINAC_CHECK(d.NK < (int64_t{1} << 32) && d.n < (int64_t{1} << 31),
              std::string(op) + ": more than 2^32 (segment, code) pairs or 2^31 tokens");
  const size_t need = code_lists_bytes(B, T, H, S, R);
  LINAC_CHECK(bytes >= need, std::string(op) + ": workspace has " + std::to_string(bytes) + " bytes, the code lists need " +
                                 std::to_string(need));
  char* p = static_cast<char*>(scratch);
  const size_t a = align_up(static_cast<size_t>(d.n) * 4);
  auto* keys_in = reinterpret_cast<uint32_t*>(p);
  auto* toks_in = reinterpret_cast<int32_t*>(p + a);
  auto* keys = reinterpret_cast<uint32_t*>(p + 2 * a);
  auto* toks = reinterpret_cast<int32_t*>(p + 3 * a);
  auto* start = reinterpret_cast<int32_t*>(p + 4 * a);
  void* temp = p + 4 * a + align_up(static_cast<size_t>(d.NK + 1) * 4);
  size_t temp_bytes = bytes - (4 * a + align_up(static_cast<size_t>(d.NK + 1) * 4));
  cudaStream_t st = cuda::stream_of(ctx);
  if (d.n > 0) {
    list_keys_kernel<<<cuda::grid_1d(d.n, kThreads), kThreads, 0, st>>>(z, packed, B, T, H, S, Ls, d.R, keys_in,
                                                                         toks_in);
    LINAC_CUDA_LAUNCH_CHECK();
    LINAC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, toks_in, toks, d.n, 0, d.end_bit,
                                                     st));
  }
  list_starts_kernel<<<cuda::grid_1d(d.n + 1, kThreads), kThreads, 0, st>>>(keys, d.n, d.NK, start);
  LINAC_CUDA_LAUNCH_CHECK();
  return {start, toks};
}

}  // namespace vq_cuda
}  // namespace linac
