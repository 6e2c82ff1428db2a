// CUDA low-rank forget gate (math in loggate_lowrank.h). A CTA of 256 threads takes up to 64
// rows per thread's pass (at most kMaxRows), whose rows of u (R bf16 each) it first copies into
// shared memory; thread t holds columns 4c .. 4c + 3 (c = t % (D / 4)) of W in registers (4 R
// floats) and walks the CTA's rows t / (D / 4), + 256 / (D / 4), ..., reading each row of u from
// shared memory (the same for every thread of the row: a broadcast) and recomputing its four z
// values in order r = 0..R-1. Read from global memory row by row, u's latency held the kernels at
// ~40% of the SM's issue rate. Rows per CTA scale with D so that the grid keeps two CTAs on every
// SM: at D = 1024, 128 rows per CTA left one CTA (8 warps) per SM at 16,384 rows, too few loads in
// flight (kernels/loggate/NOTES.md).
// The backward also sums dz over its rows per column; the CTA's row groups are added through
// shared memory in a fixed order into one partial per CTA and column (ctx.workspace), and a
// second kernel adds the partials in a fixed order into db.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "common/cuda_common.cuh"
#include "loggate/loggate_lowrank.h"
#include "loggate/loggate_math.h"

namespace linac {
namespace {

constexpr int kThreads = 256;                // loggate_lowrank_gpu_ok's D / 4 limit
constexpr int kPasses = 64, kMaxRows = 128;  // a thread's rows per CTA; the CTA's, at most

using loggate::logsigmoid;
using loggate::sigmoid_neg;

// This thread's place: column group c of a row, the first of its rows in the CTA and the stride.
struct Slot {
  int col, row_in_cta, row_step;
  bool active;
};
__device__ __forceinline__ Slot slot_of(int d) {
  const int groups = d / 4, per_pass = kThreads / groups;
  return {static_cast<int>(threadIdx.x) % groups, static_cast<int>(threadIdx.x) / groups, per_pass,
          static_cast<int>(threadIdx.x) < per_pass * groups};
}

// R bf16 values at p (16-byte aligned) as floats.
template <int R>
__device__ __forceinline__ void load_row(const __nv_bfloat16* p, float (&v)[R]) {
#pragma unroll
  for (int k = 0; k < R; k += 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p + k);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      v[k + 2 * i] = f.x;
      v[k + 2 * i + 1] = f.y;
    }
  }
}

// The CTA's rows [row0, row0 + rows) of u into shared memory su [rows, R], 16 bytes a thread
// (rows past n stay unwritten: no thread reads them); then the CTA's barrier.
template <int R>
__device__ __forceinline__ void stage_u(const __nv_bfloat16* u, int64_t ldu, int64_t row0, int64_t n, int rows,
                                        __nv_bfloat16* su) {
  constexpr int kPieces = R / 8;
  for (int p = threadIdx.x; p < rows * kPieces; p += kThreads) {
    const int r = p / kPieces, c = p % kPieces;
    if (row0 + r < n)
      *reinterpret_cast<uint4*>(su + r * R + 8 * c) = *reinterpret_cast<const uint4*>(u + (row0 + r) * ldu + 8 * c);
  }
  __syncthreads();
}

// z + b for the thread's four columns of one row of u.
template <int R>
__device__ __forceinline__ void gate_inputs(const __nv_bfloat16* u_row, const float (&w)[4][R], const float4 b,
                                            float (&x)[4]) {
  float u[R];
  load_row<R>(u_row, u);
  const float bs[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float z = 0.f;
#pragma unroll
    for (int k = 0; k < R; ++k) z = fmaf(u[k], w[e][k], z);
    x[e] = z + bs[e];
  }
}

template <int R>
__device__ __forceinline__ void load_weights(const __nv_bfloat16* w, int j, float (&wr)[4][R]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) load_row<R>(w + static_cast<int64_t>(j + e) * R, wr[e]);
}

template <int R>
__global__ void __launch_bounds__(kThreads)
    loggate_lowrank_fwd_kernel(const __nv_bfloat16* __restrict__ u, int64_t ldu, const __nv_bfloat16* __restrict__ w,
                               const float* __restrict__ b, float* __restrict__ g, int64_t ldg, int64_t n, int d,
                               int rows_per_cta, float inv_tau, float clamp, bool clamped) {
  __shared__ __align__(16) __nv_bfloat16 su[kMaxRows * R];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_cta;
  cuda::dependent_wait();
  cuda::dependent_release();
  stage_u<R>(u, ldu, row0, n, rows_per_cta, su);
  const Slot s = slot_of(d);
  if (!s.active) return;
  const int j = 4 * s.col;
  float wr[4][R];
  load_weights<R>(w, j, wr);
  const float4 bj = cuda::load4(b + j);
  const int rows = static_cast<int>(n - row0 < rows_per_cta ? n - row0 : rows_per_cta);
  for (int r = s.row_in_cta; r < rows; r += s.row_step) {
    float x[4], v[4];
    gate_inputs<R>(su + r * R, wr, bj, x);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = logsigmoid(x[e]) * inv_tau;
      if (clamped) v[e] = fmaxf(v[e], clamp);
    }
    cuda::store4(g + (row0 + r) * ldg + j, make_float4(v[0], v[1], v[2], v[3]));
  }
}

