// CUDA SimpleRMSNorm, with the optional residual add or output gate (math in srmsnorm.h).
// Rows of 128 k <= 4096 columns whose operand rows all start 4-aligned (every TransNormerLLM width
// in configs/): a row group of 1, 2 or 4 warps per row (as kernels/rmsnorm), lane l of the group's
// warp q holding columns 128 c + 4 l .. 128 c + 4 l + 3 of its chunks c = q k, ..., q k + k - 1
// (k <= 8) in registers, so each operand row is read once with 8- (bf16) or 16-byte (f32)
// accesses and written once, after the group's reduction (warp shuffles, then the warp sums
// through shared memory under the group's named barrier). Other rows of at most kWarpRowMax
// columns: a warp per row with one element per lane per access; wider rows: a block per row with a
// fixed-order block reduction. These two reduce (sum of squares forward, sum of
// y * dy backward) and then make a second pass over the row, which comes from L1/L2. The backward's
// target (the pull term) is read with dy, in the same pass.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "common/cuda_common.cuh"
#include "srmsnorm/srmsnorm.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kWarpRowMax = 1024;
constexpr int kMaxGroupWarps = 4;

// The row's first pass: x (or h = x + add, written here) and its sum of squares. The second
// pass reads back what this thread wrote: the same columns.
template <class TX, class TY>
__device__ __forceinline__ float sum_squares(const TX* __restrict__ xr, const TY* __restrict__ ar, TX* __restrict__ hr,
                                             int64_t j0, int64_t c, int64_t step) {
  float ss = 0.f;
  for (int64_t j = j0; j < c; j += step) {
    float v = cuda::to_float(xr[j]);
    if (ar) {
      v = cuda::rounded<TX>(v + cuda::to_float(ar[j]));
      hr[j] = cuda::from_float<TX>(v);
    }
    ss += v * v;
  }
  return ss;
}

// y[j] = x[j] * rs, times the gate's u[j] where there is one.
template <class TY>
__device__ __forceinline__ float gated(float n, const TY* __restrict__ ur, int64_t j) {
  return ur ? n * cuda::to_float(ur[j]) : n;
}

// Register rows: up to kMaxChunks chunks of 128 columns per warp, `warps` warps per row; both are
// uniform over the grid (kernel arguments: no instantiation per width) and the loops are unrolled
// to kMaxChunks with constant indices, so the row stays in registers.
constexpr int kMaxChunks = 8;

// This thread's register row: the row, and the first column of chunk c is col0 + 128 c.
struct RowSlot {
  int64_t r;
  int col0;
};
__device__ __forceinline__ RowSlot row_slot(int warps, int chunks) {
  const int q = static_cast<int>(threadIdx.x / 32) % warps;
  return {(blockIdx.x * int64_t{kMaxThreads} + threadIdx.x) / (32 * warps),
          128 * q * chunks + 4 * static_cast<int>(threadIdx.x % 32)};
}

template <class TX, class TY>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_fwd_vec_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const TY* __restrict__ u,
                            TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, SrmsnormLayout L,
                            int warps, int chunks, float eps) {
  __shared__ float slots[kMaxThreads / 32];
  const auto [r, col0] = row_slot(warps, chunks);
  if (r >= L.N) return;  // the whole group: its warps share r
  float4 v[kMaxChunks];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= chunks) break;
    const int64_t j = col0 + 128 * c;
    v[c] = cuda::load4(x + r * L.x + j);
    if (add) {
      const float4 a = cuda::load4(add + r * L.add + j);
      v[c] = make_float4(cuda::rounded<TX>(v[c].x + a.x), cuda::rounded<TX>(v[c].y + a.y),
                         cuda::rounded<TX>(v[c].z + a.z), cuda::rounded<TX>(v[c].w + a.w));
      cuda::store4(h + r * L.h + j, v[c]);
    }
    ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
  }
  const float rs = rsqrtf(cuda::group_sum(ss, warps, slots) / static_cast<float>(L.C) + eps);
  const float ry = rs * static_cast<float>(L.scale);
  if (threadIdx.x % (32 * warps) == 0) rstd[r] = rs;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= chunks) break;
    const int64_t j = col0 + 128 * c;
    float4 n = make_float4(v[c].x * ry, v[c].y * ry, v[c].z * ry, v[c].w * ry);
    if (u) {
      const float4 g = cuda::load4(u + r * L.u + j);
      n = make_float4(n.x * g.x, n.y * g.y, n.z * g.z, n.w * g.w);
    }
    cuda::store4(y + r * L.y + j, n);
  }
}

