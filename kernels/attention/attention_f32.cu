// CUDA attention in f32 (math in attention.h): the `precision: fp32` debugging path, plain SIMT.
// A CTA of 8 warps owns 8 consecutive rows, one per warp (queries of one query head for the
// forward and dq, which read the keys/values of its head kv_head(h); keys of one key/value head for
// dk/dv, which sum over the query heads of its group, one head after the other). The other side
// streams through shared memory in tiles of 32 rows, one per lane:
// lane j computes the score of its row against tile row j, then the warp's accumulators
// (lane owns dims lane, lane + 32, ... below D) take the tile's weighted rows in a fixed order, so
// every result is deterministic. Same masks and block skipping as the bf16 kernels; no atomics.
// Documents (a debugging path: runtime tests): a row's range starts at its first query's document
// (forward, dq) or ends at its last key's (dk/dv), each score tests its own row's bound.
// Layout: q/o/dout/dq [B,T,H,D] and k/v/dk/dv [B,T,Hk,D] with free batch/token strides, lse/delta
// [B,H,T] f32.
#include "attention/attention_common.cuh"

namespace linac::attn {
namespace {

constexpr int kRows = 8;   // rows (warps) per CTA
constexpr int kTile = 32;  // streamed rows per tile, one per lane
constexpr int kThreads = 32 * kRows;
constexpr float kLn2 = 0.6931471805599453f;

// The union of the allowed key ranges of queries [t0, t1] of row b.
__device__ __forceinline__ int2 key_span(const Args& a, int b, int t0, int t1) {
  int lo = a.causal && a.window > 0 ? max(0, t0 - a.window + 1) : 0;
  if (a.doc_start) lo = max(lo, doc_start_of(a, b, t0));
  return make_int2(lo, a.causal ? t1 : a.T - 1);
}

// Copies rows [r0, r0 + kTile) of a [T, D] matrix (row stride ld) into dst (row pitch P), zeros past `hi`.
template <int D, int P>
__device__ __forceinline__ void load_rows(float (*dst)[P], const float* src, int64_t ld, int r0, int hi) {
  for (int i = threadIdx.x; i < kTile * D; i += kThreads) {
    const int j = i / D, d = i % D, r = r0 + j;
    dst[j][d] = r <= hi ? src[int64_t{r} * ld + d] : 0.f;
  }
}

// Accumulators per lane: dims lane + 32 i for i < kLaneDims<D> and lane + 32 i < D.
template <int D>
constexpr int kLaneDims = (D + 31) / 32;

template <int D>
__device__ __forceinline__ bool lane_owns(int lane, int i) {
  return D % 32 == 0 || lane + 32 * i < D;
}

template <int D>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float acc = 0.f;
#pragma unroll 16
  for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

template <int D>
__global__ void __launch_bounds__(kThreads) fwd_f32_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                           const float* __restrict__ v, float* __restrict__ o,
                                                           float* __restrict__ lse, const Args a) {
  __shared__ float sK[kTile][D + 1], sV[kTile][D + 1], sQ[kRows][D];
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, hk = kv_head(a, h);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = (cdiv(a.T, kRows) - 1 - static_cast<int>(blockIdx.y)) * kRows, t = q0 + warp;
  const bool active = t < a.T;
  const int2 span = key_span(a, b, q0, min(q0 + kRows - 1, a.T - 1));
  const int lo_t = a.doc_start ? doc_start_of(a, b, t) : 0;  // this row's first key
  if (active)
    for (int d = lane; d < D; d += 32) sQ[warp][d] = q[b * a.q.b + int64_t{t} * a.q.t + h * D + d] * a.scale_log2;

  float m = -INFINITY, l = 0.f, acc[kLaneDims<D>] = {};
  for (int s0 = span.x; s0 <= span.y; s0 += kTile) {
    __syncthreads();
    load_rows<D, D + 1>(sK, k + b * a.k.b + hk * D, a.k.t, s0, span.y);
    load_rows<D, D + 1>(sV, v + b * a.v.b + hk * D, a.v.t, s0, span.y);
    __syncthreads();
    if (!active) continue;
    const int s = s0 + lane;
    const float x = s <= span.y && s >= lo_t && allowed(a, t, s) ? dot_row<D>(sQ[warp], sK[lane]) : -INFINITY;
    const float mx = fmaxf(m, cuda::warp_max(x));
    const float base = mx == -INFINITY ? 0.f : mx;  // rows with nothing allowed yet keep P = 0
    const float p = exp2f(x - base), alpha = exp2f(m - base);
    l = l * alpha + cuda::warp_sum(p);
    m = mx;
#pragma unroll
    for (int i = 0; i < kLaneDims<D>; ++i) acc[i] *= alpha;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int i = 0; i < kLaneDims<D>; ++i)
        if (lane_owns<D>(lane, i)) acc[i] = fmaf(pj, sV[j][lane + 32 * i], acc[i]);
    }
  }
  if (!active) return;
  float* orow = o + b * a.o.b + int64_t{t} * a.o.t + h * D;
