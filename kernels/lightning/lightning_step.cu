// CUDA Lightning Attention decode step (recurrent form for one token; math in lightning.h):
//   S = exp(-s_h) S + k^T v,   o = q S          per (batch, head), state f32
// Grid (B*H, Dv/128): a thread owns one state column j and walks the Dk rows in order, so o[j]
// is a fixed-order f32 sum (deterministic). The step is memory bound: each state element is
// read and written once.
#include "common/cuda_common.cuh"
#include "lightning/lightning.h"

namespace linac {
namespace {

constexpr int kThreads = 128;

template <class T>
__global__ void __launch_bounds__(kThreads) lightning_step_kernel(LightningStepLayout L, const T* __restrict__ q,
                                                                  const T* __restrict__ k, const T* __restrict__ v,
                                                                  const float* __restrict__ decay,
                                                                  float* __restrict__ S, T* __restrict__ o) {
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j >= L.Dv) return;
  const T* qb = q + b * L.q + h * L.Dk;
  const T* kb = k + b * L.k + h * L.Dk;
  const float lam = expf(-decay[h]);
  float* Sb = S + bh * L.Dk * L.Dv + j;
  const float vj = cuda::to_float(v[b * L.v + h * L.Dv + j]);
  float acc = 0.f;
  for (int64_t i = 0; i < L.Dk; ++i) {
    const float s = lam * Sb[i * L.Dv] + cuda::to_float(kb[i]) * vj;
    Sb[i * L.Dv] = s;
    acc = fmaf(cuda::to_float(qb[i]), s, acc);
  }
  o[b * L.o + h * L.Dv + j] = cuda::from_float<T>(acc);
}

}  // namespace

void lightning_step_cuda(const Ctx& ctx, const LightningStepLayout& L, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& decay, const Tensor& state, const Tensor& o) {
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype,
              "lightning_step (GPU): dtypes must agree");
  LINAC_CHECK(decay.dtype == DType::F32 && state.dtype == DType::F32,
              "lightning_step (GPU): decay and the state must be f32");
  if (L.B * L.H == 0) return;
  const dim3 grid(static_cast<unsigned>(L.B * L.H), static_cast<unsigned>((L.Dv + kThreads - 1) / kThreads));
  LINAC_GPU_DISPATCH(q.dtype, T, {
    lightning_step_kernel<T><<<grid, kThreads, 0, cuda::stream_of(ctx)>>>(
        L, q.data<T>(), k.data<T>(), v.data<T>(), decay.data<float>(), state.data<float>(), o.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