// x, dy, the gate u and the dx being added to are all loaded before the row's reduction: one
// memory round trip per row.
template <class TX, class TDY, class TDX>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_bwd_vec_kernel(const TX* __restrict__ x, const TDY* __restrict__ u, const TDY* __restrict__ t,
                            const float* __restrict__ rstd, const TDY* __restrict__ dy, TDX* __restrict__ dx,
                            TDX* __restrict__ du, SrmsnormLayout L, int warps, int chunks, bool accumulate) {
  __shared__ float slots[kMaxThreads / 32];
  const auto [r, col0] = row_slot(warps, chunks);
  if (r >= L.N) return;
  const float rs = rstd[r], sc = static_cast<float>(L.scale), pull = static_cast<float>(L.pull);
  float4 n[kMaxChunks], d[kMaxChunks], o[kMaxChunks];  // x * rs, dy * scale, and the dx being added to
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= chunks) break;
    const int64_t j = col0 + 128 * c;
    const float4 xv = cuda::load4(x + r * L.x + j);
    n[c] = make_float4(xv.x * rs, xv.y * rs, xv.z * rs, xv.w * rs);
    d[c] = cuda::load4(dy + r * L.dy + j);
    if (t) {
      const float4 tv = cuda::load4(t + r * L.t + j);
      d[c] = make_float4(d[c].x + pull * (n[c].x * sc - tv.x), d[c].y + pull * (n[c].y * sc - tv.y),
                         d[c].z + pull * (n[c].z * sc - tv.z), d[c].w + pull * (n[c].w * sc - tv.w));
    }
    d[c] = make_float4(d[c].x * sc, d[c].y * sc, d[c].z * sc, d[c].w * sc);
    if (accumulate) o[c] = cuda::load4(dx + r * L.dx + j);
    float4 dn = d[c];
    if (u) {
      const float4 g = cuda::load4(u + r * L.u + j);
      dn = make_float4(dn.x * g.x, dn.y * g.y, dn.z * g.z, dn.w * g.w);
      if (du)
        cuda::store4(du + r * L.du + j,
                     make_float4(d[c].x * n[c].x, d[c].y * n[c].y, d[c].z * n[c].z, d[c].w * n[c].w));
      d[c] = dn;
    }
    dot += n[c].x * dn.x + n[c].y * dn.y + n[c].z * dn.z + n[c].w * dn.w;
  }
  const float m = cuda::group_sum(dot, warps, slots) / static_cast<float>(L.C);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= chunks) break;
    const int64_t j = col0 + 128 * c;
    float4 g = make_float4(rs * (d[c].x - n[c].x * m), rs * (d[c].y - n[c].y * m), rs * (d[c].z - n[c].z * m),
                           rs * (d[c].w - n[c].w * m));
    if (accumulate) g = make_float4(o[c].x + g.x, o[c].y + g.y, o[c].z + g.z, o[c].w + g.w);
    cuda::store4(dx + r * L.dx + j, g);
  }
}

