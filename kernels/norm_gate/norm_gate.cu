// CUDA per-head norm + swish gate (math in norm_gate.h): one warp per (row, head). Heads of
// 128 * k values up to 512 (every GLA config) keep the head in registers: lane l holds values
// 128 c + 4 l .. 128 c + 4 l + 3 of each chunk c, loaded once with 8- or 16-byte accesses
// together with r, br (and dy) before the warp reductions, so a head costs one memory round
// trip. Other head dims stream: the lanes stride over the D values in groups of V = 4 (V = 1
// where a row or the head dim is not 4-aligned), re-reading x for each statistic. Either way the
// statistics are warp sums in a fixed order (deterministic).
#include "activation/sigmoid.cuh"
#include "common/cuda_common.cuh"
#include "norm_gate/norm_gate.h"

namespace linac {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxChunks = 4;  // head kernels: up to 4 chunks of 128 values

template <int kChunks, class T>
__global__ void __launch_bounds__(32 * kWarps)
    norm_gate_fwd_head_kernel(NormGateLayout L, const T* __restrict__ x, const T* __restrict__ r,
                              const float* __restrict__ br, T* __restrict__ y, float* __restrict__ mean,
                              float* __restrict__ rstd) {
  constexpr int kDim = 128 * kChunks;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  cuda::dependent_wait();
  cuda::dependent_release();
  const int lane = threadIdx.x & 31;
  const int64_t n = item / L.H, h = item % L.H;
  float4 xv[kChunks], pv[kChunks];
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t j = h * kDim + 128 * c + 4 * lane;
    xv[c] = cuda::load4(x + n * L.x + j);
    const float4 rv = cuda::load4(r + n * L.r + j), bv = cuda::load4(br + j);
    pv[c] = make_float4(rv.x + bv.x, rv.y + bv.y, rv.z + bv.z, rv.w + bv.w);
    s += xv[c].x + xv[c].y + xv[c].z + xv[c].w;
  }
  const float m = cuda::warp_sum(s) / static_cast<float>(kDim);
  float q = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float a = xv[c].x - m, b = xv[c].y - m, e = xv[c].z - m, f = xv[c].w - m;
    q += a * a + b * b + e * e + f * f;
  }
  const float rs = rsqrtf(cuda::warp_sum(q) / static_cast<float>(kDim) + static_cast<float>(L.eps));
  if (lane == 0) {
    mean[item] = m;
    rstd[item] = rs;
  }
  auto gated = [&](float xe, float p) { return (xe - m) * rs * p * cuda::sigmoid(p); };
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    cuda::store4(y + n * L.y + h * kDim + 128 * c + 4 * lane,
                 make_float4(gated(xv[c].x, pv[c].x), gated(xv[c].y, pv[c].y), gated(xv[c].z, pv[c].z),
                             gated(xv[c].w, pv[c].w)));
}

template <int kChunks, class T>
__global__ void __launch_bounds__(32 * kWarps)
    norm_gate_bwd_head_kernel(NormGateLayout L, const T* __restrict__ x, const T* __restrict__ r,
                              const float* __restrict__ br, const float* __restrict__ mean,
                              const float* __restrict__ rstd, const T* __restrict__ dy, T* __restrict__ dx,
                              T* __restrict__ dr) {
  constexpr int kDim = 128 * kChunks;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= L.N * L.H) return;
  const int lane = threadIdx.x & 31;
  const int64_t n = item / L.H, h = item % L.H;
  const float m = mean[item], rs = rstd[item];
  // u (normalised x) and du = dy * swish(p) per value; dr is written before the reductions.
  float u[kChunks][4], du[kChunks][4];
  float sdu = 0.f, sduu = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t j = h * kDim + 128 * c + 4 * lane;
    float xv[4], rv[4], bv[4], dv[4], ov[4];
    cuda::load_vals<4>(x + n * L.x + j, xv);
    cuda::load_vals<4>(r + n * L.r + j, rv);
    cuda::load_vals<4>(br + j, bv);
    cuda::load_vals<4>(dy + n * L.dy + j, dv);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = rv[e] + bv[e], sg = cuda::sigmoid(p);
      u[c][e] = (xv[e] - m) * rs;
      du[c][e] = dv[e] * p * sg;
      sdu += du[c][e];
      sduu += du[c][e] * u[c][e];
      ov[e] = dv[e] * u[c][e] * sg * (1.f + p * (1.f - sg));
    }
    cuda::store_vals<4>(dr + n * L.dr + j, ov);
  }
  const float mdu = cuda::warp_sum(sdu) / static_cast<float>(kDim),
              mduu = cuda::warp_sum(sduu) / static_cast<float>(kDim);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float ov[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) ov[e] = rs * (du[c][e] - mdu - u[c][e] * mduu);
    cuda::store_vals<4>(dx + n * L.dx + h * kDim + 128 * c + 4 * lane, ov);
  }
}

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

