// CUDA RMSNorm (math in rmsnorm.h). Rows of 128 * k columns up to 4096 (every model width in
// configs/) are held in registers by a row group of 1, 2 or 4 warps: lane l of the group's warp q
// keeps columns 128 c + 4 l .. 128 c + 4 l + 3 of its chunks c = q k', ..., q k' + k' - 1 (k' <= 8
// chunks per warp), so a row is read once with 16- (f32) or 8-byte (bf16) accesses and reduced
// without a block-wide barrier (a group of several warps adds its warp sums through shared memory
// under its own named barrier); the kernels also do the optional residual add (x + add -> h) and
// write dx_copy from the same registers. The backward runs a fixed number of row groups, each over
// every n-th row, adding its rows' dy * x * rstd into a dw slab in registers (x, dy and the dx it
// adds to are read once, all before the row's reduction, so a row costs one memory round trip).
// Other widths: a block per row, and dw from a second pass over row slabs. Either way the slabs
// land in the context's workspace and are summed in a fixed order: deterministic.
#include <initializer_list>

#include "common/cuda_common.cuh"
#include "elementwise/elementwise.h"
#include "reduce/reduce.h"
#include "rmsnorm/rmsnorm.h"

namespace linac {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSlabs = 256;
constexpr int kMaxChunks = 8;        // register rows: up to 8 chunks of 128 columns per warp
constexpr int kMaxGroupWarps = 4;    // and up to 4 warps per row
constexpr int64_t kRowWarps = 1024;  // the register-row backward's warps, at most

// The sum of v over the row group of kWarps warps the calling warp belongs to (cuda::group_sum):
// a loop over rows alternates `parity`, so a warp that is one row ahead cannot overwrite a slot its
// group still reads, and one barrier per row suffices.
template <int kWarps>
__device__ __forceinline__ float row_sum(float v, float (*slots)[kThreads / 32], int parity) {
  return cuda::group_sum(v, kWarps, slots[parity]);
}

// Element offset, within a row, of the first of lane's four columns in chunk c of the group's warp.
template <int kWarps, int kChunks>
__device__ __forceinline__ int row_column(int c) {
  return 128 * ((threadIdx.x >> 5) % kWarps * kChunks + c) + 4 * (threadIdx.x & 31);
}

template <int kWarps, int kChunks, class TX, class TY>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_rows_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const float* __restrict__ w,
                            TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, int64_t rows, float eps) {
  constexpr int kDim = 128 * kChunks * kWarps;
  __shared__ float slots[1][kThreads / 32];
  const int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / (32 * kWarps);
  if (r >= rows) return;  // the whole group: its warps share r
  cuda::dependent_wait();
  cuda::dependent_release();
  float4 v[kChunks];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = r * kDim + row_column<kWarps, kChunks>(c);
    v[c] = cuda::load4(x + i);
    if (add) {
      const float4 a = cuda::load4(add + i);
      v[c] = make_float4(cuda::rounded<TX>(v[c].x + a.x), cuda::rounded<TX>(v[c].y + a.y),
                         cuda::rounded<TX>(v[c].z + a.z), cuda::rounded<TX>(v[c].w + a.w));
    }
    ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
  }
  const float rs = rsqrtf(row_sum<kWarps>(ss, slots, 0) / static_cast<float>(kDim) + eps);
  if (threadIdx.x % (32 * kWarps) == 0) rstd[r] = rs;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = row_column<kWarps, kChunks>(c);
    const int64_t i = r * kDim + col;
    const float4 wv = cuda::load4(w + col);
    cuda::store4(y + i, make_float4(v[c].x * rs * wv.x, v[c].y * rs * wv.y, v[c].z * rs * wv.z, v[c].w * rs * wv.w));
    if (h) cuda::store4(h + i, v[c]);
  }
}

