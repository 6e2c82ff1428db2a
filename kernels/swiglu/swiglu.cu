// CUDA gated linear unit (math in swiglu.h), compiled once per gate activation. One block per
// row; when F is a multiple of four and every pointer is aligned, each thread handles four
// consecutive columns with vector accesses.
#include <algorithm>

#include "common/cuda_common.cuh"
#include "swiglu/swiglu.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace {

constexpr int kMaxThreads = 256;

template <GluAct kAct, bool kVec, class TH, class TA>
__global__ void swiglu_fwd_kernel(const TH* __restrict__ h, TA* __restrict__ a, int64_t f) {
  cuda::dependent_wait();
  cuda::dependent_release();
  const int64_t r = blockIdx.x;
  const TH* g = h + r * 2 * f;
  const TH* u = g + f;
  TA* ar = a + r * f;
  if constexpr (kVec) {
    for (int64_t j = 4 * threadIdx.x; j < f; j += 4 * blockDim.x) {
      const float4 gv = cuda::load4(g + j), uv = cuda::load4(u + j);
      cuda::store4(ar + j, make_float4(cuda::swiglu<kAct>(gv.x, uv.x), cuda::swiglu<kAct>(gv.y, uv.y),
                                       cuda::swiglu<kAct>(gv.z, uv.z), cuda::swiglu<kAct>(gv.w, uv.w)));
    }
  } else {
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x)
      ar[j] = cuda::from_float<TA>(cuda::swiglu<kAct>(cuda::to_float(g[j]), cuda::to_float(u[j])));
  }
}

template <GluAct kAct, bool kVec, class TH, class TG>
__global__ void swiglu_bwd_kernel(const TH* __restrict__ h, const TG* __restrict__ da, TG* __restrict__ dh,
                                  int64_t f) {
  const int64_t r = blockIdx.x;
  const TH* g = h + r * 2 * f;
  const TH* u = g + f;
  const TG* dar = da + r * f;
  TG* dg = dh + r * 2 * f;
  TG* du = dg + f;
  if constexpr (kVec) {
    for (int64_t j = 4 * threadIdx.x; j < f; j += 4 * blockDim.x) {
      const float4 gv = cuda::load4(g + j), uv = cuda::load4(u + j), dv = cuda::load4(dar + j);
      float4 dgv, duv;
      cuda::swiglu_grad<kAct>(gv.x, uv.x, dv.x, dgv.x, duv.x);
      cuda::swiglu_grad<kAct>(gv.y, uv.y, dv.y, dgv.y, duv.y);
      cuda::swiglu_grad<kAct>(gv.z, uv.z, dv.z, dgv.z, duv.z);
      cuda::swiglu_grad<kAct>(gv.w, uv.w, dv.w, dgv.w, duv.w);
      cuda::store4(dg + j, dgv);
      cuda::store4(du + j, duv);
    }
  } else {
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
      float dgj, duj;
      cuda::swiglu_grad<kAct>(cuda::to_float(g[j]), cuda::to_float(u[j]), cuda::to_float(dar[j]), dgj, duj);
      dg[j] = cuda::from_float<TG>(dgj);
      du[j] = cuda::from_float<TG>(duj);
    }
  }
}

// Thread per 8-column unit of the value half (swiglu_value_dots).
template <class TH, class TG>
__global__ void swiglu_value_dots_kernel(const TH* __restrict__ h, const TG* __restrict__ dh, float* __restrict__ dots,
                                         int64_t n, int64_t f) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, units = f / 8;
  if (i >= n * units) return;
  const int64_t r = i / units, c0 = r * 2 * f + f + 8 * (i - r * units);
  float acc = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) acc = __fmaf_rn(cuda::to_float(dh[c0 + c]), cuda::to_float(h[c0 + c]), acc);
  dots[i] = acc;
}

// Threads per row: enough for one pass over the row's columns (or vector groups), up to kMaxThreads.
int threads_for(int64_t items) {
  return static_cast<int>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kMaxThreads));
}

template <GluAct kAct>
void launch_fwd(const Ctx& ctx, const Tensor& h, const Tensor& a) {
  const int64_t n = a.size(0), f = a.size(1);
  const bool vec = f % 4 == 0 && cuda::vec4_aligned(h) && cuda::vec4_aligned(a);
  const int threads = threads_for(vec ? f / 4 : f);
  LINAC_GPU_DISPATCH(h.dtype, TH, LINAC_GPU_DISPATCH(a.dtype, TA, {
    auto kernel = vec ? swiglu_fwd_kernel<kAct, true, TH, TA> : swiglu_fwd_kernel<kAct, false, TH, TA>;
    cuda::launch_dependent(ctx, kernel, dim3(static_cast<unsigned>(n)), dim3(threads), 0, h.data<TH>(), a.data<TA>(), f);
  }));
}

template <GluAct kAct>
void launch_bwd(const Ctx& ctx, const Tensor& h, const Tensor& da, const Tensor& dh) {
  const int64_t n = da.size(0), f = da.size(1);
  const bool vec = f % 4 == 0 && cuda::vec4_aligned(h) && cuda::vec4_aligned(da) && cuda::vec4_aligned(dh);
  const int threads = threads_for(vec ? f / 4 : f);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(h.dtype, TH, LINAC_GPU_DISPATCH(da.dtype, TG, {
    if (vec)
      swiglu_bwd_kernel<kAct, true, TH, TG><<<static_cast<unsigned>(n), threads, 0, st>>>(h.data<TH>(), da.data<TG>(),
                                                                                          dh.data<TG>(), f);
    else
      swiglu_bwd_kernel<kAct, false, TH, TG><<<static_cast<unsigned>(n), threads, 0, st>>>(h.data<TH>(), da.data<TG>(),
                                                                                           dh.data<TG>(), f);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

void swiglu_fwd_cuda(const Ctx& ctx, const Tensor& h, const Tensor& a, GluAct act) {
  if (a.size(0) == 0 || a.size(1) == 0) return;
  if (act == GluAct::Silu)
    launch_fwd<GluAct::Silu>(ctx, h, a);
  else
    launch_fwd<GluAct::Identity>(ctx, h, a);
}

void swiglu_value_dots_cuda(const Ctx& ctx, const Tensor& h, const Tensor& dh, const Tensor& dots) {
  const int64_t n = h.size(0), f = h.size(1) / 2;
  if (n == 0 || f == 0) return;
  LINAC_GPU_DISPATCH(h.dtype, TH, LINAC_GPU_DISPATCH(dh.dtype, TG, {
    swiglu_value_dots_kernel<TH, TG><<<cuda::grid_1d(n * (f / 8), kMaxThreads), kMaxThreads, 0, cuda::stream_of(ctx)>>>(
        h.data<TH>(), dh.data<TG>(), dots.data<float>(), n, f);
  }));
  LINAC_CUDA_LAUNCH_CHECK();
}

void swiglu_bwd_cuda(const Ctx& ctx, const Tensor& h, const Tensor& da, const Tensor& dh, GluAct act) {
  LINAC_CHECK(da.dtype == dh.dtype, "swiglu (GPU): da and dh must share a dtype");
  if (da.size(0) == 0 || da.size(1) == 0) return;
  if (act == GluAct::Silu)
    launch_bwd<GluAct::Silu>(ctx, h, da, dh);
  else
    launch_bwd<GluAct::Identity>(ctx, h, da, dh);
}

}  // namespace linac
