// CUDA greedy_pick (math in greedy_pick.h). One CTA of kThreads per row: each thread scans the
// ids t, t + kThreads, ... keeping its first maximum; the CTA reduces (value, id) pairs, larger
// value first and the lower id among equal ones, through warp shuffles and shared memory; then
// each thread sums exp(l - m) over the same ids in double and the CTA adds the sums in a fixed
// tree. The row's logits (128 KB for 32,000 ids) are read twice, the second time from L2.
#include "common/cuda_common.cuh"
#include "greedy_pick/greedy_pick.h"

namespace linac {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;

struct Best {
  float v;
  int id;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
}

__device__ __forceinline__ Best warp_best(Best x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Best o{__shfl_xor_sync(0xffffffffu, x.v, off), __shfl_xor_sync(0xffffffffu, x.id, off)};
    x = better(x, o);
  }
  return x;
}

__global__ void __launch_bounds__(kThreads)
    greedy_pick_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ ids, double* __restrict__ logprob) {
  __shared__ Best s_best[kWarps];
  __shared__ double s_sum[kWarps];
  cuda::dependent_wait();
  cuda::dependent_release();
  const float* row = logits + int64_t{blockIdx.x} * V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Best b{-INFINITY, V};  // a row of -inf still picks its lowest id
  for (int v = threadIdx.x; v < V; v += kThreads) b = better(b, Best{row[v], v});
  b = warp_best(b);
  if (lane == 0) s_best[warp] = b;
  __syncthreads();
  b = s_best[0];
  for (int w = 1; w < kWarps; ++w) b = better(b, s_best[w]);
  if (threadIdx.x == 0) ids[blockIdx.x] = b.id;
  if (!logprob) return;
  const double m = b.v;
  double z = 0;
  for (int v = threadIdx.x; v < V; v += kThreads) z += exp(static_cast<double>(row[v]) - m);
  z = cuda::lanes_sum<32>(z);
  if (lane == 0) s_sum[warp] = z;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kWarps; ++w) total += s_sum[w];
    logprob[blockIdx.x] = -log(total);
  }
}

}  // namespace

void greedy_pick_cuda(const Ctx& ctx, const Tensor& logits, const Tensor& id, const Tensor& logprob) {
  const int64_t B = logits.size(0), V = logits.size(1);
  if (B == 0) return;
  cuda::launch_dependent(ctx, greedy_pick_kernel, dim3(static_cast<unsigned>(B)), dim3(kThreads), 0,
                         logits.data<float>(), static_cast<int>(V), id.data<int32_t>(),
                         logprob.ptr ? logprob.data<double>() : nullptr);
}

}  // namespace linac