// Warp per row.
template <class TX, class TY>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_fwd_rows_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const TY* __restrict__ u,
                             TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, SrmsnormLayout L,
                             float eps) {
  const int64_t r = (blockIdx.x * int64_t{kMaxThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= L.N) return;
  const TX* xr = x + r * L.x;
  TX* hr = add ? h + r * L.h : nullptr;
  const TY* ur = u ? u + r * L.u : nullptr;
  const float ss = sum_squares(xr, add ? add + r * L.add : nullptr, hr, lane, L.C, 32);
  const float rs = rsqrtf(cuda::warp_sum(ss) / static_cast<float>(L.C) + eps), ry = rs * static_cast<float>(L.scale);
  if (lane == 0) rstd[r] = rs;
  if (hr) xr = hr;
  for (int64_t j = lane; j < L.C; j += 32) y[r * L.y + j] = cuda::from_float<TY>(gated(cuda::to_float(xr[j]) * ry, ur, j));
}

// The gradient of y at column j (dy, plus the pull toward the target where there is one), times
// the scale: that of the normalised row n before the gate.
template <class TDY>
__device__ __forceinline__ float scaled_grad(const TDY* __restrict__ dyr, const TDY* __restrict__ tr, float n,
                                             const SrmsnormLayout& L, int64_t j) {
  const float sc = static_cast<float>(L.scale);
  float g = cuda::to_float(dyr[j]);
  if (tr) g += static_cast<float>(L.pull) * (n * sc - cuda::to_float(tr[j]));
  return g * sc;
}

// The backward's second pass over a row, after the reduction m = mean_j(n_j * dn_j).
template <class TX, class TDY, class TDX>
__device__ __forceinline__ void srmsnorm_bwd_row(const TX* __restrict__ xr, const TDY* __restrict__ ur,
                                                 const TDY* __restrict__ tr, const TDY* __restrict__ dyr,
                                                 TDX* __restrict__ dxr, TDX* __restrict__ dur, const SrmsnormLayout& L,
                                                 float rs, float m, int64_t j0, int64_t step, bool accumulate) {
  for (int64_t j = j0; j < L.C; j += step) {
    const float n = cuda::to_float(xr[j]) * rs, dy = scaled_grad(dyr, tr, n, L, j);
    const float g = rs * (gated(dy, ur, j) - n * m);
    dxr[j] = cuda::from_float<TDX>(accumulate ? cuda::to_float(dxr[j]) + g : g);
    if (dur) dur[j] = cuda::from_float<TDX>(dy * n);
  }
}

// sum_j n_j * dn_j over this thread's columns (dn = scaled_grad, times the gate where there is one).
template <class TX, class TDY>
__device__ __forceinline__ float bwd_dot(const TX* __restrict__ xr, const TDY* __restrict__ ur,
                                         const TDY* __restrict__ tr, const TDY* __restrict__ dyr,
                                         const SrmsnormLayout& L, float rs, int64_t j0, int64_t step) {
  float dot = 0.f;
  for (int64_t j = j0; j < L.C; j += step) {
    const float n = cuda::to_float(xr[j]) * rs;
    dot += n * gated(scaled_grad(dyr, tr, n, L, j), ur, j);
  }
  return dot;
}

template <class TX, class TDY, class TDX>
__global__ void __launch_bounds__(kMaxThreads)
    srmsnorm_bwd_rows_kernel(const TX* __restrict__ x, const TDY* __restrict__ u, const TDY* __restrict__ t,
                             const float* __restrict__ rstd, const TDY* __restrict__ dy, TDX* __restrict__ dx,
                             TDX* __restrict__ du, SrmsnormLayout L, bool accumulate) {
  const int64_t r = (blockIdx.x * int64_t{kMaxThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= L.N) return;
  const TX* xr = x + r * L.x;
  const TDY* ur = u ? u + r * L.u : nullptr;
  const TDY* tr = t ? t + r * L.t : nullptr;
  const TDY* dyr = dy + r * L.dy;
  const float rs = rstd[r];
  const float m = cuda::warp_sum(bwd_dot(xr, ur, tr, dyr, L, rs, lane, 32)) / static_cast<float>(L.C);
  srmsnorm_bwd_row(xr, ur, tr, dyr, dx + r * L.dx, du ? du + r * L.du : nullptr, L, rs, m, lane, 32, accumulate);
}

template <class TX, class TY>
__global__ void srmsnorm_fwd_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const TY* __restrict__ u,
                                    TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, SrmsnormLayout L,
                                    float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * L.x;
  TX* hr = add ? h + r * L.h : nullptr;
  const TY* ur = u ? u + r * L.u : nullptr;
  const float ss = sum_squares(xr, add ? add + r * L.add : nullptr, hr, threadIdx.x, L.C, blockDim.x);
  const float rs = rsqrtf(cuda::block_sum(ss, scratch) / static_cast<float>(L.C) + eps);
  const float ry = rs * static_cast<float>(L.scale);
  if (threadIdx.x == 0) rstd[r] = rs;
  if (hr) xr = hr;
  for (int64_t j = threadIdx.x; j < L.C; j += blockDim.x)
    y[r * L.y + j] = cuda::from_float<TY>(gated(cuda::to_float(xr[j]) * ry, ur, j));
}

template <class TX, class TDY, class TDX>
__global__ void srmsnorm_bwd_kernel(const TX* __restrict__ x, const TDY* __restrict__ u, const TDY* __restrict__ t,
                                    const float* __restrict__ rstd, const TDY* __restrict__ dy, TDX* __restrict__ dx,
                                    TDX* __restrict__ du, SrmsnormLayout L, bool accumulate) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const TX* xr = x + r * L.x;
  const TDY* ur = u ? u + r * L.u : nullptr;
  const TDY* tr = t ? t + r * L.t : nullptr;
  const TDY* dyr = dy + r * L.dy;
  const float rs = rstd[r];
  const float m =
      cuda::block_sum(bwd_dot(xr, ur, tr, dyr, L, rs, threadIdx.x, blockDim.x), scratch) / static_cast<float>(L.C);
  srmsnorm_bwd_row(xr, ur, tr, dyr, dx + r * L.dx, du ? du + r * L.du : nullptr, L, rs, m, threadIdx.x, blockDim.x,
                   accumulate);
}

