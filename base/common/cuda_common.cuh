// Device helpers shared by the CUDA kernels: dtype conversion, warp/block reductions, the
// stream of a Ctx, dependent launches, row-tiled launches, and a dispatch over the activation
// dtype (bf16 or f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/dispatch.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac::cuda {

inline cudaStream_t stream_of(const Ctx& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Programmatic dependent launches (sm_90+). With ctx.dependent_launches, launch_dependent lets the
// GPU start a kernel once every CTA of the kernel ahead of it has called dependent_release (or
// ended), so its launch and its first loads overlap that kernel's tail. Such a kernel:
//   - before dependent_wait() writes nothing and reads only what the kernel ahead does not write:
//     weights, or state from earlier kernels (the kernel ahead released only after its own wait,
//     so everything before it has finished);
//   - after dependent_wait() sees all the stream's earlier work done;
//   - calls dependent_release() only after its wait, which keeps the first rule true for the
//     kernel after it.
// Without the launch attribute (ctx.dependent_launches off, or a GPU before sm_90) both calls
// return at once and the launch is an ordinary stream-ordered one.
__device__ __forceinline__ void dependent_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void dependent_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <class... Params, class... Args>
void launch_dependent(const Ctx& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(ctx);
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  if (ctx.dependent_launches) cfg.attrs = &attr, cfg.numAttrs = 1;
  LINAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two floats as a bf16 pair in one register (round to nearest even), and back: bf16 is the top
// half of an f32, so unpacking is one instruction per value.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

constexpr float kLog2e = 1.4426950408889634f;

// 2^x in the hardware's approximate exp2 (ex2.approx, relative error ~2^-22), subnormal results
// flushed to 0: one instruction, where exp2f/expf take several. exp(x - m) is
// fast_exp2(fmaf(x, kLog2e, -m kLog2e)), one FFMA and this.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// x as a T would hold it (rounded to bf16, or unchanged), back in f32.
template <class T>
__device__ __forceinline__ float rounded(float x) {
  return to_float(from_float<T>(x));
}

// The sum (max) of v over the aligned group of G lanes (a power of two up to 32) the calling lane
// belongs to, every lane of the group getting it; butterfly order, so the same bits in every group.
// All 32 lanes of the warp must call it. lanes_sum takes float or double.
template <int G, class V>
__device__ __forceinline__ V lanes_sum(V v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int G>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return lanes_sum<32>(v); }
__device__ __forceinline__ float warp_max(float v) { return lanes_max<32>(v); }

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads of the CTA (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Sum over the whole block; every thread gets the result. `scratch` holds >= 32 floats.
// Fixed reduction order, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(t);
}

// The sum of v over the group of `warps` consecutive warps (1, 2, 4 or 8, dividing the block's
// warp count) the calling warp belongs to; every lane of the group gets it, added in the same
// order in every warp. Groups of several warps meet at named barrier 1 + their index in the block
// and leave their warp sums in slots[warp] (>= the block's warp count): a caller that sums again
// before every warp of its group has read the slots alternates between two slot arrays.
__device__ __forceinline__ float group_sum(float v, int warps, float* slots) {
  v = warp_sum(v);
  if (warps == 1) return v;
  const int warp = threadIdx.x >> 5, first = warp - warp % warps;
  if ((threadIdx.x & 31) == 0) slots[warp] = v;
  named_barrier_sync(1 + warp / warps, 32 * warps);
  float sum = 0.f;
  for (int q = 0; q < warps; ++q) sum += slots[first + q];
  return sum;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Integer sums wrap mod 2^64 (exact in any order: hashes of summed terms).
__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_sum in double (final stages of long reductions); `scratch` holds >= 32 doubles.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = lane < nwarps ? scratch[lane] : 0.0;
  return warp_sum(t);
}

// Four consecutive elements as floats, one 16-byte (f32) or 8-byte (bf16) access: p must be
// aligned to four elements (see vec4_aligned).
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

// V = 8, 4 or 1 consecutive elements as floats (load4/store4 for four; eight: one 16-byte access
// in bf16, two in f32, p aligned to eight elements in bf16, four in f32).
template <int V, class T>
__device__ __forceinline__ void load_vals(const T* p, float (&v)[V]) {
  if constexpr (V == 8 && sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = unpack_bf16(w[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  } else if constexpr (V == 8) {
    const float4 a = load4(p), b = load4(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (V == 4) {
    const float4 f = load4(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    v[0] = to_float(*p);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_vals(T* p, const float (&v)[V]) {
  if constexpr (V == 8 && sizeof(T) == 2) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
  } else if constexpr (V == 8) {
    store4(p, make_float4(v[0], v[1], v[2], v[3]));
    store4(p + 4, make_float4(v[4], v[5], v[6], v[7]));
  } else if constexpr (V == 4) {
    store4(p, make_float4(v[0], v[1], v[2], v[3]));
  } else {
    *p = from_float<T>(v[0]);
  }
}

inline unsigned grid_1d(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ceil(a / b) for tile counts, on the host and in kernels.
__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

// Whether load4/store4 may be used on t's data (element 0, hence every fourth element).
inline bool vec4_aligned(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.ptr) % (4 * dtype_size(t.dtype)) == 0;
}
// Whether every row of a matrix at p with row stride ld (elements) starts 4-aligned.
inline bool rows_vec4(const void* p, size_t elem_bytes, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % (4 * elem_bytes) == 0 && ld % 4 == 0;
}

// How the row kernels that hold a row in registers (kernels/rmsnorm, kernels/srmsnorm) spread a
// row of `cols` columns over a group of warps, each lane keeping 4 columns of each of the warp's
// chunks of 128: the fewest warps (1, 2, 4, ... up to max_warps) that split the chunks evenly with
// at most max_chunks per warp; {0, 0} when none does (cols not 128 k, or too wide).
struct RowGroupSplit {
  int warps = 0, chunks = 0;
};
inline RowGroupSplit row_group_split(int64_t cols, int max_chunks, int max_warps) {
  if (cols % 128 != 0) return {};
  for (int warps = 1; warps <= max_warps; warps *= 2)
    if (cols <= int64_t{128} * max_chunks * warps && cols % (128 * warps) == 0)
      return {warps, static_cast<int>(cols / (128 * warps))};
  return {};
}

// Row-tiled launches for row-wise elementwise work: a CTA of `threads` covers threads / tpr
// rows with tpr threads each, tpr the power of two that covers a row's column groups (at most
// `threads`), so narrow rows still fill the CTA and a thread's row and lane come from shifts.
struct RowTiling {
  unsigned blocks;
  int log_tpr;
};
inline RowTiling row_tiling(int64_t rows, int64_t groups_per_row, int threads) {
  int log_tpr = 0;
  while ((1 << log_tpr) < threads && (int64_t{1} << log_tpr) < groups_per_row) ++log_tpr;
  return {grid_1d(rows, threads >> log_tpr), log_tpr};
}
struct RowSlot {
  int64_t row;
  int lane, lanes;  // this thread's column group and the threads of its row
};
__device__ __forceinline__ RowSlot row_slot(int log_tpr) {
  return {static_cast<int64_t>(blockIdx.x) * (blockDim.x >> log_tpr) + (threadIdx.x >> log_tpr),
          static_cast<int>(threadIdx.x & ((1u << log_tpr) - 1)), 1 << log_tpr};
}

// Calls fn(std::integral_constant<int, n>{}) for a run-time n in 1..kMax (n > kMax gives kMax):
// kernels that keep a row in registers are templated on how many pieces each thread holds.
template <int kMax, int kN = 1, class Fn>
void with_const(int n, Fn&& fn) {
  if constexpr (kN >= kMax)
    fn(std::integral_constant<int, kMax>{});
  else if (n == kN)
    fn(std::integral_constant<int, kN>{});
  else
    with_const<kMax, kN + 1>(n, fn);
}

}  // namespace linac::cuda

// Binds T to float or __nv_bfloat16 for a GPU activation dtype.
#define LINAC_GPU_DISPATCH(dtype_, T, ...) \
  LINAC_DTYPE_SWITCH2(dtype_, T, F32, float, BF16, __nv_bfloat16, "GPU", __VA_ARGS__)
