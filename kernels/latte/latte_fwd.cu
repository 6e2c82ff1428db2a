// CUDA Latte forward (math in latte.h), per group of sequences that fits ctx.workspace:
//   lse scan (chunk-local, carries) -> chunk terms (final lse, U) -> state scan (S, mu_final) ->
//   output: per chunk, y_t = pi_0 local_t + sum_l pi_{t,l} dec_{t,l} mu_prev_l + sum_{s<=t} A_{t,s} v_s,
//   A_{t,s} = sum_l pi_{t,l} exp(b_{s,l} - lse_{t,l}), dec_{t,l} = exp(lse_{f-1,l} - lse_{t,l}).
// A is formed with exact exponents (every one <= 0), so no logit range overflows it.
// Layout of the output kernel's shared memory (f32): lse [C][L], b then pi*dec [C][L],
// pi [C][La], A [C][C], V [C][Dv], mu_prev [L][Dv].
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

constexpr int kThreads = 256;

size_t output_smem(const Args& a) {
  return sizeof(float) * (2 * kC * a.L + kC * a.La + kC * kC + kC * a.Dv + a.L * a.Dv);
}

template <class T>
__global__ void __launch_bounds__(kThreads) output_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as,
                                                         const T* __restrict__ b, LatteLayout::Strides bs,
                                                         const T* __restrict__ v, LatteLayout::Strides vs,
                                                         const T* __restrict__ local, LatteLayout::Strides ls,
                                                         const float* __restrict__ lse, const float* __restrict__ S,
                                                         T* __restrict__ y, LatteLayout::Strides ys) {
  extern __shared__ float sm[];
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  float* lam = sm;
  float* bq = lam + kC * a.L;
  float* pi = bq + kC * a.L;
  float* A = pi + kC * a.La;
  float* V = A + kC * kC;
  float* mu = V + kC * a.Dv;
  load_lse(lam, lse, a, bb, h, f, rows);
  load_rows(bq, b, bs, bb, h, f, rows, a.L);
  load_rows(pi, av, as, bb, h, f, rows, a.La);
  load_rows(V, v, vs, bb, h, f, rows, a.Dv);
  const float* Sn = S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for (int i = threadIdx.x; i < a.L * a.Dv; i += blockDim.x) mu[i] = Sn[(i / a.Dv) * a.Wd + i % a.Dv];
  __syncthreads();
  softmax_rows(pi, rows, a.La);
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kC; i += blockDim.x) {
    const int t = i / kC, s = i % kC;
    float acc = 0.f;
    if (s <= t)
      for (int l = 0; l < a.L; ++l) acc = fmaf(pi[t * a.La + a.off + l], expf(bq[s * a.L + l] - lam[t * a.L + l]), acc);
    A[i] = acc;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
    const int t = i / a.L, l = i % a.L;
    const float dec = n == 0 ? 0.f : expf(lse[((static_cast<int64_t>(bb) * a.T + f - 1) * a.H + h) * a.L + l] - lam[i]);
    bq[i] = pi[t * a.La + a.off + l] * dec;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * a.Dv; i += blockDim.x) {
    const int t = i / a.Dv, j = i % a.Dv;
    float acc = 0.f;
    if (a.off)
      acc = pi[t * a.La] *
            cuda::to_float(local[bb * ls.b + static_cast<int64_t>(f + t) * ls.t + static_cast<int64_t>(h) * a.Dv + j]);
    for (int l = 0; l < a.L; ++l) acc = fmaf(bq[t * a.L + l], mu[l * a.Dv + j], acc);
    for (int s = 0; s <= t; ++s) acc = fmaf(A[t * kC + s], V[s * a.Dv + j], acc);
    y[bb * ys.b + static_cast<int64_t>(f + t) * ys.t + static_cast<int64_t>(h) * a.Dv + j] = cuda::from_float<T>(acc);
  }
}

}  // namespace
}  // namespace latte_cuda

void latte_fwd_cuda(const Ctx& ctx, const LatteLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                    const Tensor& local, const Tensor& y, const Tensor& lse, const Tensor& mu_final) {
  using namespace latte_cuda;
  for (const Tensor* t : {&b, &v, &local, &y})
    LINAC_CHECK(!t->defined() || t->dtype == a.dtype, "latte (GPU): activation dtypes must agree");
  if (L.B * L.T * L.H == 0) return;
  const Args ar = make_args(L);
  const int per = group_size(ctx, L);
  const int64_t lse_seq = L.T * L.H * L.L, mu_seq = L.H * L.L * L.Dv;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Workspace w = carve(ctx, ar, B);
    float* lsep = lse.data<float>() + b0 * lse_seq;
    float* mufp = mu_final.defined() ? mu_final.data<float>() + b0 * mu_seq : nullptr;
    LINAC_GPU_DISPATCH(a.dtype, T, {
      const T* ap = at_batch(a.data<T>(), b0, L.a.b);
      const T* bp = at_batch(b.data<T>(), b0, L.b.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      const T* lp = L.local ? at_batch(local.data<T>(), b0, L.local_s.b) : nullptr;
      launch_lse_scan<T>(ctx, ar, B, bp, L.b, lsep, w.carry);
      launch_chunk_terms<T>(ctx, ar, B, bp, L.b, vp, L.v, lsep, w.carry, w.U);
      launch_state_scan(ctx, ar, B, false, ar.Dv, lsep, w.U, w.S, mufp);
      const size_t smem = output_smem(ar);
      LINAC_CUDA_CHECK(cudaFuncSetAttribute(output_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
      output_kernel<T><<<dim3(ar.N, B * ar.H), kThreads, smem, cuda::stream_of(ctx)>>>(
          ar, ap, L.a, bp, L.b, vp, L.v, lp, L.local_s, lsep, w.S, at_batch(y.data<T>(), b0, L.y.b), L.y);
      LINAC_CUDA_LAUNCH_CHECK();
    });
  }
}

}  // namespace linac
