// CUDA full reductions (math in reduce.h). Two deterministic stages: a grid of at most
// kReduceMaxBlocks blocks, each summing a fixed grid-stride share of x in double into a partial in
// ctx.workspace; then one block adding the partials in a fixed order. hash_words sums integers
// (mod 2^64, exact in any order), so its blocks add theirs atomically.
#include <algorithm>

#include "common/cuda_common.cuh"
#include "reduce/hash_words_math.h"
#include "reduce/reduce.h"

namespace linac {
namespace {

constexpr int kThreads = 256;
constexpr auto kMaxBlocks = static_cast<unsigned>(kReduceMaxBlocks);
constexpr int kFinalThreads = 1024;

enum class Reduction { Sum, SumSquares, CountNonFinite };

template <Reduction R>
__device__ __forceinline__ double term(float v) {
  const double d = v;
  if constexpr (R == Reduction::SumSquares) return d * d;
  if constexpr (R == Reduction::CountNonFinite) return isfinite(v) ? 0.0 : 1.0;
  return d;
}

// Vector groups of four while x is aligned (n4 = 0 otherwise), then the scalar tail.
template <Reduction R, class T>
__global__ void reduce_partial_kernel(const T* __restrict__ x, double* __restrict__ partial, int64_t n, int64_t n4) {
  __shared__ double scratch[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0;
  for (int64_t i = t; i < n4; i += stride) {
    const float4 v = cuda::load4(x + 4 * i);
    acc += term<R>(v.x);
    acc += term<R>(v.y);
    acc += term<R>(v.z);
    acc += term<R>(v.w);
  }
  for (int64_t i = 4 * n4 + t; i < n; i += stride) acc += term<R>(cuda::to_float(x[i]));
  acc = cuda::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void reduce_final_kernel(const double* __restrict__ partial, float* __restrict__ out, int nblocks) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) acc += partial[b];
  acc = cuda::block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc);
}

template <Reduction R>
void reduce_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  LINAC_CHECK(out.dtype == DType::F32, "reduce (GPU): out must be f32");
  const int64_t n = x.numel();
  const int64_t n4 = cuda::vec4_aligned(x) ? n / 4 : 0;
  const unsigned blocks = std::clamp(cuda::grid_1d(n4 > 0 ? n4 : n, kThreads), 1u, kMaxBlocks);
  LINAC_CHECK(blocks * sizeof(double) <= ctx.workspace_bytes, "reduce (GPU): workspace too small");
  double* partial = static_cast<double*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    reduce_partial_kernel<R, T><<<blocks, kThreads, 0, st>>>(x.data<T>(), partial, n, n4);
  });
  LINAC_CUDA_LAUNCH_CHECK();
  reduce_final_kernel<<<1, kFinalThreads, 0, st>>>(partial, out.data<float>(), static_cast<int>(blocks));
  LINAC_CUDA_LAUNCH_CHECK();
}

// out[j] += sum_s partial[s, j]: a block per 32 columns, its 8 warps take every eighth slab and
// their sums are added in warp order (a fixed order: deterministic).
__global__ void add_slab_sums_kernel(const float* __restrict__ partial, float* __restrict__ out, int64_t slabs,
                                     int64_t dim) {
  __shared__ float part[kThreads / 32][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float acc = 0.f;
  if (j < dim)
    for (int64_t s = warp; s < slabs; s += kThreads / 32) acc += partial[s * dim + j];
  part[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || j >= dim) return;
  for (int i = 1; i < kThreads / 32; ++i) acc += part[i][lane];
  out[j] += acc;
}

// Words two at a time (16-byte loads) while x is 16-byte aligned (pairs = 0 otherwise), then the
// remaining whole words, then the zero-padded tail (bytes past the last whole word) by thread 0.
__global__ void hash_words_kernel(const unsigned char* __restrict__ x, int64_t nbytes, int64_t pairs, uint64_t seed,
                                  unsigned long long* __restrict__ out) {
  __shared__ uint64_t scratch[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t full = nbytes / 8;
  const auto* w = reinterpret_cast<const uint64_t*>(x);
  uint64_t acc = 0;
  for (int64_t i = t; i < pairs; i += stride) {
    const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(x) + i);
    acc += hash_word_term(v.x, static_cast<uint64_t>(2 * i), seed);
    acc += hash_word_term(v.y, static_cast<uint64_t>(2 * i + 1), seed);
  }
  for (int64_t i = 2 * pairs + t; i < full; i += stride) acc += hash_word_term(__ldg(w + i), static_cast<uint64_t>(i), seed);
  if (t == 0 && nbytes % 8) {
    uint64_t v = 0;
    for (int64_t b = 0; b < nbytes % 8; ++b) v |= static_cast<uint64_t>(x[8 * full + b]) << (8 * b);
    acc += hash_word_term(v, static_cast<uint64_t>(full), seed);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  acc = cuda::warp_sum(acc);
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) acc += scratch[i];
  atomicAdd(out, static_cast<unsigned long long>(acc));
}

}  // namespace

uint64_t hash_words_cuda(const Ctx& ctx, const Tensor& x, uint64_t seed) {
  const int64_t nbytes = static_cast<int64_t>(x.nbytes());
  LINAC_CHECK(reinterpret_cast<uintptr_t>(x.ptr) % 8 == 0, "hash_words (GPU): x must be 8-byte aligned");
  LINAC_CHECK(ctx.workspace_bytes >= sizeof(unsigned long long), "hash_words (GPU): workspace too small");
  const int64_t pairs = reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 ? nbytes / 16 : 0;
  auto* sum = static_cast<unsigned long long*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  LINAC_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(*sum), st));
  const unsigned blocks = std::clamp(cuda::grid_1d(std::max<int64_t>(pairs, nbytes / 8), kThreads), 1u, kMaxBlocks);
  hash_words_kernel<<<blocks, kThreads, 0, st>>>(static_cast<const unsigned char*>(x.ptr), nbytes, pairs, seed, sum);
  LINAC_CUDA_LAUNCH_CHECK();
  unsigned long long host = 0;
  LINAC_CUDA_CHECK(cudaMemcpyAsync(&host, sum, sizeof(host), cudaMemcpyDeviceToHost, st));
  LINAC_CUDA_CHECK(cudaStreamSynchronize(st));
  return hash_words_total(host, static_cast<uint64_t>(nbytes), seed);
}

void add_slab_sums_cuda(const Ctx& ctx, const float* partial, int64_t slabs, int64_t dim, float* out) {
  if (dim == 0) return;
  add_slab_sums_kernel<<<cuda::grid_1d(dim, 32), kThreads, 0, cuda::stream_of(ctx)>>>(partial, out, slabs, dim);
  LINAC_CUDA_LAUNCH_CHECK();
}

void sum_squares_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  reduce_cuda<Reduction::SumSquares>(ctx, x, out);
}

void sum_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out) { reduce_cuda<Reduction::Sum>(ctx, x, out); }

void count_nonfinite_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  reduce_cuda<Reduction::CountNonFinite>(ctx, x, out);
}

}  // namespace linac
