// CUDA GLA decode step (recurrent form for one token; math in gla.h):
//   S = exp(g) * S + k^T v,   o = scale * q S          per (batch, head), state f32
// Grid (B*H, Dv/32), kWarps warps per CTA: lane l owns state column j of the CTA's 32 and warp w
// walks the rows i = w, w + kWarps, ... of Dk, updating S and keeping its partial sum of q_i S_ij;
// the warps' partials are added in warp order through shared memory, so o[j] is a fixed-order f32
// sum (deterministic). The step is memory bound (each state element read and written once): the
// rows spread over the warps keep enough loads in flight at batch 1, where B*H*Dv/32 CTAs are few.
#include "common/cuda_common.cuh"
#include "gla/gla.h"

namespace linac {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

template <class T>
__global__ void __launch_bounds__(kThreads) gla_step_kernel(GlaStepLayout L, const T* __restrict__ q,
                                                            const T* __restrict__ k, const T* __restrict__ v,
                                                            const float* __restrict__ g, float* __restrict__ S,
                                                            T* __restrict__ o) {
  __shared__ float partial[kWarps][32];
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool col = j < L.Dv;
  const T* qb = q + b * L.q + h * L.Dk;
  const T* kb = k + b * L.k + h * L.Dk;
  const float* gb = g + b * L.g + h * L.Dk;
  float* Sb = S + bh * L.Dk * L.Dv + j;
  // The state was written by an earlier step (or reset before this one): its first kPre values
  // per thread are loaded before the wait (cuda_common.cuh), overlapping the kernels ahead.
  constexpr int kPre = 16;
  float s_pre[kPre];
#pragma unroll
  for (int t = 0; t < kPre; ++t) {
    const int64_t i = warp + int64_t{t} * kWarps;
    s_pre[t] = col && i < L.Dk ? Sb[i * L.Dv] : 0.f;
  }
  cuda::dependent_wait();
  cuda::dependent_release();
  const float vj = col ? cuda::to_float(v[b * L.v + h * L.Dv + j]) : 0.f;
  float acc = 0.f;
  if (col) {
#pragma unroll
    for (int t = 0; t < kPre; ++t) {
      const int64_t i = warp + int64_t{t} * kWarps;
      if (i >= L.Dk) break;
      const float s = expf(gb[i]) * s_pre[t] + cuda::to_float(kb[i]) * vj;
      Sb[i * L.Dv] = s;
      acc = fmaf(cuda::to_float(qb[i]), s, acc);
    }
#pragma unroll 4
    for (int64_t i = warp + int64_t{kPre} * kWarps; i < L.Dk; i += kWarps) {
      const float s = expf(gb[i]) * Sb[i * L.Dv] + cuda::to_float(kb[i]) * vj;
      Sb[i * L.Dv] = s;
      acc = fmaf(cuda::to_float(qb[i]), s, acc);
    }
  }
  partial[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || !col) return;
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += partial[w][lane];
  o[b * L.o + h * L.Dv + j] = cuda::from_float<T>(static_cast<float>(L.scale) * sum);
}

}  // namespace

void gla_step_cuda(const Ctx& ctx, const GlaStepLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& g, const Tensor& state, const Tensor& o) {
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype, "gla_step (GPU): dtypes must agree");
  LINAC_CHECK(g.dtype == DType::F32 && state.dtype == DType::F32, "gla_step (GPU): g and the state must be f32");
  if (L.B * L.H == 0) return;
  const dim3 grid(static_cast<unsigned>(L.B * L.H), static_cast<unsigned>((L.Dv + 31) / 32));
  LINAC_GPU_DISPATCH(q.dtype, T, {
    cuda::launch_dependent(ctx, gla_step_kernel<T>, grid, dim3(kThreads), 0, L, q.data<T>(), k.data<T>(), v.data<T>(),
                           g.data<float>(), state.data<float>(), o.data<T>());
  });
}

}  // namespace linac