#pragma unroll
  for (int i = 0; i < kLaneDims<D>; ++i)
    if (lane_owns<D>(lane, i)) orow[lane + 32 * i] = acc[i] / l;
  if (lane == 0) lse[int64_t{bh} * a.T + t] = (m + log2f(l)) * kLn2;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_f32_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  const float* __restrict__ lse, const float* __restrict__ delta, const float* __restrict__ dout,
                  float* __restrict__ dq, const Args a) {
  __shared__ float sK[kTile][D + 1], sV[kTile][D + 1], sQ[kRows][D], sG[kRows][D];
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, hk = kv_head(a, h);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = (cdiv(a.T, kRows) - 1 - static_cast<int>(blockIdx.y)) * kRows, t = q0 + warp;
  const bool active = t < a.T;
  const int2 span = key_span(a, b, q0, min(q0 + kRows - 1, a.T - 1));
  const int lo_t = a.doc_start ? doc_start_of(a, b, t) : 0;  // this row's first key
  float lse2 = 0.f, dl = 0.f;
  if (active) {
    for (int d = lane; d < D; d += 32) {
      sQ[warp][d] = q[b * a.q.b + int64_t{t} * a.q.t + h * D + d] * a.scale_log2;
      sG[warp][d] = dout[b * a.dout.b + int64_t{t} * a.dout.t + h * D + d];
    }
    lse2 = lse[int64_t{bh} * a.T + t] * kLog2e;
    dl = delta[int64_t{bh} * a.T + t];
  }

  float acc[kLaneDims<D>] = {};
  for (int s0 = span.x; s0 <= span.y; s0 += kTile) {
    __syncthreads();
    load_rows<D, D + 1>(sK, k + b * a.k.b + hk * D, a.k.t, s0, span.y);
    load_rows<D, D + 1>(sV, v + b * a.v.b + hk * D, a.v.t, s0, span.y);
    __syncthreads();
    if (!active) continue;
    const int s = s0 + lane;
    float ds = 0.f;
    if (s <= span.y && s >= lo_t && allowed(a, t, s)) {
      const float p = exp2f(dot_row<D>(sQ[warp], sK[lane]) - lse2);
      ds = p * (dot_row<D>(sG[warp], sV[lane]) - dl);
    }
    for (int j = 0; j < kTile; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
      for (int i = 0; i < kLaneDims<D>; ++i)
        if (lane_owns<D>(lane, i)) acc[i] = fmaf(dsj, sK[j][lane + 32 * i], acc[i]);
    }
  }
  if (!active) return;
  float* row = dq + b * a.dq.b + int64_t{t} * a.dq.t + h * D;
#pragma unroll
  for (int i = 0; i < kLaneDims<D>; ++i)
    if (lane_owns<D>(lane, i)) row[lane + 32 * i] = acc[i] * a.scale;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_f32_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const float* __restrict__ lse, const float* __restrict__ delta, const float* __restrict__ dout,
                    float* __restrict__ dk, float* __restrict__ dv, const Args a) {
  __shared__ float sQ[kTile][D + 1], sG[kTile][D + 1], sK[kRows][D], sV[kRows][D], sL[kTile], sDl[kTile];
  const int bhk = blockIdx.x, b = bhk / a.Hk, hk = bhk % a.Hk, group = a.H / a.Hk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int k0 = static_cast<int>(blockIdx.y) * kRows, s = k0 + warp;
  const bool active = s < a.T;
  // The union of the query ranges that see keys [k0, k0 + kRows).
  const int lo = a.causal ? k0 : 0;
  int hi = a.causal && a.window > 0 ? min(a.T - 1, k0 + kRows - 2 + a.window) : a.T - 1;
  if (a.doc_end) hi = min(hi, doc_end_of(a, b, k0 + kRows - 1) - 1);
  const int hi_s = a.doc_end ? doc_end_of(a, b, s) : a.T;  // one past this key's last query
  if (active)
    for (int d = lane; d < D; d += 32) {
      sK[warp][d] = k[b * a.k.b + int64_t{s} * a.k.t + hk * D + d] * a.scale_log2;
      sV[warp][d] = v[b * a.v.b + int64_t{s} * a.v.t + hk * D + d];
    }

  float dk_acc[kLaneDims<D>] = {}, dv_acc[kLaneDims<D>] = {};
  for (int h = hk * group; h < (hk + 1) * group; ++h)
    for (int t0 = lo; t0 <= hi; t0 += kTile) {
      __syncthreads();
      load_rows<D, D + 1>(sQ, q + b * a.q.b + h * D, a.q.t, t0, hi);
      load_rows<D, D + 1>(sG, dout + b * a.dout.b + h * D, a.dout.t, t0, hi);
      if (threadIdx.x < kTile) {
        const int t = t0 + threadIdx.x;
        const int64_t row = (int64_t{b} * a.H + h) * a.T + t;
        sL[threadIdx.x] = t <= hi ? lse[row] * kLog2e : 0.f;
        sDl[threadIdx.x] = t <= hi ? delta[row] : 0.f;
      }
      __syncthreads();
      if (!active) continue;
      const int t = t0 + lane;
      float p = 0.f, ds = 0.f;
      if (t <= hi && t < hi_s && allowed(a, t, s)) {
        p = exp2f(dot_row<D>(sK[warp], sQ[lane]) - sL[lane]);
        ds = p * (dot_row<D>(sV[warp], sG[lane]) - sDl[lane]);
      }
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j), dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < kLaneDims<D>; ++i) {
          if (!lane_owns<D>(lane, i)) continue;
          dv_acc[i] = fmaf(pj, sG[j][lane + 32 * i], dv_acc[i]);
          dk_acc[i] = fmaf(dsj, sQ[j][lane + 32 * i], dk_acc[i]);
        }
      }
    }
  if (!active) return;
  float* krow = dk + b * a.dk.b + int64_t{s} * a.dk.t + hk * D;
  float* vrow = dv + b * a.dv.b + int64_t{s} * a.dv.t + hk * D;
