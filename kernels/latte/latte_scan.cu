// CUDA Latte scans (math in latte.h; launchers declared in latte_common.cuh):
//   lse       lse_t = logaddexp(lse_{t-1}, b_t) chunk-parallel: each chunk's local logcumsumexp
//             (CTA per chunk, thread per latent), an exclusive carry over the N chunk totals
//             (thread per (sequence*head, latent)), and the final logaddexp(carry, local) applied by
//             the chunk-terms kernel; no thread walks T.
//   terms     U[n] = exp(B_n - lse_e)^T V_n, every factor <= 1 (CTA per chunk)
//   states    S[n] = exp(lse_{f-1} - lse_e) S[n-1] + U[n-1] forward, or the reverse walk of the
//             backward: elementwise over the L x width state, sequential over the N chunks, f32.
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

// Grid (N, B*H), kMaxL threads: thread l scans latent l over the chunk.
template <class T>
__global__ void __launch_bounds__(kMaxL) lse_local_kernel(Args a, const T* __restrict__ b, LatteLayout::Strides bs,
                                                         float* __restrict__ lse, float* __restrict__ total) {
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H, l = threadIdx.x;
  if (l >= a.L) return;
  const int f = n * kC, rows = min(kC, a.T - f);
  float run = -INFINITY;
  for (int r = 0; r < rows; ++r) {
    run = logaddexpf(run, cuda::to_float(b[bb * bs.b + static_cast<int64_t>(f + r) * bs.t + h * a.L + l]));
    lse[((static_cast<int64_t>(bb) * a.T + f + r) * a.H + h) * a.L + l] = run;
  }
  total[(static_cast<int64_t>(bh) * a.N + n) * a.L + l] = run;
}

// Grid B*H, kMaxL threads: the chunk totals become exclusive carries, in place.
__global__ void __launch_bounds__(kMaxL) lse_carry_kernel(Args a, float* __restrict__ carry) {
  const int bh = blockIdx.x, l = threadIdx.x;
  if (l >= a.L) return;
  float run = -INFINITY;
  for (int n = 0; n < a.N; ++n) {
    float* c = carry + (static_cast<int64_t>(bh) * a.N + n) * a.L + l;
    const float total = *c;
    *c = run;
    run = logaddexpf(run, total);
  }
}

constexpr int kTermThreads = 256;

// Grid (N, B*H). Shared: lse rows [C][L], w = exp(b - lse_e) [C][L], V [C][Dv].
template <class T>
__global__ void __launch_bounds__(kTermThreads) chunk_terms_kernel(Args a, const T* __restrict__ b,
                                                                   LatteLayout::Strides bs, const T* __restrict__ v,
                                                                   LatteLayout::Strides vs, float* __restrict__ lse,
                                                                   const float* __restrict__ carry,
                                                                   float* __restrict__ U) {
  extern __shared__ float sm[];
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  float* lam = sm;
  float* w = lam + kC * a.L;
  float* V = w + kC * a.L;
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
    const int r = i / a.L, l = i % a.L;
    float* p = lse + ((static_cast<int64_t>(bb) * a.T + f + r) * a.H + h) * a.L + l;
    if (carry) *p = logaddexpf(carry[(static_cast<int64_t>(bh) * a.N + n) * a.L + l], *p);
    lam[i] = *p;
  }
  load_rows(w, b, bs, bb, h, f, rows, a.L);
  load_rows(V, v, vs, bb, h, f, rows, a.Dv);
  __syncthreads();
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) w[i] = expf(w[i] - lam[(rows - 1) * a.L + i % a.L]);
  __syncthreads();
  float* Un = U + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for (int i = threadIdx.x; i < a.L * a.Dv; i += blockDim.x) {
    const int l = i / a.Dv, j = i % a.Dv;
    float acc = 0.f;
    for (int s = 0; s < rows; ++s) acc = fmaf(w[s * a.L + l], V[s * a.Dv + j], acc);
    Un[l * a.Wd + j] = acc;
  }
}