// The head kernels' chunk count, or 0 where they do not apply (they need the groups of four).
int head_chunks(const NormGateLayout& L, bool four) {
  return four && L.D % 128 == 0 && L.D <= 128 * kMaxChunks ? static_cast<int>(L.D / 128) : 0;
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
  auto st = cuda::stream_of(ctx);
  if (const int chunks = head_chunks(L, four)) {
    LINAC_GPU_DISPATCH(x.dtype, T, cuda::with_const<kMaxChunks>(chunks, [&](auto k) {
                         cuda::launch_dependent(ctx, norm_gate_fwd_head_kernel<decltype(k)::value, T>, dim3(grid),
                                                dim3(32 * kWarps), 0, L, x.data<T>(), r.data<T>(), br.data<float>(),
                                                y.data<T>(), mean.data<float>(), rstd.data<float>());
                       }));
    return;
  }
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = four ? norm_gate_fwd_kernel<4, T> : norm_gate_fwd_kernel<1, T>;
    kernel<<<grid, 32 * kWarps, 0, st>>>(L, x.data<T>(), r.data<T>(), br.data<float>(), y.data<T>(), mean.data<float>(),
                                         rstd.data<float>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void norm_gate_bwd_cuda(const Ctx& ctx, const NormGateLayout& L, const Tensor& x, const Tensor& r, const Tensor& br,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, const Tensor& dx, const Tensor& dr) {
  check_dtypes({&x, &r, &dy, &dx, &dr}, {&br, &mean, &rstd});
  if (L.N * L.H == 0) return;
  const unsigned grid = static_cast<unsigned>((L.N * L.H + kWarps - 1) / kWarps);
  const bool four = groups_of_four(L, {&x, &r, &br, &dy, &dx, &dr});
  auto st = cuda::stream_of(ctx);
  if (const int chunks = head_chunks(L, four)) {
    LINAC_GPU_DISPATCH(x.dtype, T, cuda::with_const<kMaxChunks>(chunks, [&](auto k) {
                         norm_gate_bwd_head_kernel<decltype(k)::value, T><<<grid, 32 * kWarps, 0, st>>>(
                             L, x.data<T>(), r.data<T>(), br.data<float>(), mean.data<float>(), rstd.data<float>(),
                             dy.data<T>(), dx.data<T>(), dr.data<T>());
                       }));
    LINAC_CUDA_LAUNCH_CHECK();
    return;
  }
  LINAC_GPU_DISPATCH(x.dtype, T, {
    auto kernel = four ? norm_gate_bwd_kernel<4, T> : norm_gate_bwd_kernel<1, T>;
    kernel<<<grid, 32 * kWarps, 0, st>>>(L, x.data<T>(), r.data<T>(), br.data<float>(), mean.data<float>(),
                                         rstd.data<float>(), dy.data<T>(), dx.data<T>(), dr.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
