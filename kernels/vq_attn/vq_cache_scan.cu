// The compressive cache of VQ-attention (docs/transformer_vq.md §3.2) in the packed layout of vq_common.cuh.
//   cache_scan        CTA per (pair p, code s) walks the blocks in order: block n reads the count
//                     N_s and the mean of the values with code s over blocks <= n-2 (of its
//                     cache segment: with documents the scan restarts where one begins), written to
//                     counts [NB, S] (f32) and ubar [NB, S, Dv] (activation dtype: a GEMM operand).
//                     grid z splits the value dims: each thread owns four consecutive ones
//                     where v's rows are 4-aligned (one otherwise) and sums them in registers
//                     (f32). The block's tokens with code s come from the code lists in token
//                     order, their rows loaded kBatch at a time and added in that order: every
//                     sum has a fixed order.
//   cache_grad_sweep  thread per (p, s, 16 bytes of d where Dv allows, else one):
//                     gcache^(m) <- sum_{n >= m+2} gcache^(n) / N^(n), the
//                     gradient a value of block m receives through the cache means of later
//                     blocks of its segment (reverse sweep with a two-block delay, restarting at
//                     segment ends, f32 sums; 0 where N = 0), in place in the activation dtype
//                     (the GEMMs write gcache so: half the bytes of f32 written, read, read again).
#include <algorithm>
#include <string>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace vq_cuda {
namespace {

using cuda::from_float;
using cuda::to_float;

constexpr int kScanThreads = 128;
constexpr int kSweepThreads = 256;
constexpr int kBatch = 4;  // rows in flight per thread

template <bool kVec, class T>
__global__ void __launch_bounds__(kScanThreads) cache_scan_kernel(Geo g, const T* __restrict__ v,
                                                                  VqAttnLayout::Strides vs, CodeLists lists,
                                                                  float* __restrict__ counts, T* __restrict__ ubar) {
  constexpr int kW = kVec ? 4 : 1;
  const int64_t p = blockIdx.x, s = blockIdx.y, h = p / g.B, b = p % g.B;
  const int Dv = static_cast<int>(g.Dv), d = (blockIdx.z * kScanThreads + threadIdx.x) * kW;
  const bool mine = d < Dv;
  const T* vh = v + b * vs.b + h * Dv + d;
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 sum = zero4;  // the scalar path uses .x
  float N = 0;
  const int32_t* segment_of = g.docs.cache_from ? g.docs.cache_from + b * g.R : nullptr;
  for (int64_t n = 0; n < g.R; ++n) {
    const int64_t i = p * g.R + n;
    // A block that starts a cache segment reads an empty cache and absorbs no block before it.
    const bool fresh = n == 0 || (segment_of && segment_of[n] == n);
    if (fresh) sum = zero4, N = 0;
    // Block n-1's tokens with code s (absorbed for block n+1), loaded before the store below.
    const int64_t key = (i - 1) * g.S + s;
    const int e0 = fresh ? 0 : lists.start[key], e1 = fresh ? 0 : lists.start[key + 1];
    if (blockIdx.z == 0 && threadIdx.x == 0) counts[i * g.S + s] = N;
    const float inv = N > 0 ? 1.f / N : 0.f;
    if (mine) {
      T* out = ubar + (i * g.S + s) * Dv + d;
      if constexpr (kVec)
        cuda::store4(out, make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv));
      else
        *out = from_float<T>(sum.x * inv);
    }
    for (int e = e0; e < e1; e += kBatch) {
      float4 x[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        x[k] = zero4;
        if (mine && e + k < e1) {
          const T* row = vh + lists.tok[e + k] * vs.t;
          if constexpr (kVec)
            x[k] = cuda::load4(row);
          else
            x[k].x = to_float(*row);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (e + k < e1) sum.x += x[k].x, sum.y += x[k].y, sum.z += x[k].z, sum.w += x[k].w;
    }
    N += static_cast<float>(e1 - e0);
  }
}

// In place: each thread reads its cells before it writes them. A thread owns kVec consecutive
// value dims (16 bytes where Dv allows) of one (pair, code) and loads up to kAhead blocks' cells
// before it writes any. A thread per value dim, each block's 2-byte load waiting on the store
// before it (the compiler may not move a load of gcache above a store to it), ran at 17% of the
// DRAM bandwidth: 129 us per layer of the 190M model against 95 now (H200, ncu).
template <int kVec, class T>
__global__ void __launch_bounds__(kSweepThreads)
    cache_grad_sweep_kernel(Geo g, const float* __restrict__ counts, T* gcache) {
  constexpr int kAhead = 4;
  struct Cells {  // kVec values of one block
    T x[kVec];
  };
  static_assert(sizeof(Cells) == kVec * sizeof(T) && (kVec == 1 || sizeof(Cells) == 16), "one access per cell");
  const int64_t per_row = g.Dv / kVec, u = blockIdx.x * int64_t{kSweepThreads} + threadIdx.x;
  if (u >= g.P * g.S * per_row) return;
  const int64_t ps = u / per_row, d = (u - ps * per_row) * kVec, p = ps / g.S, s = ps % g.S;
  const int32_t* segment_of = g.docs.cache_from ? g.docs.cache_from + p % g.B * g.R : nullptr;
  auto cells = [&](int64_t m) { return reinterpret_cast<Cells*>(gcache + ((p * g.R + m) * g.S + s) * g.Dv + d); };
  float acc[kVec] = {}, pending[kVec] = {};  // acc = sum_{n >= m+2}, pending = the term of block m+1
  for (int64_t top = g.R - 1; top >= 0; top -= kAhead) {
    Cells x[kAhead];
    float N[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (top - j >= 0) {
        x[j] = *cells(top - j);
        N[j] = counts[(p * g.R + top - j) * g.S + s];
      }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t m = top - j;
      if (m < 0) break;
      if (segment_of && m + 1 < g.R && segment_of[m + 1] == m + 1) {  // m's segment ends
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = 0, pending[k] = 0;
      }
      Cells out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float term = N[j] > 0 ? to_float(x[j].x[k]) / N[j] : 0.f;
        out.x[k] = from_float<T>(acc[k]);
        acc[k] += pending[k];
        pending[k] = term;
      }
      *cells(m) = out;
    }
  }
}

}  // namespace

