// CUDA Latte decode step (recurrent form for one token, math in latte.h) and the state reset.
// Per (batch, head): lse' = logaddexp(lse, b_t), omega = exp(b_t - lse'), keep = exp(lse - lse'),
// mu = keep mu + omega v_t, y = pi_0 local + sum_l pi_l mu_l; state f32. One CTA per (batch, head):
// thread l < L updates latent l's lse, thread 0 the softmax, then a thread per value column walks
// the latents in order (a fixed-order f32 sum).
#include "latte/latte_common.cuh"

namespace linac {
namespace {

constexpr int kThreads = 128;

template <class T>
__global__ void __launch_bounds__(kThreads) latte_step_kernel(LatteStepLayout L, const T* __restrict__ a,
                                                             const T* __restrict__ b, const T* __restrict__ v,
                                                             const T* __restrict__ local, float* __restrict__ lse,
                                                             float* __restrict__ mu, T* __restrict__ y) {
  __shared__ float pi[latte_cuda::kMaxL + 1], omega[latte_cuda::kMaxL], keep[latte_cuda::kMaxL];
  const int64_t bh = blockIdx.x, bb = bh / L.H, h = bh % L.H;
  const int La = static_cast<int>(L.local ? L.L + 1 : L.L), off = L.local ? 1 : 0;
  if (threadIdx.x < L.L) {
    const int l = threadIdx.x;
    const float old = lse[bh * L.L + l], bl = cuda::to_float(b[bb * L.b + h * L.L + l]);
    const float nw = latte_cuda::logaddexpf(old, bl);
    omega[l] = expf(bl - nw);
    keep[l] = expf(old - nw);
    lse[bh * L.L + l] = nw;
  }
  if (threadIdx.x == 0) {
    const T* ar = a + bb * L.a + h * La;
    float m = -INFINITY;
    for (int j = 0; j < La; ++j) m = fmaxf(m, cuda::to_float(ar[j]));
    float sum = 0.f;
    for (int j = 0; j < La; ++j) sum += pi[j] = expf(cuda::to_float(ar[j]) - m);
    for (int j = 0; j < La; ++j) pi[j] /= sum;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < L.Dv; j += blockDim.x) {
    const float vj = cuda::to_float(v[bb * L.v + h * L.Dv + j]);
    float acc = off ? pi[0] * cuda::to_float(local[bb * L.local_s + h * L.Dv + j]) : 0.f;
    for (int l = 0; l < L.L; ++l) {
      float* m = mu + (bh * L.L + l) * L.Dv + j;
      const float x = keep[l] * *m + omega[l] * vj;
      *m = x;
      acc = fmaf(pi[off + l], x, acc);
    }
    y[bb * L.y + h * L.Dv + j] = cuda::from_float<T>(acc);
  }
}

__global__ void latte_reset_kernel(int64_t n_lse, int64_t n_mu, float* __restrict__ lse, float* __restrict__ mu) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_lse) lse[i] = -INFINITY;
  if (i < n_mu) mu[i] = 0.f;
}

}  // namespace

void latte_step_cuda(const Ctx& ctx, const LatteStepLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                     const Tensor& local, const Tensor& lse_state, const Tensor& mu_state, const Tensor& y) {
  for (const Tensor* t : {&b, &v, &local, &y})
    LINAC_CHECK(!t->defined() || t->dtype == a.dtype, "latte_step (GPU): activation dtypes must agree");
  LINAC_CHECK(L.L <= latte_cuda::kMaxL, "latte_step (GPU): at most 64 latents per head");
  if (L.B * L.H == 0) return;
  LINAC_GPU_DISPATCH(a.dtype, T, {
    latte_step_kernel<T><<<static_cast<unsigned>(L.B * L.H), kThreads, 0, cuda::stream_of(ctx)>>>(
        L, a.data<T>(), b.data<T>(), v.data<T>(), L.local ? local.data<T>() : nullptr, lse_state.data<float>(),
        mu_state.data<float>(), y.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void latte_state_reset_cuda(const Ctx& ctx, const Tensor& lse_state, const Tensor& mu_state) {
  const int64_t n = std::max(lse_state.numel(), mu_state.numel());
  if (n == 0) return;
  latte_reset_kernel<<<cuda::grid_1d(n, 256), 256, 0, cuda::stream_of(ctx)>>>(
      lse_state.numel(), mu_state.numel(), lse_state.data<float>(), mu_state.data<float>());
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
