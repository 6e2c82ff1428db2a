// CUDA Taylor attention decode step (recurrent form for one token; math in taylor_attn.h):
//   S += phi(k^) v~^T,   o~ = S^T phi(q^),   o = o~[:Dv] / (o~[Dv] + eps)     per (batch, head)
// state [B, H, F*F+F+1, Dv+1] f32. Grid B*H: the block forms phi(q^), phi(k^) in shared memory, a
// thread owns one state column j and walks the rows in order, so o~[j] is a fixed-order f32 sum
// (deterministic). The step is memory bound: each state element is read and written once.
#include <cmath>

#include "common/cuda_common.cuh"
#include "taylor_attn/taylor_attn.h"

namespace linac {
namespace {

template <class T>
__global__ void taylor_step_kernel(TaylorStepLayout L, const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, float* __restrict__ S, T* __restrict__ o) {
  extern __shared__ float sm[];
  const int F = static_cast<int>(L.F), Dv = static_cast<int>(L.Dv), R = F * F + F + 1, W = Dv + 1;
  float* phiq = sm;
  float* phik = sm + R;
  float* den = sm + 2 * R;
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H;
  const T* qb = q + b * L.q + h * F;
  const T* kb = k + b * L.k + h * F;
  const float c = rsqrtf(sqrtf(static_cast<float>(F))), r2 = 0.70710678118654752f;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    if (r < F * F) {
      const int i = r / F, j = r % F;
      phiq[r] = (c * cuda::to_float(qb[i])) * (c * cuda::to_float(qb[j])) * r2;
      phik[r] = (c * cuda::to_float(kb[i])) * (c * cuda::to_float(kb[j])) * r2;
    } else if (r < F * F + F) {
      phiq[r] = c * cuda::to_float(qb[r - F * F]);
      phik[r] = c * cuda::to_float(kb[r - F * F]);
    } else {
      phiq[r] = phik[r] = 1.f;
    }
  }
  __syncthreads();
  const int j = threadIdx.x;
  float acc = 0.f;
  if (j < W) {
    const float vj = j < Dv ? cuda::to_float(v[b * L.v + h * Dv + j]) : 1.f;
    float* Sb = S + bh * R * W + j;
    for (int r = 0; r < R; ++r) {
      const float s = fmaf(phik[r], vj, Sb[r * W]);
      Sb[r * W] = s;
      acc = fmaf(phiq[r], s, acc);
    }
    if (j == Dv) *den = acc + static_cast<float>(L.eps);
  }
  __syncthreads();
  if (j < Dv) o[b * L.o + h * Dv + j] = cuda::from_float<T>(acc / *den);
}

}  // namespace

void taylor_attn_step_cuda(const Ctx& ctx, const TaylorStepLayout& L, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& state, const Tensor& o) {
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype,
              "taylor_attn_step (GPU): dtypes must agree");
  LINAC_CHECK(state.dtype == DType::F32, "taylor_attn_step (GPU): the state must be f32");
  LINAC_CHECK(L.F <= 64 && L.Dv < 1024, "taylor_attn_step (GPU): needs F <= 64 and Dv < 1024");
  if (L.B * L.H == 0) return;
  const int R = static_cast<int>(L.F * L.F + L.F + 1), threads = static_cast<int>((L.Dv + 1 + 31) / 32 * 32);
  const size_t smem = (2 * static_cast<size_t>(R) + 1) * sizeof(float);
  LINAC_GPU_DISPATCH(q.dtype, T, {
    auto kernel = taylor_step_kernel<T>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>(L.B * L.H), threads, smem, cuda::stream_of(ctx)>>>(
        L, q.data<T>(), k.data<T>(), v.data<T>(), state.data<float>(), o.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
