// CUDA per-head norm + swish gate (math in norm_gate.h): one warp per (row, head); the lanes
// stride over the head's D values in groups of V = 4 consecutive ones (8- or 16-byte accesses;
// V = 1 where a row or the head dim is not 4-aligned), the statistics are warp sums in a fixed
// order (deterministic).
#include "activation/sigmoid.cuh"
#include "common/cuda_common.cuh"
#include "norm_gate/norm_gate.h"

namespace linac {
namespace {

constexpr int kWarps = 8;

template <int V, class T>
__global__ void __launch_bounds__(32 * kWarps) norm_gate_fwd_kernel(NormGateLayout L, const T* __restrict__ x,
                                                                     const T* __restrict__ r, const float* __restrict__ br,
                                                                     T* __restrict__ y, float* __restrict__ mean,
                                                                     float* __restrict__ rstd) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  const int lane = threadIdx.x & 31, D = static_cast<int>(L.D);
  const int64_t n = item / L.H, h = item % L.H;
  const T* const xr = x + n * L.x + h * D;
  const T* const rr = r + n * L.r + h * D;
  const float* const bh = br + h * D;
  T* const yr = y + n * L.y + h * D;
  float s = 0.f, xv[V];
  for (int j = V * lane; j < D; j += 32 * V) {
    cuda::load_vals<V>(xr + j, xv);
#pragma unroll
    for (int e = 0; e < V; ++e) s += xv[e];
  }
  const float m = cuda::warp_sum(s) / static_cast<float>(D);
  float q = 0.f;
  for (int j = V * lane; j < D; j += 32 * V) {
    cuda::load_vals<V>(xr + j, xv);
#pragma unroll
    for (int e = 0; e < V; ++e) q += (xv[e] - m) * (xv[e] - m);
  }
  const float rs = rsqrtf(cuda::warp_sum(q) / static_cast<float>(D) + static_cast<float>(L.eps));
  if (lane == 0) {
    mean[item] = m;
    rstd[item] = rs;
  }
  for (int j = V * lane; j < D; j += 32 * V) {
    float rv[V], bv[V], yv[V];
    cuda::load_vals<V>(xr + j, xv);
    cuda::load_vals<V>(rr + j, rv);
    cuda::load_vals<V>(bh + j, bv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float p = rv[e] + bv[e];
      yv[e] = (xv[e] - m) * rs * p * cuda::sigmoid(p);
    }
    cuda::store_vals<V>(yr + j, yv);
  }
}

template <int V, class T>
__global__ void __launch_bounds__(32 * kWarps)
    norm_gate_bwd_kernel(NormGateLayout L, const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ br,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         T* __restrict__ dx, T* __restrict__ dr) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  const int lane = threadIdx.x & 31, D = static_cast<int>(L.D);
  const int64_t n = item / L.H, h = item % L.H;
  const T* const xr = x + n * L.x + h * D;
  const T* const rr = r + n * L.r + h * D;
  const T* const dyr = dy + n * L.dy + h * D;
  const float* const bh = br + h * D;
  const float m = mean[item], rs = rstd[item];
  float sdu = 0.f, sduu = 0.f, xv[V], rv[V], bv[V], dv[V], ov[V];
  for (int j = V * lane; j < D; j += 32 * V) {
    cuda::load_vals<V>(xr + j, xv);
    cuda::load_vals<V>(rr + j, rv);
    cuda::load_vals<V>(bh + j, bv);
    cuda::load_vals<V>(dyr + j, dv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float p = rv[e] + bv[e], sg = cuda::sigmoid(p), u = (xv[e] - m) * rs, du = dv[e] * p * sg;
      sdu += du;
      sduu += du * u;
      ov[e] = dv[e] * u * sg * (1.f + p * (1.f - sg));
    }
    cuda::store_vals<V>(dr + n * L.dr + h * D + j, ov);
  }
  const float mdu = cuda::warp_sum(sdu) / static_cast<float>(D), mduu = cuda::warp_sum(sduu) / static_cast<float>(D);
  for (int j = V * lane; j < D; j += 32 * V) {
    cuda::load_vals<V>(xr + j, xv);
    cuda::load_vals<V>(rr + j, rv);
    cuda::load_vals<V>(bh + j, bv);
    cuda::load_vals<V>(dyr + j, dv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float p = rv[e] + bv[e], u = (xv[e] - m) * rs;
      ov[e] = rs * (dv[e] * p * cuda::sigmoid(p) - mdu - u * mduu);
    }
    cuda::store_vals<V>(dx + n * L.dx + h * D + j, ov);
  }
}

// Whether the groups of four may be used: the head dim, every row stride and every pointer
// 4-aligned.
bool groups_of_four(const NormGateLayout& L, std::initializer_list<const Tensor*> ts) {
  bool ok = L.D % 4 == 0 && L.x % 4 == 0 && L.r % 4 == 0 && L.y % 4 == 0 && L.dy % 4 == 0 && L.dx % 4 == 0 &&
            L.dr % 4 == 0;
  for (const Tensor* t : ts) ok = ok && cuda::vec4_aligned(*t);
  return ok;
}

void check_dtypes(std::initializer_list<const Tensor*> act, std::initializer_list<const Tensor*> f32) {
  for (const Tensor* t : act)
    LINAC_CHECK(t->dtype == (*act.begin())->dtype, "norm_gate (GPU): activations must share a dtype");
  for (const Tensor* t : f32) LINAC_CHECK(t->dtype == DType::F32, "norm_gate (GPU): br, mean, rstd must be f32");
}

}  // namespace

void norm_gate_fwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_dtypes({&x, &r, &y}, {&br, &mean, &rstd});
  if (L.N * L.H == 0) return;
  const unsigned grid = static_cast<unsigned>((L.N * L.H + kWarps - 1) / kWarps);
  const bool four = groups_of_four(L, {&x, &r, &br, &y});
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = four ? norm_gate_fwd_kernel<4, T> : norm_gate_fwd_kernel<1, T>;
    kernel<<<grid, 32 * kWarps, 0, cuda::stream_of(ctx)>>>(L, x.data<T>(), r.data<T>(), br.data<float>(), y.data<T>(),
                                                           mean.data<float>(), rstd.data<float>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void norm_gate_bwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr) {
  check_dtypes({&x, &r, &dy, &dx, &dr}, {&br, &mean, &rstd});
  if (L.N * L.H == 0) return;
  const unsigned grid = static_cast<unsigned>((L.N * L.H + kWarps - 1) / kWarps);
  const bool four = groups_of_four(L, {&x, &r, &br, &dy, &dx, &dr});
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = four ? norm_gate_bwd_kernel<4, T> : norm_gate_bwd_kernel<1, T>;
    kernel<<<grid, 32 * kWarps, 0, cuda::stream_of(ctx)>>>(L, x.data<T>(), r.data<T>(), br.data<float>(),
                                                           mean.data<float>(), rstd.data<float>(), dy.data<T>(),
                                                           dx.data<T>(), dr.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
