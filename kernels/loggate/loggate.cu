// CUDA log-space forget gate (math in loggate.h): f32 math; the threads of a row take groups of
// V = 4 consecutive columns (vector accesses; V = 1 where the rows or d are not 4-aligned), rows
// tiled over the CTA (cuda::row_tiling), so no thread divides an index.
#include "common/cuda_common.cuh"
#include "loggate/loggate.h"
#include "loggate/loggate_math.h"

namespace linac {
namespace {

constexpr int kThreads = 256;

using loggate::logsigmoid;
using loggate::sigmoid_neg;

template <int V, class TZ>
__global__ void loggate_fwd_kernel(const TZ* __restrict__ z, int64_t ldz, const float* __restrict__ b,
                                   float* __restrict__ g, int64_t ldg, int64_t n, int d, float inv_tau, float clamp,
                                   bool clamped, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= n) return;
  const TZ* const zr = z + rs.row * ldz;
  float* const gr = g + rs.row * ldg;
  for (int j = V * rs.lane; j < d; j += V * rs.lanes) {
    float zv[V], bv[V], gv[V];
    cuda::load_vals<V>(zr + j, zv);
    cuda::load_vals<V>(b + j, bv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float v = logsigmoid(zv[e] + bv[e]) * inv_tau;
      gv[e] = clamped ? fmaxf(v, clamp) : v;
    }
    cuda::store_vals<V>(gr + j, gv);
  }
}

template <int V, class TZ, class TD>
__global__ void loggate_bwd_kernel(const TZ* __restrict__ z, int64_t ldz, const float* __restrict__ b,
                                   const float* __restrict__ dg, int64_t lddg, TD* __restrict__ dz, int64_t lddz,
                                   int64_t n, int d, float inv_tau, float clamp, bool clamped, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= n) return;
  const TZ* const zr = z + rs.row * ldz;
  const float* const dgr = dg + rs.row * lddg;
  TD* const dzr = dz + rs.row * lddz;
  for (int j = V * rs.lane; j < d; j += V * rs.lanes) {
    float zv[V], bv[V], gv[V], ov[V];
    cuda::load_vals<V>(zr + j, zv);
    cuda::load_vals<V>(b + j, bv);
    cuda::load_vals<V>(dgr + j, gv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float x = zv[e] + bv[e];
      const bool pass = !clamped || logsigmoid(x) * inv_tau >= clamp;
      ov[e] = pass ? gv[e] * sigmoid_neg(x) * inv_tau : 0.f;
    }
    cuda::store_vals<V>(dzr + j, ov);
  }
}

// Whether the groups of four may be used on these matrices: d, every row stride and pointer 4-aligned.
bool groups_of_four(int64_t d, std::initializer_list<const Tensor*> ts) {
  bool ok = d % 4 == 0;
  for (const Tensor* t : ts) ok = ok && cuda::rows_vec4(t->ptr, dtype_size(t->dtype), loggate_ld(*t));
  return ok;
}

}  // namespace

void loggate_fwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& g, const LogGateOpts& o) {
  LINAC_CHECK(b.dtype == DType::F32 && g.dtype == DType::F32, "loggate (GPU): b and g must be f32");
  const int64_t n = z.size(0), d = z.size(1);
  if (n * d == 0) return;
  const int V = groups_of_four(d, {&z, &g}) && cuda::vec4_aligned(b) ? 4 : 1;
  const cuda::RowTiling rt = cuda::row_tiling(n, d / V, kThreads);
  LINAC_GPU_DISPATCH(z.dtype, TZ, {
    auto kernel = V == 4 ? loggate_fwd_kernel<4, TZ> : loggate_fwd_kernel<1, TZ>;
    kernel<<<rt.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(
        z.data<TZ>(), loggate_ld(z), b.data<float>(), g.data<float>(), loggate_ld(g), n, static_cast<int>(d),
        static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped(), rt.log_tpr);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void loggate_bwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& dg, const Tensor& dz,
                      const LogGateOpts& o) {
  LINAC_CHECK(b.dtype == DType::F32 && dg.dtype == DType::F32, "loggate (GPU): b and dg must be f32");
  const int64_t n = z.size(0), d = z.size(1);
  if (n * d == 0) return;
  const int V = groups_of_four(d, {&z, &dg, &dz}) && cuda::vec4_aligned(b) ? 4 : 1;
  const cuda::RowTiling rt = cuda::row_tiling(n, d / V, kThreads);
  LINAC_GPU_DISPATCH(z.dtype, TZ, LINAC_GPU_DISPATCH(dz.dtype, TD, {
    auto kernel = V == 4 ? loggate_bwd_kernel<4, TZ, TD> : loggate_bwd_kernel<1, TZ, TD>;
    kernel<<<rt.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(
        z.data<TZ>(), loggate_ld(z), b.data<float>(), dg.data<float>(), loggate_ld(dg), dz.data<TD>(), loggate_ld(dz),
        n, static_cast<int>(d), static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped(), rt.log_tpr);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