template <int R>
__global__ void __launch_bounds__(kThreads)
    loggate_lowrank_bwd_kernel(const __nv_bfloat16* __restrict__ u, int64_t ldu, const __nv_bfloat16* __restrict__ w,
                               const float* __restrict__ b, const float* __restrict__ dg, int64_t lddg,
                               __nv_bfloat16* __restrict__ dz, int64_t lddz, float* __restrict__ partial, int64_t n,
                               int d, int rows_per_cta, float inv_tau, float clamp, bool clamped) {
  __shared__ __align__(16) __nv_bfloat16 su[kMaxRows * R];
  __shared__ float4 sums[kThreads];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_cta;
  stage_u<R>(u, ldu, row0, n, rows_per_cta, su);
  const Slot s = slot_of(d);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (s.active) {
    const int j = 4 * s.col;
    float wr[4][R];
    load_weights<R>(w, j, wr);
    const float4 bj = cuda::load4(b + j);
    const int rows = static_cast<int>(n - row0 < rows_per_cta ? n - row0 : rows_per_cta);
    // dg of the thread's next row is loaded before the current one is worked on.
    float4 dv = s.row_in_cta < rows ? cuda::load4(dg + (row0 + s.row_in_cta) * lddg + j) : acc;
    for (int r = s.row_in_cta; r < rows; r += s.row_step) {
      const int next = r + s.row_step;
      const float4 dnext = next < rows ? cuda::load4(dg + (row0 + next) * lddg + j) : dv;
      const float dgs[4] = {dv.x, dv.y, dv.z, dv.w};
      float x[4], o[4];
      gate_inputs<R>(su + r * R, wr, bj, x);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool pass = !clamped || logsigmoid(x[e]) * inv_tau >= clamp;
        o[e] = pass ? dgs[e] * sigmoid_neg(x[e]) * inv_tau : 0.f;
      }
      cuda::store4(dz + (row0 + r) * lddz + j, make_float4(o[0], o[1], o[2], o[3]));
      acc.x += o[0], acc.y += o[1], acc.z += o[2], acc.w += o[3];
      dv = dnext;
    }
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  // The row groups of each column group in order, into this CTA's partial.
  if (s.active && s.row_in_cta == 0) {
    const int groups = d / 4;
    for (int p = 1; p < s.row_step; ++p) {
      const float4 q = sums[p * groups + s.col];
      acc.x += q.x, acc.y += q.y, acc.z += q.z, acc.w += q.w;
    }
    cuda::store4(partial + static_cast<int64_t>(blockIdx.x) * d + 4 * s.col, acc);
  }
}

// db[j] += sum over CTAs of partial[cta][j]. A CTA takes 32 columns; its 8 warps sum every 8th
// partial (warp s: partials s, s + 8, ...) and warp 0 adds the 8 sums in order, so the order of
// the additions is fixed.
constexpr int kDbCols = 32, kDbSplit = kThreads / kDbCols;
__global__ void __launch_bounds__(kThreads)
    loggate_lowrank_db_kernel(const float* __restrict__ partial, int ctas, float* __restrict__ db, int d) {
  __shared__ float sums[kDbSplit][kDbCols];
  const int c = threadIdx.x % kDbCols, s = threadIdx.x / kDbCols, j = blockIdx.x * kDbCols + c;
  float acc = 0.f;
  if (j < d)
#pragma unroll 8
    for (int p = s; p < ctas; p += kDbSplit) acc += partial[static_cast<int64_t>(p) * d + j];
  sums[s][c] = acc;
  __syncthreads();
  if (s == 0 && j < d) {
    for (int k = 1; k < kDbSplit; ++k) acc += sums[k][c];
    db[j] += acc;
  }
}

