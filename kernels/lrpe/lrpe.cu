// CUDA LRPE-d (math in lrpe.h). A thread owns one column c = (h, j) of the [B*T, H*D] input and
// walks the (b, t) rows of one slab (grid: column blocks x slabs), keeping theta[c] in a
// register; consecutive threads touch consecutive channels of a row, so every access is
// coalesced. The backward writes dx on the way and leaves the slab's dtheta partial sum in
// ctx.workspace; add_slab_sums_cuda adds the slabs into dtheta in order. Row bt = b T + t also indexes
// the document bounds (positions t - start[bt]); lrpe_fwd_at's rows start at row_pos[b].
#include <algorithm>

#include "common/cuda_common.cuh"
#include "lrpe/lrpe.h"
#include "reduce/reduce.h"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;

template <class T>
__global__ void lrpe_fwd_kernel(const LrpeLayout L, const T* __restrict__ x, const float* __restrict__ theta,
                                T* __restrict__ y, int64_t rows, int64_t rows_per_slab) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= L.H * L.D) return;
  const int64_t hi = c / L.D, j = c - hi * L.D;
  const float th = theta[c];
  const int64_t r0 = blockIdx.y * rows_per_slab, r1 = min(rows, r0 + rows_per_slab);
  for (int64_t bt = r0; bt < r1; ++bt) {
    const int64_t bi = bt / L.T, ti = bt % L.T;
    float s, co;
    const int64_t p0 = L.pos0 + (L.row_pos ? L.row_pos[bi] : 0);
    sincosf(static_cast<float>(p0 + ti - (L.doc_start ? L.doc_start[bt] : 0)) * th, &s, &co);
    const float v = cuda::to_float(x[bi * L.x.b + ti * L.x.t + c]);
    T* yt = y + bi * L.y.b + ti * L.y.t + hi * 2 * L.D;
    yt[j] = cuda::from_float<T>(v * co);
    yt[L.D + j] = cuda::from_float<T>(v * s);
  }
}

// partial[s, c] = sum over the rows of slab s of p * x * (-sin(a) dy_cos + cos(a) dy_sin).
template <class T>
__global__ void lrpe_bwd_kernel(const LrpeLayout L, const T* __restrict__ x, const float* __restrict__ theta,
                                const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ partial,
                                int64_t rows, int64_t rows_per_slab) {
  const int64_t hd = L.H * L.D;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= hd) return;
  const int64_t hi = c / L.D, j = c - hi * L.D;
  const float th = theta[c];
  const int64_t r0 = blockIdx.y * rows_per_slab, r1 = min(rows, r0 + rows_per_slab);
  float acc = 0.f;
  for (int64_t bt = r0; bt < r1; ++bt) {
    const int64_t bi = bt / L.T, ti = bt % L.T;
    const float pos = static_cast<float>(L.pos0 + ti - (L.doc_start ? L.doc_start[bt] : 0));
    float s, co;
    sincosf(pos * th, &s, &co);
    const T* dyt = dy + bi * L.dy.b + ti * L.dy.t + hi * 2 * L.D;
    const float dyc = cuda::to_float(dyt[j]), dys = cuda::to_float(dyt[L.D + j]);
    dx[bi * L.dx.b + ti * L.dx.t + c] = cuda::from_float<T>(dyc * co + dys * s);
    acc += pos * cuda::to_float(x[bi * L.x.b + ti * L.x.t + c]) * (-s * dyc + co * dys);
  }
  partial[blockIdx.y * hd + c] = acc;
}

int threads_for(int64_t hd) { return static_cast<int>(std::clamp<int64_t>((hd + 31) / 32 * 32, 32, kMaxThreads)); }

void check_gpu_args(const LrpeLayout& L, const Tensor& theta) {
  LINAC_CHECK(theta.dtype == DType::F32, "lrpe (GPU): theta must be f32");
  LINAC_CHECK(L.pos0 + L.T <= (int64_t(1) << 24), "lrpe (GPU): positions must be exact in f32 (< 2^24)");
}

}  // namespace

void lrpe_fwd_cuda(const Ctx& ctx, const LrpeLayout& L, const Tensor& x, const Tensor& theta, const Tensor& y) {
  check_gpu_args(L, theta);
  LINAC_CHECK(x.dtype == y.dtype, "lrpe (GPU): x and y must share a dtype");
  const int64_t rows = L.B * L.T, hd = L.H * L.D;
  if (rows == 0 || hd == 0) return;
  const int threads = threads_for(hd);
  const dim3 grid(cuda::grid_1d(hd, threads), static_cast<unsigned>(lrpe_slabs(rows)));
  LINAC_GPU_DISPATCH(x.dtype, T, {
    lrpe_fwd_kernel<T><<<grid, threads, 0, cuda::stream_of(ctx)>>>(L, x.data<T>(), theta.data<float>(), y.data<T>(),
                                                                   rows, lrpe_rows_per_slab(rows));
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void lrpe_bwd_cuda(const Ctx& ctx, const LrpeLayout& L, const Tensor& x, const Tensor& theta, const Tensor& dy,
                   const Tensor& dx, const Tensor& dtheta) {
  check_gpu_args(L, theta);
  LINAC_CHECK(dtheta.dtype == DType::F32, "lrpe (GPU): dtheta must be f32");
  LINAC_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "lrpe (GPU): x, dy and dx must share a dtype");
  const int64_t rows = L.B * L.T, hd = L.H * L.D;
  if (rows == 0 || hd == 0) return;
  LINAC_CHECK(ctx.workspace_bytes >= lrpe_bwd_workspace_bytes(L.B, L.T, L.H, L.D), "lrpe (GPU): workspace too small");
  const int64_t slabs = lrpe_slabs(rows);
  float* partial = static_cast<float*>(ctx.workspace);
  const int threads = threads_for(hd);
  const dim3 grid(cuda::grid_1d(hd, threads), static_cast<unsigned>(slabs));
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, T, {
    lrpe_bwd_kernel<T><<<grid, threads, 0, st>>>(L, x.data<T>(), theta.data<float>(), dy.data<T>(), dx.data<T>(),
                                                 partial, rows, lrpe_rows_per_slab(rows));
  });
  LINAC_CUDA_LAUNCH_CHECK();
  add_slab_sums_cuda(ctx, partial, slabs, hd, dtheta.data<float>());
}

}  // namespace linac
