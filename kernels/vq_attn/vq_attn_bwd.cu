// CUDA VQ-attention backward, block form (math in vq_attn.h, docs/transformer_vq.md §4), on the packed
// layout of vq_common.cuh with tensor-core GEMMs (cuBLASLt, f32 accumulation, fixed order: the
// result is deterministic). The forward saves o and lse, and its cache where VqAttnOpts::saved_cache
// is given.
//   prepare    as the forward (packed q, khat, v; the cache, or the forward's; tables), plus q+u,
//              q+vr, dout packed (or read in place at its row stride) and delta_t = dout_t . o_t
//              (from VqAttnOpts::delta_units where given)
//   per head, per chunk of blocks i (queries of block n):
//     dp       dpwin_i = dout_i [v_{n-1}; v_n]^T, dpcache_i = dout_i ubar_i^T
//     rows     warp per query: p the forward's weights (VqAttnOpts::saved_weights) or exp(s - lse)
//              of the scores recomputed (swin, scache, pos), gs = p (dp - delta); p and gs in the
//              activation dtype, gs also by distance (gpos[t, d] for the key at t - d)
//     (on an H100/H200 with the saved weights in bf16, dp and rows are one kernel: the dP GEMMs
//     with the rows' work in their epilogue, vq_score_grads_sm90.cu)
//     dq       dqu = gswin_i [khat_{n-1}; khat_n] + gscache C,  dqr = gpos rho   (f32)
//     dkhat    present keys of block n, then the previous block's (accumulated):
//              dk_n = gswin_i[:, Lb:]^T (q+u)_i,  dk_{n-1} += gswin_i[:, :Lb]^T (q+u)_i
//     dv       dv_m = [pwin_m present; pwin_{m+1} previous]^T [dout_m; dout_{m+1}], one GEMM over the
//              key-major weights (vq_packed.h), in the activation dtype; the cache part
//              gcache_i = pcache_i^T dout_i, in the activation dtype (where a pair has at most
//              four blocks, only for its blocks n >= 2: the others' caches are empty)
//     drho_h  += gpos^T (q+vr)  (chunks in order; distances padded to ldp, copied out at the end)
//   then       gcache swept in reverse, in place (cache_grad_sweep; f32 sums),
//              dv_j += swept^(n(j))[z_j]; or, where a pair has at most four blocks, the store sums
//              the (at most two) terms of swept^(n(j))[z_j] itself and there is no sweep;
//              du_h = sum_t dqu_t, dvr_h = sum_t dqr_t (f32 GEMMs with a ones vector)
#include <algorithm>
#include <cstdint>
#include <string_view>

#include "activation/sigmoid.cuh"
#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;
using vq_cuda::Geo;
using vq_cuda::Row;
using vq_cuda::Ws;

constexpr int kThreads = 256;
// Where a pair has at most kSummedTerms + 2 blocks, a token of block m sums the at most
// kSummedTerms cache-mean gradients of blocks m+2 .. R-1 itself (the store's kSummed form): it
// reads no more cells than the swept one, and the sweep's pass over every cell (read and written,
// 95 us per layer of the 190M model at T = 2048, R = 4) is not run.
constexpr int kSummedTerms = 2;