#pragma unroll
  for (int i = 0; i < kLaneDims<D>; ++i) {
    if (!lane_owns<D>(lane, i)) continue;
    krow[lane + 32 * i] = dk_acc[i] * a.scale;
    vrow[lane + 32 * i] = a.accumulate_dv ? vrow[lane + 32 * i] + dv_acc[i] : dv_acc[i];
  }
}

template <int D>
void launch_fwd(const Ctx& ctx, const Args& a, int B, const float* q, const float* k, const float* v, float* o,
                float* lse) {
  const dim3 grid(static_cast<unsigned>(B * a.H), static_cast<unsigned>(cdiv(a.T, kRows)));
  fwd_f32_kernel<D><<<grid, kThreads, 0, cuda::stream_of(ctx)>>>(q, k, v, o, lse, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_bwd(const Ctx& ctx, const Args& a, int B, const float* q, const float* k, const float* v,
                const float* lse, const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  const unsigned row_blocks = static_cast<unsigned>(cdiv(a.T, kRows));
  const dim3 query_grid(static_cast<unsigned>(B * a.H), row_blocks);
  const dim3 key_grid(static_cast<unsigned>(B * a.Hk), row_blocks);
  dq_f32_kernel<D><<<query_grid, kThreads, 0, cuda::stream_of(ctx)>>>(q, k, v, lse, delta, dout, dq, a);
  LINAC_CUDA_LAUNCH_CHECK();
  dkdv_f32_kernel<D><<<key_grid, kThreads, 0, cuda::stream_of(ctx)>>>(q, k, v, lse, delta, dout, dk, dv, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

void fwd_f32(const Ctx& ctx, const Args& a, int B, int D, const float* q, const float* k, const float* v, float* o,
             float* lse) {
  with_head_dim(D, [&](auto d) { launch_fwd<decltype(d)::value>(ctx, a, B, q, k, v, o, lse); });
}

void bwd_f32(const Ctx& ctx, const Args& a, int B, int D, const float* q, const float* k, const float* v,
             const float* lse, const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  with_head_dim(D, [&](auto d) { launch_bwd<decltype(d)::value>(ctx, a, B, q, k, v, lse, delta, dout, dq, dk, dv); });
}

}  // namespace linac::attn
