// CUDA SiLU (math in activation.h), row-tiled (cuda::row_tiling: narrow column ranges such as
// one head's width still fill a CTA): each thread takes four consecutive columns per access
// where every row start is 4-aligned (one 8- or 16-byte access), one column otherwise.
#include <algorithm>

#include "activation/activation.h"
#include "activation/sigmoid.cuh"
#include "common/cuda_common.cuh"

namespace linac {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu(float v) { return v * cuda::sigmoid(v); }

template <bool kVec, class T>
__global__ void __launch_bounds__(kThreads) silu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                                            int c, int64_t ldx, int64_t ldy, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= n) return;
  const T* xr = x + rs.row * ldx;
  T* yr = y + rs.row * ldy;
  if constexpr (kVec) {
    for (int j = 4 * rs.lane; j < c; j += 4 * rs.lanes) {
      const float4 v = cuda::load4(xr + j);
      cuda::store4(yr + j, make_float4(silu(v.x), silu(v.y), silu(v.z), silu(v.w)));
    }
  } else {
    for (int j = rs.lane; j < c; j += rs.lanes) yr[j] = cuda::from_float<T>(silu(cuda::to_float(xr[j])));
  }
}

template <bool kVec, class T>
__global__ void __launch_bounds__(kThreads) silu_bwd_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                                            T* __restrict__ dx, int64_t n, int c, int64_t ldx,
                                                            int64_t lddy, int64_t lddx, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= n) return;
  const T* xr = x + rs.row * ldx;
  const T* dyr = dy + rs.row * lddy;
  T* dxr = dx + rs.row * lddx;
  if constexpr (kVec) {
    for (int j = 4 * rs.lane; j < c; j += 4 * rs.lanes) {
      const float4 v = cuda::load4(xr + j), g = cuda::load4(dyr + j);
      cuda::store4(dxr + j, make_float4(g.x * cuda::silu_grad(v.x), g.y * cuda::silu_grad(v.y),
                                        g.z * cuda::silu_grad(v.z), g.w * cuda::silu_grad(v.w)));
    }
  } else {
    for (int j = rs.lane; j < c; j += rs.lanes)
      dxr[j] = cuda::from_float<T>(cuda::to_float(dyr[j]) * cuda::silu_grad(cuda::to_float(xr[j])));
  }
}

bool rows_vec4(const Tensor& t, int64_t ld) { return cuda::rows_vec4(t.ptr, dtype_size(t.dtype), ld); }

}  // namespace

void silu_fwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& y) {
  LINAC_CHECK(x.dtype == y.dtype, "silu (GPU): x and y must share a dtype");
  LINAC_CHECK(L.C < (int64_t{1} << 30), "silu (GPU): more than 2^30 columns");
  if (L.N * L.C == 0) return;
  const bool vec = L.C % 4 == 0 && rows_vec4(x, L.x) && rows_vec4(y, L.y);
  const cuda::RowTiling ln = cuda::row_tiling(L.N, vec ? (L.C + 3) / 4 : L.C, kThreads);
  const int c = static_cast<int>(L.C);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    if (vec)
      silu_fwd_kernel<true, T><<<ln.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(x.data<T>(), y.data<T>(), L.N, c, L.x,
                                                                               L.y, ln.log_tpr);
    else
      silu_fwd_kernel<false, T><<<ln.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(x.data<T>(), y.data<T>(), L.N, c, L.x,
                                                                                L.y, ln.log_tpr);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void silu_bwd_cuda(const Ctx& ctx, const SiluLayout& L, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  LINAC_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "silu (GPU): x, dy and dx must share a dtype");
  LINAC_CHECK(L.C < (int64_t{1} << 30), "silu (GPU): more than 2^30 columns");
  if (L.N * L.C == 0) return;
  const bool vec = L.C % 4 == 0 && rows_vec4(x, L.x) && rows_vec4(dy, L.dy) && rows_vec4(dx, L.dx);
  const cuda::RowTiling ln = cuda::row_tiling(L.N, vec ? (L.C + 3) / 4 : L.C, kThreads);
  const int c = static_cast<int>(L.C);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    if (vec)
      silu_bwd_kernel<true, T><<<ln.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(
          x.data<T>(), dy.data<T>(), dx.data<T>(), L.N, c, L.x, L.dy, L.dx, ln.log_tpr);
    else
      silu_bwd_kernel<false, T><<<ln.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(
          x.data<T>(), dy.data<T>(), dx.data<T>(), L.N, c, L.x, L.dy, L.dx, ln.log_tpr);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