// Warp per row of the chunk, four entries per lane access. The weights p: kSaved, the forward's
// (the chunk's rows of VqAttnOpts::saved_weights: sp_win, and sp_cache, which the gcache GEMM
// reads in place); otherwise exp(s - lse) of the recomputed scores (vq_cuda::RowScores),
// written to w.pcache. Masked entries have p = 0, and so gs = 0 whatever dp holds there.
template <bool kSaved, class T>
__global__ void __launch_bounds__(kThreads) vq_grad_rows_kernel(Geo g, int64_t i0, int64_t rows, Ws w,
                                                                const float* __restrict__ lse,
                                                                const T* __restrict__ sp_win,
                                                                const T* __restrict__ sp_cache) {
  const int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const Row row = vq_cuda::row_of(g, i0, r);
  const int W = static_cast<int>(2 * g.Lb), S = static_cast<int>(g.S), ldp = static_cast<int>(g.ldp);
  const int Lb = static_cast<int>(g.Lb);
  // The weights go key-major (vq_packed.h): entry e >= Lb to this block's slot, row l, column
  // e - Lb; entry e < Lb to the previous block's slot, row Lb + l, column e.
  T* present = static_cast<T*>(w.pwin) + (row.i - i0 + 1) * vq_cuda::key_slot_elems(g) + row.l * g.ldkey;
  T* previous = present - vq_cuda::key_slot_elems(g) + Lb * g.ldkey;
  auto weight_at = [&](int e) { return e < Lb ? previous + e : present + (e - Lb); };
  auto store_p = [&](int e, float4 p) {
    if (Lb % 4 == 0) {  // the four entries sit in one block
      cuda::store4(weight_at(e), p);
    } else {
      vq_cuda::map4(p, [&](float x, int k) {
        if (e + k < W) *weight_at(e + k) = from_float<T>(x);
        return x;
      });
    }
  };
  T* gswin = static_cast<T*>(w.gswin) + r * g.ldw;
  T* pcache = static_cast<T*>(w.pcache) + r * g.lds;
  T* gscache = static_cast<T*>(w.gscache) + r * g.lds;
  T* gpos = static_cast<T*>(w.gpos) + r * g.ldp;
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row.s < 0) {
    for (int e = 4 * lane; e < W; e += 128) store_p(e, zero4), cuda::store4(gswin + e, zero4);
    for (int s = 4 * lane; s < S; s += 128) {
      if (!kSaved) cuda::store4(pcache + s, zero4);
      cuda::store4(gscache + s, zero4);
    }
    for (int d = lane; d < ldp; d += 32) gpos[d] = from_float<T>(0.f);
    return;
  }
  // gpos's padding past Lb: the dq GEMM reads it.
  for (int d = Lb + 1 + lane; d < ldp; d += 32) gpos[d] = from_float<T>(0.f);
  const float delta = w.delta[row.p * g.Tp + row.t];
  const vq_cuda::RowScores sc(g, row, r, w);
  const float lse_t = kSaved ? 0.f : lse[(row.b * g.T + row.s) * g.H + row.h];
  auto weight = [lse_t](float s, int) { return s == -INFINITY ? 0.f : expf(s - lse_t); };
  auto window_p = [&](int e) {
    return kSaved ? cuda::load4(sp_win + r * g.ldw + e) : vq_cuda::map4(sc.window4(e), weight);
  };
  auto cache_p = [&](int s) {
    return kSaved ? cuda::load4(sp_cache + r * g.lds + s) : vq_cuda::map4(sc.cache4(s), weight);
  };
  // gs = p (dp - delta), 0 where p is: dp may never have been written where masked (block 0's
  // missing previous block, the rows' padding).
  auto score_grad = [delta](float4 p, float4 dp) {
    auto one = [delta](float pi, float dpi) { return pi == 0.f ? 0.f : pi * (dpi - delta); };
    return make_float4(one(p.x, dp.x), one(p.y, dp.y), one(p.z, dp.z), one(p.w, dp.w));
  };
  const float* dpwin = w.dpwin + r * g.ldw;
  const int l = static_cast<int>(row.l), hi = Lb + l;  // entry e has distance hi - e; <= Lb where e >= l
  for (int e = 4 * lane; e < W; e += 128) {
    const float4 p = window_p(e);
    const float4 gs = score_grad(p, *reinterpret_cast<const float4*>(dpwin + e));
    store_p(e, p);
    cuda::store4(gswin + e, gs);
    // Every distance 0..Lb once.
    vq_cuda::map4(gs, [&](float x, int k) {
      if (e + k >= l && e + k <= hi) gpos[hi - e - k] = from_float<T>(x);
      return x;
    });
  }
  const float* dpcache = w.dpcache + r * g.lds;
  for (int s = 4 * lane; s < S; s += 128) {
    const float4 p = cache_p(s);
    if (!kSaved) cuda::store4(pcache + s, p);
    cuda::store4(gscache + s, score_grad(p, *reinterpret_cast<const float4*>(dpcache + s)));
  }
}