template <class T>
void cache_scan(const Ctx& ctx, const Geo& g, const T* v, VqAttnLayout::Strides vs, CodeLists lists, float* counts,
                T* ubar) {
  LINAC_CHECK(g.S <= 65535, "vq_attn: the GPU cache scan takes at most 65535 codes, got " + std::to_string(g.S));
  const bool vec = g.Dv % 4 == 0 && cuda::rows_vec4(v, sizeof(T), vs.t) && vs.b % 4 == 0;
  const int64_t per_cta = kScanThreads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>(g.P), static_cast<unsigned>(g.S), static_cast<unsigned>((g.Dv + per_cta - 1) / per_cta));
  if (vec)
    cache_scan_kernel<true, T><<<grid, kScanThreads, 0, cuda::stream_of(ctx)>>>(g, v, vs, lists, counts, ubar);
  else
    cache_scan_kernel<false, T><<<grid, kScanThreads, 0, cuda::stream_of(ctx)>>>(g, v, vs, lists, counts, ubar);
  LINAC_CUDA_LAUNCH_CHECK();
}
template void cache_scan<float>(const Ctx&, const Geo&, const float*, VqAttnLayout::Strides, CodeLists, float*, float*);
template void cache_scan<__nv_bfloat16>(const Ctx&, const Geo&, const __nv_bfloat16*, VqAttnLayout::Strides, CodeLists,
                                        float*, __nv_bfloat16*);

template <class T>
void cache_grad_sweep(const Ctx& ctx, const Geo& g, const float* counts, T* gcache) {
  constexpr int kVec = 16 / sizeof(T);  // gcache's rows start 256-byte aligned; Dv % kVec keeps them so
  const bool vec = g.Dv % kVec == 0;
  const int64_t threads = g.P * g.S * (vec ? g.Dv / kVec : g.Dv);
  const unsigned blocks = cuda::grid_1d(threads, kSweepThreads);
  if (vec)
    cache_grad_sweep_kernel<kVec, T><<<blocks, kSweepThreads, 0, cuda::stream_of(ctx)>>>(g, counts, gcache);
  else
    cache_grad_sweep_kernel<1, T><<<blocks, kSweepThreads, 0, cuda::stream_of(ctx)>>>(g, counts, gcache);
  LINAC_CUDA_LAUNCH_CHECK();
}
template void cache_grad_sweep<float>(const Ctx&, const Geo&, const float*, float*);
template void cache_grad_sweep<__nv_bfloat16>(const Ctx&, const Geo&, const float*, __nv_bfloat16*);

}  // namespace vq_cuda
}  // namespace linac
