// CUDA VQ-attention forward, block form (math in vq_attn.h, docs/transformer_vq.md §3), on the packed
// layout of vq_common.cuh with tensor-core GEMMs (cuBLASLt, f32 accumulation):
//   prepare   pack q, khat, v; bias tables; the cache scan (counts, per-code means ubar)
//   per head, per chunk of blocks i (queries of block n, rows of Lb):
//     scores  swin_i = q_i [khat_{n-1}; khat_n]^T, scache = q C^T, pos = q rho^T
//     softmax warp per query row: scores plus the f32 bias terms, masks, lse (f32, saved),
//             weights p in the activation dtype (into VqAttnOpts::saved_weights where given, for
//             the backward)
//     output  o_i = pwin_i [v_{n-1}; v_n] + pcache_i ubar_i (f32), then to o's dtype and layout;
//             where o's rows are the packed rows (one head, T a multiple of Lb: the paper's
//             model), straight into o: the window part first, rounded to o's dtype, then the
//             cache part added to it in f32 and rounded (one more rounding of the window part
//             than through the f32 rows, which cost a read and a write of them and a store pass).
//             Where a pair has at most four blocks, the cache part only for its blocks n >= 2
//             (the others' caches are empty; vq_cuda::for_cached_blocks).
// Padded rows (no token: past T, or between documents) get zero weights and are not written out.
#include <algorithm>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_max;
using cuda::warp_sum;
using vq_cuda::Geo;
using vq_cuda::Operand;
using vq_cuda::Row;
using vq_cuda::Ws;

constexpr int kThreads = 256;
constexpr size_t kKeptBytes = 72 * 1024;

// Warp per row of the chunk, four entries per lane access (vq_cuda::RowScores). kKept: the row's
// scores stay in shared memory (each lane reads back its own): max, then exp(s - max) kept and
// summed, then scaled by 1 / sum, one exp per entry. Otherwise (rows too long to keep): max and
// sum online, then the scores again from the score matrices and exp(s - lse).
template <bool kKept, class T>
__global__ void __launch_bounds__(kThreads) vq_softmax_rows_kernel(Geo g, int64_t i0, int64_t rows, Ws w,
                                                                   float* __restrict__ lse) {
  extern __shared__ __align__(16) float kept[];  // kKept: [kThreads / 32, ldw + lds]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kThreads / 32} + warp;
  if (r >= rows) return;
  const Row row = vq_cuda::row_of(g, i0, r);
  const int W = static_cast<int>(2 * g.Lb), S = static_cast<int>(g.S), ldw = static_cast<int>(g.ldw);
  T* pwin = static_cast<T*>(w.pwin) + r * g.ldw;
  T* pcache = static_cast<T*>(w.pcache) + r * g.lds;
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row.s < 0) {
    for (int e = 4 * lane; e < W; e += 128) cuda::store4(pwin + e, zero4);
    for (int s = 4 * lane; s < S; s += 128) cuda::store4(pcache + s, zero4);
    return;
  }
  const vq_cuda::RowScores sc(g, row, r, w);
  float* const lse_out = lse + (row.b * g.T + row.s) * g.H + row.h;
  if constexpr (kKept) {
    float4* win = reinterpret_cast<float4*>(kept + warp * (ldw + static_cast<int>(g.lds)));
    float4* cache = win + ldw / 4;
    float m = -INFINITY;
    auto max4 = [](float4 x) { return fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)); };
    for (int e = 4 * lane; e < W; e += 128) m = fmaxf(m, max4(win[e / 4] = sc.window4(e)));
    for (int s = 4 * lane; s < S; s += 128) m = fmaxf(m, max4(cache[s / 4] = sc.cache4(s)));
    m = warp_max(m);  // finite: a row always sees its own key
    float sum = 0;
    auto ex = [m](float s, int) { return s == -INFINITY ? 0.f : expf(s - m); };
    auto add4 = [&](float4 x) { sum += (x.x + x.y) + (x.z + x.w); };
    for (int e = 4 * lane; e < W; e += 128) add4(win[e / 4] = vq_cuda::map4(win[e / 4], ex));
    for (int s = 4 * lane; s < S; s += 128) add4(cache[s / 4] = vq_cuda::map4(cache[s / 4], ex));
    sum = warp_sum(sum);
    if (lane == 0) *lse_out = m + logf(sum);
    const float inv = 1.f / sum;
    auto scale = [inv](float p, int) { return p * inv; };
    for (int e = 4 * lane; e < W; e += 128) cuda::store4(pwin + e, vq_cuda::map4(win[e / 4], scale));
    for (int s = 4 * lane; s < S; s += 128) cuda::store4(pcache + s, vq_cuda::map4(cache[s / 4], scale));
  } else {
    float m = -INFINITY, sum = 0;
    auto add = [&](float s) {
      if (s == -INFINITY) return;
      if (s > m) {
        sum = sum * expf(m - s) + 1.f;
        m = s;
      } else {
        sum += expf(s - m);
      }
    };
    auto add4 = [&](float4 s) { add(s.x), add(s.y), add(s.z), add(s.w); };
    for (int e = 4 * lane; e < W; e += 128) add4(sc.window4(e));
    for (int s = 4 * lane; s < S; s += 128) add4(sc.cache4(s));
    const float mw = warp_max(m);
    sum = warp_sum(m == -INFINITY ? 0.f : sum * expf(m - mw));
    const float l = mw + logf(sum);
    if (lane == 0) *lse_out = l;
    auto weight = [l](float s, int) { return s == -INFINITY ? 0.f : expf(s - l); };
    for (int e = 4 * lane; e < W; e += 128) cuda::store4(pwin + e, vq_cuda::map4(sc.window4(e), weight));
    for (int s = 4 * lane; s < S; s += 128) cuda::store4(pcache + s, vq_cuda::map4(sc.cache4(s), weight));
  }
}

