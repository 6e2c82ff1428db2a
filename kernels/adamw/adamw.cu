// CUDA fused AdamW (math in adamw.h): one pass reading p, g, m, v and writing p, m, v (and the
// bf16 compute copy), a thread per four elements with float4 accesses while every pointer is
// aligned, the scalar tail (everything where they are not) on the grid's first threads. A grid
// over the whole tensor moves more bytes per second than a fixed grid striding through it: 2.98
// against 2.84 TB/s for 1.36B parameters on an H100 (docs/performance.md, "Memory-bound passes").
#include <algorithm>
#include <cmath>

#include "adamw/adamw.h"
#include "common/cuda_common.cuh"

namespace linac {
namespace {

constexpr int kThreads = 256;

struct Coeffs {
  float beta1, beta2, eps, grad_scale;
  float decay;         // lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
};

// Updates m and v in place and returns the new parameter. sqrt(v^) = sqrt(v) / sqrt(1 - beta2^t).
__device__ __forceinline__ float adamw_update(float p, float g, float& m, float& v, const Coeffs& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + (1.f - c.beta1) * g;
  v = c.beta2 * v + (1.f - c.beta2) * g * g;
  return p - c.decay * p - c.step_size * m / (sqrtf(v) * c.inv_sqrt_bc2 + c.eps);
}

template <bool kCopy>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, __nv_bfloat16* __restrict__ copy, int64_t n, int64_t n4, Coeffs c) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n4) {
    const int64_t i = 4 * t;
    float4 pv = cuda::load4(p + i), mv = cuda::load4(m + i), vv = cuda::load4(v + i);
    const float4 gv = cuda::load4(g + i);
    pv.x = adamw_update(pv.x, gv.x, mv.x, vv.x, c);
    pv.y = adamw_update(pv.y, gv.y, mv.y, vv.y, c);
    pv.z = adamw_update(pv.z, gv.z, mv.z, vv.z, c);
    pv.w = adamw_update(pv.w, gv.w, mv.w, vv.w, c);
    cuda::store4(p + i, pv);
    cuda::store4(m + i, mv);
    cuda::store4(v + i, vv);
    if constexpr (kCopy) cuda::store4(copy + i, pv);
  }
  const int64_t i = 4 * n4 + t;
  if (i < n) {
    float mi = m[i], vi = v[i];
    const float pi = adamw_update(p[i], g[i], mi, vi, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kCopy) copy[i] = __float2bfloat16_rn(pi);
  }
}

}  // namespace

void adamw_step_cuda(const Ctx& ctx, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& compute_copy, const AdamWArgs& a) {
  LINAC_CHECK(param.dtype == DType::F32 && grad.dtype == DType::F32 && m.dtype == DType::F32 &&
                  v.dtype == DType::F32,
              "adamw (GPU): param, grad, m, v must be f32");
  const bool with_copy = compute_copy.defined();
  LINAC_CHECK(!with_copy || compute_copy.dtype == DType::BF16, "adamw (GPU): compute_copy must be bf16");
  const int64_t n = param.numel();
  if (n == 0) return;
  const double t = static_cast<double>(a.step);
  const double bc1 = 1 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1 - std::pow(static_cast<double>(a.beta2), t);
  const Coeffs c{a.beta1,
                 a.beta2,
                 a.eps,
                 a.grad_scale,
                 static_cast<float>(static_cast<double>(a.lr) * a.weight_decay),
                 static_cast<float>(a.lr / bc1),
                 static_cast<float>(1 / std::sqrt(bc2))};
  const bool aligned = cuda::vec4_aligned(param) && cuda::vec4_aligned(grad) && cuda::vec4_aligned(m) &&
                       cuda::vec4_aligned(v) && (!with_copy || cuda::vec4_aligned(compute_copy));
  const int64_t n4 = aligned ? n / 4 : 0;
  const unsigned blocks = cuda::grid_1d(std::max(n4, n - 4 * n4), kThreads);
  auto st = cuda::stream_of(ctx);
  if (with_copy)
    adamw_kernel<true><<<blocks, kThreads, 0, st>>>(param.data<float>(), grad.data<float>(), m.data<float>(),
                                                    v.data<float>(), compute_copy.data<__nv_bfloat16>(), n, n4, c);
  else
    adamw_kernel<false><<<blocks, kThreads, 0, st>>>(param.data<float>(), grad.data<float>(), m.data<float>(),
                                                     v.data<float>(), nullptr, n, n4, c);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