constexpr int kScanThreads = 128;

// Grid (ceil(L * width / 128), B*H): a thread owns one state element (l, j) and walks the chunks.
__global__ void __launch_bounds__(kScanThreads) state_scan_kernel(Args a, bool reverse, int width,
                                                                  const float* __restrict__ lse,
                                                                  const float* __restrict__ U, float* __restrict__ S,
                                                                  float* __restrict__ mu_final) {
  const int bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int i = blockIdx.x * kScanThreads + threadIdx.x;
  if (i >= a.L * width) return;
  const int l = i / width, j = i % width;
  auto lam = [&](int t) { return lse[((static_cast<int64_t>(bb) * a.T + t) * a.H + h) * a.L + l]; };
  // exp(lse_{f-1} - lse_e) for chunk n >= 1: the decay across the chunk, <= 1.
  auto keep = [&](int n) { return expf(lam(n * kC - 1) - lam(min(a.T, (n + 1) * kC) - 1)); };
  const int64_t base = static_cast<int64_t>(bh) * a.N * a.L * a.Wd + l * a.Wd + j;
  const int64_t step = static_cast<int64_t>(a.L) * a.Wd;
  float x = 0.f;
  if (!reverse) {
    for (int n = 0; n < a.N; ++n) {
      S[base + n * step] = x;
      x = (n == 0 ? 0.f : keep(n) * x) + U[base + n * step];
    }
    if (mu_final) mu_final[(static_cast<int64_t>(bh) * a.L + l) * a.Dv + j] = x;
  } else {
    for (int n = a.N - 1; n >= 0; --n) {
      S[base + n * step] = x;
      if (n > 0) x = keep(n) * x + U[base + n * step];
    }
  }
}

}  // namespace

template <class T>
void launch_lse_scan(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, float* lse,
                     float* carry) {
  lse_local_kernel<T><<<dim3(a.N, B * a.H), kMaxL, 0, cuda::stream_of(ctx)>>>(a, b, bs, lse, carry);
  LINAC_CUDA_LAUNCH_CHECK();
  lse_carry_kernel<<<B * a.H, kMaxL, 0, cuda::stream_of(ctx)>>>(a, carry);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_chunk_terms(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, const T* v,
                        LatteLayout::Strides vs, float* lse, const float* carry, float* U) {
  const size_t smem = sizeof(float) * (2 * kC * a.L + kC * a.Dv);
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(chunk_terms_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  chunk_terms_kernel<T><<<dim3(a.N, B * a.H), kTermThreads, smem, cuda::stream_of(ctx)>>>(a, b, bs, v, vs, lse, carry,
                                                                                          U);
  LINAC_CUDA_LAUNCH_CHECK();
}

void launch_state_scan(const Ctx& ctx, const Args& a, int B, bool reverse, int width, const float* lse,
                       const float* U, float* S, float* mu_final) {
  const dim3 grid((a.L * width + kScanThreads - 1) / kScanThreads, B * a.H);
  state_scan_kernel<<<grid, kScanThreads, 0, cuda::stream_of(ctx)>>>(a, reverse, width, lse, U, S, mu_final);
  LINAC_CUDA_LAUNCH_CHECK();
}

#define LINAC_LATTE_SCAN_INSTANTIATE(T)                                                                              \
  template void launch_lse_scan<T>(const Ctx&, const Args&, int, const T*, LatteLayout::Strides, float*, float*);  \
  template void launch_chunk_terms<T>(const Ctx&, const Args&, int, const T*, LatteLayout::Strides, const T*,      \
                                      LatteLayout::Strides, float*, const float*, float*);
LINAC_LATTE_SCAN_INSTANTIATE(float)
LINAC_LATTE_SCAN_INSTANTIATE(__nv_bfloat16)
#undef LINAC_LATTE_SCAN_INSTANTIATE

}  // namespace latte_cuda
}  // namespace linac