// How the register-row kernels hold a row (cuda::row_group_split), or {0, 0} where they do not
// apply (also: an operand's rows, pointer and row stride, not 4-aligned).
cuda::RowGroupSplit vec_split(const SrmsnormLayout& L,
                              std::initializer_list<std::pair<const Tensor*, int64_t>> operands) {
  for (const auto& [t, ld] : operands)
    if (t->ptr && !cuda::rows_vec4(t->ptr, dtype_size(t->dtype), ld)) return {};
  return cuda::row_group_split(L.C, kMaxChunks, kMaxGroupWarps);
}

// Threads per row: enough for one pass over the row, up to kMaxThreads.
int threads_for(int64_t c) { return static_cast<int>(std::clamp<int64_t>((c + 31) / 32 * 32, 32, kMaxThreads)); }

}  // namespace

void srmsnorm_fwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& y, const Tensor& rstd,
                       float eps, const Tensor& add, const Tensor& h, const Tensor& u) {
  LINAC_CHECK(rstd.dtype == DType::F32, "srmsnorm (GPU): rstd must be f32");
  if (L.N == 0) return;
  cudaStream_t st = cuda::stream_of(ctx);
  const cuda::RowGroupSplit vs = vec_split(L, {{&x, L.x}, {&y, L.y}, {&add, L.add}, {&h, L.h}, {&u, L.u}});
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(y.dtype, TY, {
                       const TY* a = ptr_or_null<TY>(add);
                       const TY* g = ptr_or_null<TY>(u);
                       TX* hp = ptr_or_null<TX>(h);
                       if (vs.warps)
                         srmsnorm_fwd_vec_kernel<TX, TY>
                             <<<cuda::grid_1d(L.N * 32 * vs.warps, kMaxThreads), kMaxThreads, 0, st>>>(
                                 x.data<TX>(), a, g, y.data<TY>(), rstd.data<float>(), hp, L, vs.warps, vs.chunks, eps);
                       else if (L.C <= kWarpRowMax)
                         srmsnorm_fwd_rows_kernel<TX, TY><<<cuda::grid_1d(L.N * 32, kMaxThreads), kMaxThreads, 0, st>>>(
                             x.data<TX>(), a, g, y.data<TY>(), rstd.data<float>(), hp, L, eps);
                       else
                         srmsnorm_fwd_kernel<TX, TY><<<static_cast<unsigned>(L.N), threads_for(L.C), 0, st>>>(
                             x.data<TX>(), a, g, y.data<TY>(), rstd.data<float>(), hp, L, eps);
                     }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void srmsnorm_bwd_cuda(const Ctx& ctx, const SrmsnormLayout& L, const Tensor& x, const Tensor& rstd, const Tensor& dy,
                       const Tensor& dx, bool accumulate, const Tensor& u, const Tensor& du, const Tensor& t) {
  LINAC_CHECK(rstd.dtype == DType::F32, "srmsnorm (GPU): rstd must be f32");
  if (L.N == 0) return;
  cudaStream_t st = cuda::stream_of(ctx);
  const cuda::RowGroupSplit vs = vec_split(L, {{&x, L.x}, {&dy, L.dy}, {&dx, L.dx}, {&u, L.u}, {&du, L.du}, {&t, L.t}});
  LINAC_GPU_DISPATCH(
      x.dtype, TX,
      LINAC_GPU_DISPATCH(
          dy.dtype, TDY, LINAC_GPU_DISPATCH(dx.dtype, TDX, {
            const TDY* g = ptr_or_null<TDY>(u);
            const TDY* tg = ptr_or_null<TDY>(t);
            TDX* dg = ptr_or_null<TDX>(du);
            if (vs.warps)
              srmsnorm_bwd_vec_kernel<TX, TDY, TDX>
                  <<<cuda::grid_1d(L.N * 32 * vs.warps, kMaxThreads), kMaxThreads, 0, st>>>(
                      x.data<TX>(), g, tg, rstd.data<float>(), dy.data<TDY>(), dx.data<TDX>(), dg, L, vs.warps,
                      vs.chunks, accumulate);
            else if (L.C <= kWarpRowMax)
              srmsnorm_bwd_rows_kernel<TX, TDY, TDX><<<cuda::grid_1d(L.N * 32, kMaxThreads), kMaxThreads, 0, st>>>(
                  x.data<TX>(), g, tg, rstd.data<float>(), dy.data<TDY>(), dx.data<TDX>(), dg, L, accumulate);
            else
              srmsnorm_bwd_kernel<TX, TDY, TDX><<<static_cast<unsigned>(L.N), threads_for(L.C), 0, st>>>(
                  x.data<TX>(), g, tg, rstd.data<float>(), dy.data<TDY>(), dx.data<TDX>(), dg, L, accumulate);
          })));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