// dq = dqu + dqr, dkhat, and dv = dvp + swept^(n(t))[z_t] (both in the activation dtype, summed in
// f32; kSummed: the swept value's terms gcache^(n)[z_t] / N^(n) read and summed here, in f32, as
// the sweep would), times silu'(v_pre) after its rounding when v_pre is given (VqAttnOpts::v_pre:
// silu_bwd's bits), for the tokens (p, t < T) at their packed rows. A thread takes kV consecutive
// columns of one token (16 bytes of T where the rows allow), flat over the token's Dk / kV key items
// then its Dv / kV value items, so every thread has work and issues all its loads before its one or
// two stores (threads row-tiled in groups of 256 columns left the key part to 32 of 256: 69% of the
// DRAM bandwidth, 136 us per layer of the 190M model, against 99 at 83% now; H200). Rows from row0.
template <int kV, bool kSummed, class T>
__global__ void __launch_bounds__(kThreads)
    vq_store_grads_kernel(Geo g, Ws w, const int32_t* __restrict__ z, T* __restrict__ dq, VqAttnLayout::Strides dqs,
                          T* __restrict__ dkhat, VqAttnLayout::Strides dks, T* __restrict__ dv,
                          VqAttnLayout::Strides dvs, const T* __restrict__ v_pre, VqAttnLayout::Strides vps,
                          uint32_t row0, uint32_t rows) {
  const uint32_t key_items = static_cast<uint32_t>(g.Dk) / kV, items = key_items + static_cast<uint32_t>(g.Dv) / kV;
  const uint32_t idx = blockIdx.x * kThreads + threadIdx.x, r = idx / items, item = idx - r * items;
  if (r >= rows) return;
  const uint32_t pt = row0 + r, p = pt / static_cast<uint32_t>(g.T);
  const uint32_t t = pt - p * static_cast<uint32_t>(g.T), h = p / static_cast<uint32_t>(g.B);
  const uint32_t b = p - h * static_cast<uint32_t>(g.B);
  const uint32_t tp = g.docs.packed ? static_cast<uint32_t>(g.docs.packed[int64_t{b} * g.T + t]) : t;
  const int64_t row = int64_t{p} * g.Tp + tp;
  if (item < key_items) {
    const int64_t d = int64_t{item} * kV;
    float qu[kV], qr[kV], k[kV];
    cuda::load_vals<kV>(w.dqu + row * g.Dk + d, qu);
    cuda::load_vals<kV>(w.dqr + row * g.Dk + d, qr);
    cuda::load_vals<kV>(w.dk + row * g.Dk + d, k);
#pragma unroll
    for (int i = 0; i < kV; ++i) qu[i] += qr[i];
    cuda::store_vals<kV>(dq + b * dqs.b + t * dqs.t + int64_t{h} * g.Dk + d, qu);
    cuda::store_vals<kV>(dkhat + b * dks.b + t * dks.t + int64_t{h} * g.Dk + d, k);
    return;
  }
  const int64_t d = int64_t{item - key_items} * kV;
  const uint32_t m = tp / static_cast<uint32_t>(g.Lb);
  const int32_t code = z[(b * g.T + t) * g.H + h];
  float x[kV], c[kV] = {}, pre[kV];
  cuda::load_vals<kV>(static_cast<const T*>(w.dvp) + row * g.Dv + d, x);
  if (v_pre) cuda::load_vals<kV>(v_pre + b * vps.b + t * vps.t + int64_t{h} * g.Dv + d, pre);
  if constexpr (kSummed) {
    // Blocks m+2 .. e-1 of m's cache segment (e: the next block that starts one, or R), from the
    // last down: the sweep's terms in the sweep's order.
    const int32_t* starts = g.docs.cache_from ? g.docs.cache_from + int64_t{b} * g.R : nullptr;
    uint32_t e = m + 1;
    while (e < g.R && !(starts && starts[e] == static_cast<int32_t>(e))) ++e;
    float cell[kSummedTerms][kV], N[kSummedTerms];
#pragma unroll
    for (int j = 0; j < kSummedTerms; ++j) {
      const int64_t n = int64_t{e} - 1 - j;
      N[j] = 0.f;
      if (n >= int64_t{m} + 2) {
        const int64_t cell_at = (int64_t{p} * g.R + n) * g.S + code;
        cuda::load_vals<kV>(static_cast<const T*>(w.gcache) + cell_at * g.Dv + d, cell[j]);
        N[j] = w.counts[cell_at];
      }
    }
#pragma unroll
    for (int j = 0; j < kSummedTerms; ++j)
      if (N[j] > 0)
#pragma unroll
        for (int i = 0; i < kV; ++i) c[i] += cell[j][i] / N[j];
  } else {
    cuda::load_vals<kV>(static_cast<const T*>(w.gcache) + ((int64_t{p} * g.R + m) * g.S + code) * g.Dv + d, c);
  }
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    x[i] += c[i];
    if (v_pre) x[i] = cuda::rounded<T>(x[i]) * cuda::silu_grad(pre[i]);
  }
  cuda::store_vals<kV>(dv + b * dvs.b + t * dvs.t + int64_t{h} * g.Dv + d, x);
}

}  // namespace