// Row-tiled over the chunk's rows (padded rows are skipped); four value dims per access where
// o's rows are 4-aligned.
template <bool kVec, class T>
__global__ void __launch_bounds__(kThreads) vq_store_o_kernel(Geo g, int64_t i0, int64_t rows,
                                                              const float* __restrict__ ochunk, T* __restrict__ o,
                                                              VqAttnLayout::Strides os, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= rows) return;
  const Row row = vq_cuda::row_of(g, i0, rs.row);
  if (row.s < 0) return;
  const int Dv = static_cast<int>(g.Dv);
  T* out = o + row.b * os.b + row.s * os.t + row.h * Dv;
  const float* in = ochunk + rs.row * Dv;
  if constexpr (kVec) {
    for (int d = 4 * rs.lane; d < Dv; d += 4 * rs.lanes) cuda::store4(out + d, cuda::load4(in + d));
  } else {
    for (int d = rs.lane; d < Dv; d += rs.lanes) out[d] = from_float<T>(in[d]);
  }
}

}  // namespace

void vq_attn_fwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse) {
  if (L.B * L.T * L.H == 0) return;
  Ctx rest;
  const Geo g = vq_cuda::geo_of_call(ctx, L, &rest);
  Ws w = vq_cuda::carve(rest, g, dtype_size(q.dtype), false, "vq_attn_fwd");
  cudaStream_t st = cuda::stream_of(ctx);
  const size_t es = dtype_size(q.dtype);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  LINAC_GPU_DISPATCH(q.dtype, T, {
    vq_cuda::prepare<T>(ctx, g, L, w, q.data<T>(), khat.data<T>(), z.data<int32_t>(), v.data<T>(),
                        codebook.data<float>(), u.data<float>(), vr.data<float>(), rho.data<float>(), false);
    const int64_t Lb = g.Lb, Dv = g.Dv, ldo = vq_cuda::packed_row_stride(g, L.o, Dv);
    const bool vec = Dv % 4 == 0 && cuda::rows_vec4(o.ptr, sizeof(T), L.o.t) && L.o.b % 4 == 0;
    // Scores kept on chip when a CTA's rows take at most kKeptBytes (three CTAs per SM).
    const size_t row_bytes = static_cast<size_t>(g.ldw + g.lds) * sizeof(float);
    const size_t kept_bytes = row_bytes * (kThreads / 32) <= kKeptBytes ? row_bytes * (kThreads / 32) : 0;
    if (kept_bytes > 0)
      LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_softmax_rows_kernel<true, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kept_bytes)));
    const vq_cuda::SavedWeights saved = vq_cuda::saved_weights(g, es, L.saved_weights);
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i0 = h * g.B * g.R; i0 < (h + 1) * g.B * g.R; i0 += w.cap) {
        const int64_t c = std::min(w.cap, (h + 1) * g.B * g.R - i0), rows = c * Lb;
        if (saved.pwin) {
          w.pwin = static_cast<char*>(saved.pwin) + i0 * Lb * g.ldw * static_cast<int64_t>(es);
          w.pcache = static_cast<char*>(saved.pcache) + i0 * Lb * g.lds * static_cast<int64_t>(es);
        }
        vq_cuda::chunk_scores(g, w, q.dtype, h, i0, c);
        if (kept_bytes > 0)
          vq_softmax_rows_kernel<true, T><<<cuda::grid_1d(rows * 32, kThreads), kThreads, kept_bytes, st>>>(
              g, i0, rows, w, lse.data<float>());
        else
          vq_softmax_rows_kernel<false, T><<<cuda::grid_1d(rows * 32, kThreads), kThreads, 0, st>>>(
              g, i0, rows, w, lse.data<float>());
        LINAC_CUDA_LAUNCH_CHECK();
        const Operand pwin{w.pwin, g.ldw, Lb * g.ldw, false};
        // o_i = pwin_i [v_{n-1}; v_n] + pcache_i ubar_i: the window part, then the cache part added
        // (for_cached_blocks: only blocks n >= 2 where a pair has at most four)
        auto add_cache = [&](void* out, int64_t ld, DType cd) {
          vq_cuda::for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
            vq_cuda::gemm(w.blas, q.dtype, Lb, Dv, g.S, batch,
                          {at(w.pcache, (i - i0) * Lb * g.lds), g.lds, stride * Lb * g.lds, false},
                          {at(w.ubar, i * g.S * Dv), Dv, stride * g.S * Dv, false},
                          static_cast<char*>(out) + (i - i0) * Lb * ld * static_cast<int64_t>(dtype_size(cd)), ld,
                          stride * Lb * ld, 1.f, false, cd);
          });
        };
        if (ldo > 0) {  // o's rows are the packed rows: both parts straight into o
          T* oi = o.data<T>() + i0 * Lb * ldo;
          vq_cuda::window_gemm(g, w, q.dtype, i0, c, false, pwin, w.vp, Dv, oi, ldo, Lb * ldo, 0.f, q.dtype);
          add_cache(oi, ldo, q.dtype);
          continue;
        }
        vq_cuda::window_gemm(g, w, q.dtype, i0, c, false, pwin, w.vp, Dv, w.ochunk, Dv, Lb * Dv, 0.f);
        add_cache(w.ochunk, Dv, DType::F32);
        const cuda::RowTiling rt = cuda::row_tiling(rows, vec ? Dv / 4 : Dv, kThreads);
        if (vec)
          vq_store_o_kernel<true, T><<<rt.blocks, kThreads, 0, st>>>(g, i0, rows, w.ochunk, o.data<T>(), L.o, rt.log_tpr);
        else
          vq_store_o_kernel<false, T><<<rt.blocks, kThreads, 0, st>>>(g, i0, rows, w.ochunk, o.data<T>(), L.o, rt.log_tpr);
        LINAC_CUDA_LAUNCH_CHECK();
      }
  });
}

}  // namespace linac