// Row group s of S = gridDim.x * kThreads / (32 kWarps) takes rows s, s + S, ... and writes its
// dw slab to partial[s].
template <int kWarps, int kChunks, class TX, class TY>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_rows_kernel(const TX* __restrict__ x, const float* __restrict__ w, const float* __restrict__ rstd,
                            const TY* __restrict__ dy, TX* __restrict__ dx, TY* __restrict__ dx_copy,
                            float* __restrict__ partial, int64_t rows) {
  constexpr int kDim = 128 * kChunks * kWarps;
  __shared__ float slots[2][kThreads / 32];
  const int64_t slab = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / (32 * kWarps);
  const int64_t slabs = gridDim.x * int64_t{kThreads} / (32 * kWarps);
  float4 wv[kChunks], dw[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    wv[c] = cuda::load4(w + row_column<kWarps, kChunks>(c));
    dw[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  int parity = 0;
  for (int64_t r = slab; r < rows; r += slabs, parity ^= 1) {
    const float rs = rstd[r];
    float4 xv[kChunks], gv[kChunks], ov[kChunks];  // x, g = dy * w, and the dx being added to
    float dot = 0.f;
    // dx is loaded with x and dy, before the row's reduction: one memory round trip per row.
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = r * kDim + row_column<kWarps, kChunks>(c);
      xv[c] = cuda::load4(x + i);
      ov[c] = cuda::load4(dx + i);
      const float4 d = cuda::load4(dy + i);
      gv[c] = make_float4(d.x * wv[c].x, d.y * wv[c].y, d.z * wv[c].z, d.w * wv[c].w);
      dot += gv[c].x * xv[c].x + gv[c].y * xv[c].y + gv[c].z * xv[c].z + gv[c].w * xv[c].w;
      dw[c].x += d.x * xv[c].x * rs;
      dw[c].y += d.y * xv[c].y * rs;
      dw[c].z += d.z * xv[c].z * rs;
      dw[c].w += d.w * xv[c].w * rs;
    }
    const float k = rs * rs * rs * row_sum<kWarps>(dot, slots, parity) / static_cast<float>(kDim);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = r * kDim + row_column<kWarps, kChunks>(c);
      float4 o = ov[c];
      o.x += rs * gv[c].x - xv[c].x * k;
      o.y += rs * gv[c].y - xv[c].y * k;
      o.z += rs * gv[c].z - xv[c].z * k;
      o.w += rs * gv[c].w - xv[c].w * k;
      cuda::store4(dx + i, o);
      if (dx_copy) cuda::store4(dx_copy + i, o);
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) cuda::store4(partial + slab * kDim + row_column<kWarps, kChunks>(c), dw[c]);
}

// How the register-row kernels hold rows of `dim` columns (cuda::row_group_split), or {0, 0}
// where they do not apply (also: an operand not 4-aligned).
cuda::RowGroupSplit row_split(int64_t dim, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->ptr && !cuda::vec4_aligned(*t)) return {};
  return cuda::row_group_split(dim, kMaxChunks, kMaxGroupWarps);
}

// Calls fn(integral_constant warps, integral_constant chunks) for a split row_split returned
// (groups of several warps exist only where one warp would need more than 8 chunks: 5 to 8 each).
template <class Fn>
void with_split(cuda::RowGroupSplit s, Fn&& fn) {
  switch (s.warps) {
    case 1: cuda::with_const<kMaxChunks>(s.chunks, [&](auto k) { fn(std::integral_constant<int, 1>{}, k); }); break;
    case 2: cuda::with_const<kMaxChunks, 5>(s.chunks, [&](auto k) { fn(std::integral_constant<int, 2>{}, k); }); break;
    case 4: cuda::with_const<kMaxChunks, 5>(s.chunks, [&](auto k) { fn(std::integral_constant<int, 4>{}, k); }); break;
  }
}

unsigned row_group_blocks(int64_t rows, int warps) {
  return static_cast<unsigned>((rows * 32 * warps + kThreads - 1) / kThreads);
}

// With the residual add, each thread writes its columns of h and reads them back itself.
template <class TX, class TY>
__global__ void rmsnorm_fwd_kernel(const TX* __restrict__ x, const TY* __restrict__ add, const float* __restrict__ w,
                                   TY* __restrict__ y, float* __restrict__ rstd, TX* __restrict__ h, int64_t dim,
                                   float eps) {
  __shared__ float scratch[32];
  cuda::dependent_wait();
  cuda::dependent_release();
  const int64_t r = blockIdx.x;
  const TX* xr = add ? h + r * dim : x + r * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = cuda::to_float(x[r * dim + j]);
    if (add) {
      v = cuda::rounded<TX>(v + cuda::to_float(add[r * dim + j]));
      h[r * dim + j] = cuda::from_float<TX>(v);
    }
    ss += v * v;
  }
  const float rs = rsqrtf(cuda::block_sum(ss, scratch) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    y[r * dim + j] = cuda::from_float<TY>(cuda::to_float(xr[j]) * rs * w[j]);
}

template <class TX, class TY>
__global__ void rmsnorm_bwd_dx_kernel(const TX* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ rstd, const TY* __restrict__ dy, TX* __restrict__ dx,
                                      int64_t dim) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float rs = rstd[r];
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    dot += cuda::to_float(dy[r * dim + j]) * w[j] * cuda::to_float(x[r * dim + j]);
  const float c = rs * rs * rs * cuda::block_sum(dot, scratch) / static_cast<float>(dim);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const int64_t i = r * dim + j;
    const float g = rs * cuda::to_float(dy[i]) * w[j] - cuda::to_float(x[i]) * c;
    dx[i] = cuda::from_float<TX>(cuda::to_float(dx[i]) + g);
  }
}