void vq_attn_bwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat,
                      const Tensor& dv, const Tensor& du, const Tensor& dvr, const Tensor& drho, const Tensor& v_pre) {
  if (L.B * L.T * L.H == 0) return;
  Ctx rest;
  const Geo g = vq_cuda::geo_of_call(ctx, L, &rest);
  Ws w = vq_cuda::carve(rest, g, dtype_size(q.dtype), true, "vq_attn_bwd");
  cudaStream_t st = cuda::stream_of(ctx);
  const DType act = q.dtype;
  const size_t es = dtype_size(act);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  LINAC_GPU_DISPATCH(act, T, {
    vq_cuda::prepare<T>(ctx, g, L, w, q.data<T>(), khat.data<T>(), z.data<int32_t>(), v.data<T>(),
                        codebook.data<float>(), u.data<float>(), vr.data<float>(), rho.data<float>(), true);
    vq_cuda::pack<T>(ctx, g, q.data<T>(), L.q, g.Dk, u.data<float>(), static_cast<T*>(w.qu));
    vq_cuda::pack<T>(ctx, g, q.data<T>(), L.q, g.Dk, vr.data<float>(), static_cast<T*>(w.qr));
    // dout is read in place when its rows are the packed rows at some row stride (the mixer's dout
    // is a column slice of the gate's and output's fused gradient).
    int64_t ldo = vq_cuda::packed_row_stride(g, L.dout, g.Dv);
    if (ldo > 0) {
      w.dop = dout.ptr;  // read only
    } else {
      vq_cuda::pack<T>(ctx, g, dout.data<T>(), L.dout, g.Dv, nullptr, static_cast<T*>(w.dop));
      ldo = g.Dv;
    }
    if (L.delta_units)
      vq_cuda::unit_sums(ctx, g, L.delta_units, w.delta);
    else
      vq_cuda::row_dots<T>(ctx, g, dout.data<T>(), L.dout, g.Dv, nullptr, o.data<T>(), L.o, w.delta);
    const int64_t Lb = g.Lb, Dk = g.Dk, Dv = g.Dv, S = g.S, ldw = g.ldw, lds = g.lds;
    const vq_cuda::SavedWeights saved = vq_cuda::saved_weights(g, es, L.saved_weights);
    const bool fused = saved.pwin && ldo % 8 == 0 && reinterpret_cast<uintptr_t>(w.dop) % 16 == 0 &&
                       std::string_view(vq_attn_score_grads_kernel(Lb, Dv, act)) == "gemm_epilogue_sm90";
    const bool summed = g.R <= kSummedTerms + 2;  // the store sums each token's cache-mean gradients
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i0 = h * g.B * g.R; i0 < (h + 1) * g.B * g.R; i0 += w.cap) {
        const int64_t c = std::min(w.cap, (h + 1) * g.B * g.R - i0), rows = c * Lb;
        const void* dop_i = at(w.dop, i0 * Lb * ldo);
        const void* qu_i = at(w.qu, i0 * Lb * Dk);
        const void* pcache = w.pcache;  // the cache weights the gcache GEMM reads
        if (fused) {
#if LINAC_WITH_SM90A
          vq_cuda::score_grads_sm90(ctx, g, w, i0, c, w.dop, ldo, saved.pwin, saved.pcache);
#endif
          pcache = static_cast<const T*>(saved.pcache) + i0 * Lb * lds;
        } else {
          vq_cuda::window_gemm(g, w, act, i0, c, true, {dop_i, ldo, Lb * ldo, false}, w.vp, Dv, w.dpwin, ldw, Lb * ldw,
                               0.f);
          // dpcache (for_cached_blocks: without the empty caches' blocks where a pair has at most
          // four; the rows kernel takes gs = 0 where p is 0 without reading dp).
          vq_cuda::for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
            vq_cuda::gemm(w.blas, act, Lb, S, Dv, batch, {at(w.dop, i * Lb * ldo), ldo, stride * Lb * ldo, false},
                          {at(w.ubar, i * S * Dv), Dv, stride * S * Dv, true}, w.dpcache + (i - i0) * Lb * lds, lds,
                          stride * Lb * lds, 0.f);
          });
          const unsigned blocks = cuda::grid_1d(rows * 32, kThreads);
          if (saved.pwin) {
            const T* sp_win = static_cast<const T*>(saved.pwin) + i0 * Lb * ldw;
            const T* sp_cache = static_cast<const T*>(saved.pcache) + i0 * Lb * lds;
            vq_grad_rows_kernel<true, T><<<blocks, kThreads, 0, st>>>(g, i0, rows, w, nullptr, sp_win, sp_cache);
            pcache = sp_cache;
          } else {
            vq_cuda::chunk_scores(g, w, act, h, i0, c);
            vq_grad_rows_kernel<false, T>
                <<<blocks, kThreads, 0, st>>>(g, i0, rows, w, lse.data<float>(), nullptr, nullptr);
          }
          LINAC_CUDA_LAUNCH_CHECK();
        }
        // dq: the window and cache keys (the u part), the distances (the vr part).
        float* dqu = w.dqu + i0 * Lb * Dk;
        vq_cuda::window_gemm(g, w, act, i0, c, false, {w.gswin, ldw, Lb * ldw, false}, w.kp, Dk, dqu, Dk, Lb * Dk, 0.f);
        // The cache part (for_cached_blocks: without the empty caches' blocks where a pair has at
        // most four; their gscache is 0), one GEMM over the rows of consecutive blocks.
        vq_cuda::for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
          const int64_t m = stride == 1 ? batch * Lb : Lb, nb = stride == 1 ? 1 : batch;
          vq_cuda::gemm_table(w.blas, act, m, Dk, S, nb,
                              {at(w.gscache, (i - i0) * Lb * lds), lds, stride * Lb * lds, false},
                              at(w.ctab, h * S * w.ldt), w.ldt, dqu + (i - i0) * Lb * Dk, Dk, stride * Lb * Dk, 1.f);
        });
        vq_cuda::gemm_table(w.blas, act, rows, Dk, g.ldp, 1, {w.gpos, g.ldp, 0, false}, at(w.rtab, h * g.ldp * w.ldt),
                            w.ldt, w.dqr + i0 * Lb * Dk, Dk, 0, 0.f);
        // dkhat of the present block, then of the previous one (into the block before; the chunk's
        // first block adds to the previous chunk's last, already written).
        vq_cuda::gemm(w.blas, act, Lb, Dk, Lb, c, {at(w.gswin, Lb), ldw, Lb * ldw, true}, {qu_i, Dk, Lb * Dk, false},
                      w.dk + i0 * Lb * Dk, Dk, Lb * Dk, 0.f);
        const int64_t j0 = std::max<int64_t>(i0, 1), cp = i0 + c - j0;  // blocks with a block before them
        vq_cuda::gemm(w.blas, act, Lb, Dk, Lb, cp, {at(w.gswin, (j0 - i0) * Lb * ldw), ldw, Lb * ldw, true},
                      {at(w.qu, j0 * Lb * Dk), Dk, Lb * Dk, false}, w.dk + (j0 - 1) * Lb * Dk, Dk, Lb * Dk, 1.f);
        // dv of block m's keys from the queries of blocks m and m + 1 in one GEMM over the key-major
        // weights (vq_packed.h), for the chunk's blocks but its last: that one takes its own
        // queries, and the next chunk adds block i0 + c's (slot 0) unless a pair starts there.
        const int64_t ks = vq_cuda::key_slot_elems(g), ldkey = g.ldkey, last = i0 + c - 1;
        // dv's window part in the activation dtype (the chunk-boundary block rounded twice).
        auto dvp_at = [&](int64_t block) {
          return static_cast<char*>(w.dvp) + block * Lb * Dv * static_cast<int64_t>(es);
        };
        vq_cuda::gemm(w.blas, act, Lb, Dv, 2 * Lb, c - 1, {at(w.pwin, ks), ldkey, ks, true},
                      {dop_i, ldo, Lb * ldo, false}, dvp_at(i0), Dv, Lb * Dv, 0.f, false, act);
        vq_cuda::gemm(w.blas, act, Lb, Dv, Lb, 1, {at(w.pwin, c * ks), ldkey, 0, true},
                      {at(w.dop, last * Lb * ldo), ldo, 0, false}, dvp_at(last), Dv, 0, 0.f, false, act);
        if (i0 % g.R != 0)
          vq_cuda::gemm(w.blas, act, Lb, Dv, Lb, 1, {at(w.pwin, Lb * ldkey), ldkey, 0, true}, {dop_i, ldo, 0, false},
                        dvp_at(i0 - 1), Dv, 0, 1.f, false, act);
        // The cache means' gradients (of blocks n >= 2 of a pair where it has at most four:
        // for_cached_blocks), swept below or summed by the store, then drho.
        vq_cuda::for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
          vq_cuda::gemm(w.blas, act, S, Dv, Lb, batch, {at(pcache, (i - i0) * Lb * lds), lds, stride * Lb * lds, true},
                        {at(w.dop, i * Lb * ldo), ldo, stride * Lb * ldo, false},
                        static_cast<char*>(w.gcache) + i * S * Dv * static_cast<int64_t>(es), Dv, stride * S * Dv, 0.f,
                        false, act);
        });
        vq_cuda::gemm(w.blas, act, g.ldp, Dk, rows, 1, {w.gpos, g.ldp, 0, true}, {at(w.qr, i0 * Lb * Dk), Dk, 0, false},
                      w.drho + h * g.ldp * Dk, Dk, 0, i0 == h * g.B * g.R ? 0.f : 1.f);
      }
    if (!summed) vq_cuda::cache_grad_sweep<T>(ctx, g, w.counts, static_cast<T*>(w.gcache));
    // The widest access (16 bytes of T, four elements, one) that every row of the outputs and of
    // v_pre starts aligned to; the workspace rows (Dk, Dv wide from 256-byte aligned bases) follow.
    const T* pre = v_pre.defined() ? v_pre.data<T>() : nullptr;
    auto rows_fit = [&](int64_t kv, const Tensor& x, VqAttnLayout::Strides s) {
      return reinterpret_cast<uintptr_t>(x.ptr) % (kv * sizeof(T)) == 0 && s.t % kv == 0 && s.b % kv == 0;
    };
    auto fits = [&](int64_t kv) {
      return Dk % kv == 0 && Dv % kv == 0 && rows_fit(kv, dq, L.dq) && rows_fit(kv, dkhat, L.dkhat) &&
             rows_fit(kv, dv, L.dv) && (!pre || rows_fit(kv, v_pre, L.v_pre));
    };
    auto store = [&](auto kv, auto sum) {
      constexpr int kV = decltype(kv)::value;
      constexpr bool kSummed = decltype(sum)::value;
      const int64_t items = (Dk + Dv) / kV, per_launch = (int64_t{1} << 31) / items;  // 32-bit item indices
      for (int64_t row0 = 0; row0 < g.P * g.T; row0 += per_launch) {
        const int64_t rows = std::min(per_launch, g.P * g.T - row0);
        vq_store_grads_kernel<kV, kSummed, T><<<cuda::grid_1d(rows * items, kThreads), kThreads, 0, st>>>(
            g, w, z.data<int32_t>(), dq.data<T>(), L.dq, dkhat.data<T>(), L.dkhat, dv.data<T>(), L.dv, pre, L.v_pre,
            static_cast<uint32_t>(row0), static_cast<uint32_t>(rows));
        LINAC_CUDA_LAUNCH_CHECK();
      }
    };
    auto store_summed_or_swept = [&](auto kv) {
      if (summed)
        store(kv, std::true_type{});
      else
        store(kv, std::false_type{});
    };
    constexpr int kWide = 16 / sizeof(T);
    if (fits(kWide))
      store_summed_or_swept(std::integral_constant<int, kWide>{});
    else if (fits(4))
      store_summed_or_swept(std::integral_constant<int, 4>{});
    else
      store_summed_or_swept(std::integral_constant<int, 1>{});
    for (int64_t h = 0; h < g.H; ++h)
      gpu_memcpy_async(ctx, drho.data<float>() + h * (Lb + 1) * Dk, w.drho + h * g.ldp * Dk,
                       static_cast<size_t>((Lb + 1) * Dk) * sizeof(float));
    // du_h, dvr_h: column sums over the head's rows (padded rows are zero).
    const int64_t K = g.B * g.Tp;
    for (int64_t h = 0; h < g.H; ++h) {
      vq_cuda::gemm(w.blas, DType::F32, 1, Dk, K, 1, {w.ones, K, 0, false}, {w.dqu + h * K * Dk, Dk, 0, false},
                    du.data<float>() + h * Dk, Dk, 0, 0.f);
      vq_cuda::gemm(w.blas, DType::F32, 1, Dk, K, 1, {w.ones, K, 0, false}, {w.dqr + h * K * Dk, Dk, 0, false},
                    dvr.data<float>() + h * Dk, Dk, 0, 0.f);
    }
  });
}

}  // namespace linac