template <class Fn>
void with_rank(int64_t rank, Fn&& fn) {
  switch (rank) {
    case 8:
      fn(std::integral_constant<int, 8>{});
      break;
    case 16:
      fn(std::integral_constant<int, 16>{});
      break;
    case 32:
      fn(std::integral_constant<int, 32>{});
      break;
    default:
      LINAC_FAIL("loggate_lowrank (GPU): rank must be 8, 16 or 32, got " + std::to_string(rank));
  }
}

void check_gpu(const Tensor& u, const Tensor& w, const Tensor& b, std::initializer_list<const Tensor*> f32_rows) {
  LINAC_CHECK(u.dtype == DType::BF16 && w.dtype == DType::BF16, "loggate_lowrank (GPU): u and W must be bf16");
  LINAC_CHECK(b.dtype == DType::F32 && cuda::vec4_aligned(b), "loggate_lowrank (GPU): b must be f32, 16-byte aligned");
  LINAC_CHECK(reinterpret_cast<uintptr_t>(u.ptr) % 16 == 0 && loggate_ld(u) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(w.ptr) % 16 == 0 && w.is_contiguous(),
              "loggate_lowrank (GPU): rows of u and W must be 16-byte aligned (W contiguous)");
  for (const Tensor* t : f32_rows)
    LINAC_CHECK(cuda::rows_vec4(t->ptr, dtype_size(t->dtype), loggate_ld(*t)),
                "loggate_lowrank (GPU): rows of g, dg and dz must be 4-element aligned");
}

int rows_per_cta(int64_t d) { return std::min<int>(kMaxRows, kPasses * (kThreads / static_cast<int>(d / 4))); }
unsigned ctas_for(int64_t n, int64_t d) { return static_cast<unsigned>((n + rows_per_cta(d) - 1) / rows_per_cta(d)); }

}  // namespace

void loggate_lowrank_fwd_cuda(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& g,
                              const LogGateOpts& o) {
  const int64_t n = g.size(0), d = g.size(1);
  LINAC_CHECK(loggate_lowrank_gpu_ok(ctx, d, w.size(1), u.dtype),
              "loggate_lowrank (GPU): unsupported D, rank or dtype");
  LINAC_CHECK(g.dtype == DType::F32, "loggate_lowrank (GPU): g must be f32");
  check_gpu(u, w, b, {&g});
  if (n == 0) return;
  with_rank(w.size(1), [&](auto R) {
    cuda::launch_dependent(ctx, loggate_lowrank_fwd_kernel<decltype(R)::value>, dim3(ctas_for(n, d)), dim3(kThreads), 0,
                           u.data<__nv_bfloat16>(), loggate_ld(u), w.data<__nv_bfloat16>(), b.data<float>(),
                           g.data<float>(), loggate_ld(g), n, static_cast<int>(d), rows_per_cta(d),
                           static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped());
  });
}

void loggate_lowrank_bwd_cuda(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& dg,
                              const Tensor& dz, const Tensor& db, const LogGateOpts& o) {
  const int64_t n = dg.size(0), d = dg.size(1);
  LINAC_CHECK(loggate_lowrank_gpu_ok(ctx, d, w.size(1), u.dtype),
              "loggate_lowrank (GPU): unsupported D, rank or dtype");
  LINAC_CHECK(dg.dtype == DType::F32 && dz.dtype == DType::BF16 && db.dtype == DType::F32,
              "loggate_lowrank (GPU): dg and db must be f32, dz bf16");
  check_gpu(u, w, b, {&dg, &dz});
  if (n == 0) return;
  const unsigned ctas = ctas_for(n, d);
  LINAC_CHECK(static_cast<size_t>(ctas) * static_cast<size_t>(d) * sizeof(float) <= ctx.workspace_bytes,
              "loggate_lowrank (GPU): workspace too small for the bias partials");
  float* partial = static_cast<float*>(ctx.workspace);
  with_rank(w.size(1), [&](auto R) {
    loggate_lowrank_bwd_kernel<decltype(R)::value><<<ctas, kThreads, 0, cuda::stream_of(ctx)>>>(
        u.data<__nv_bfloat16>(), loggate_ld(u), w.data<__nv_bfloat16>(), b.data<float>(), dg.data<float>(),
        loggate_ld(dg), dz.data<__nv_bfloat16>(), loggate_ld(dz), partial, n, static_cast<int>(d), rows_per_cta(d),
        static_cast<float>(1.0 / o.tau), static_cast<float>(o.clamp), o.clamped());
  });
  LINAC_CUDA_LAUNCH_CHECK();
  loggate_lowrank_db_kernel<<<cuda::grid_1d(d, kDbCols), kThreads, 0, cuda::stream_of(ctx)>>>(
      partial, static_cast<int>(ctas), db.data<float>(), static_cast<int>(d));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