// partial[s, j] = sum over rows of slab s of dy * x * rstd.
template <class TX, class TY>
__global__ void rmsnorm_bwd_dw_partial_kernel(const TX* __restrict__ x, const float* __restrict__ rstd,
                                              const TY* __restrict__ dy, float* __restrict__ partial, int64_t rows,
                                              int64_t dim, int64_t rows_per_slab) {
  const int64_t s = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t r0 = s * rows_per_slab, r1 = min(rows, r0 + rows_per_slab);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += cuda::to_float(dy[r * dim + j]) * cuda::to_float(x[r * dim + j]) * rstd[r];
  partial[s * dim + j] = acc;
}

}  // namespace

void rmsnorm_fwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps,
                      const Tensor& add, const Tensor& h) {
  LINAC_CHECK(w.dtype == DType::F32 && rstd.dtype == DType::F32, "rmsnorm (GPU): w and rstd must be f32");
  const int64_t rows = x.size(0), dim = x.size(1);
  if (rows == 0) return;
  const cuda::RowGroupSplit split = row_split(dim, {&x, &add, &w, &y, &h});
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(y.dtype, TY, {
                       const TY* a = add.ptr ? add.data<TY>() : nullptr;
                       TX* hp = h.ptr ? h.data<TX>() : nullptr;
                       if (split.warps) {
                         with_split(split, [&](auto warps, auto k) {
                           cuda::launch_dependent(
                               ctx, rmsnorm_fwd_rows_kernel<decltype(warps)::value, decltype(k)::value, TX, TY>,
                               dim3(row_group_blocks(rows, split.warps)), dim3(kThreads), 0, x.data<TX>(), a,
                               w.data<float>(), y.data<TY>(), rstd.data<float>(), hp, rows, eps);
                         });
                       } else {
                         cuda::launch_dependent(ctx, rmsnorm_fwd_kernel<TX, TY>, dim3(static_cast<unsigned>(rows)),
                                                dim3(kThreads), 0, x.data<TX>(), a, w.data<float>(), y.data<TY>(),
                                                rstd.data<float>(), hp, dim, eps);
                       }
                     }));
}

void rmsnorm_bwd_cuda(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      const Tensor& dx, const Tensor& dw, const Tensor& dx_copy) {
  LINAC_CHECK(w.dtype == DType::F32 && rstd.dtype == DType::F32 && dw.dtype == DType::F32,
              "rmsnorm (GPU): w, rstd and dw must be f32");
  LINAC_CHECK(dx.dtype == x.dtype && dy.dtype != DType::F64, "rmsnorm (GPU): dx must have x's dtype");
  const int64_t rows = x.size(0), dim = x.size(1);
  if (rows == 0) return;
  const cuda::RowGroupSplit split = row_split(dim, {&x, &w, &dy, &dx, &dx_copy});
  // Register rows: a fixed number of row groups (whole blocks, independent of the GPU, so the dw
  // sums keep their order everywhere) each take every slabs-th row and keep their dw slab in
  // registers.
  const unsigned row_blocks =
      split.warps ? row_group_blocks(std::min<int64_t>(rows, kRowWarps / split.warps), split.warps) : 0;
  const int64_t slabs =
      split.warps ? int64_t{row_blocks} * kThreads / (32 * split.warps) : std::min<int64_t>(rows, kMaxSlabs);
  const int64_t rows_per_slab = (rows + slabs - 1) / slabs;
  LINAC_CHECK(static_cast<size_t>(slabs * dim) * sizeof(float) <= ctx.workspace_bytes,
              "rmsnorm (GPU): workspace too small");
  float* partial = static_cast<float*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(x.dtype, TX, LINAC_GPU_DISPATCH(dy.dtype, TY, {
    if (split.warps) {
      with_split(split, [&](auto warps, auto k) {
        rmsnorm_bwd_rows_kernel<decltype(warps)::value, decltype(k)::value, TX, TY><<<row_blocks, kThreads, 0, st>>>(
            x.data<TX>(), w.data<float>(), rstd.data<float>(), dy.data<TY>(), dx.data<TX>(),
            dx_copy.ptr ? dx_copy.data<TY>() : nullptr, partial, rows);
      });
    } else {
      rmsnorm_bwd_dx_kernel<TX, TY><<<static_cast<unsigned>(rows), kThreads, 0, st>>>(
          x.data<TX>(), w.data<float>(), rstd.data<float>(), dy.data<TY>(), dx.data<TX>(), dim);
      LINAC_CUDA_LAUNCH_CHECK();
      dim3 grid(cuda::grid_1d(dim, kThreads), static_cast<unsigned>(slabs));
      rmsnorm_bwd_dw_partial_kernel<TX, TY><<<grid, kThreads, 0, st>>>(
          x.data<TX>(), rstd.data<float>(), dy.data<TY>(), partial, rows, dim, rows_per_slab);
    }
  }));
  LINAC_CUDA_LAUNCH_CHECK();
  add_slab_sums_cuda(ctx, partial, slabs, dim, dw.data<float>());
  if (dx_copy.ptr && !split.warps) cast(ctx, dx_copy, dx);
}

}  // namespace linac
