// CUDA attention backward (math in attention.h), FlashAttention-2 style but deterministic: no
// atomics (bf16 at D = 64/128 on a Hopper GPU runs attention_bwd_sm90.cu's one-pass kernel after delta).
// P is recomputed from q, k and the saved lse, and the work is split in two passes:
//   dq pass:   one CTA per (batch*head, block of BR queries); streams the K/V tiles of its
//              key/value head kv_head(h):
//              S = Q K^T, P = exp(S - lse), dP = dO V^T, dS = P (dP - delta), dQ += dS K
//   dkdv pass: one CTA per (batch*key/value head, block of BC keys); streams the Q/dO tiles of
//              every query head of its group, one head after the other, into the same accumulators
//              (grouped-query attention sums dK and dV over the group without atomics or scratch):
//              S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q
// With documents a query block's key tiles start at its first query's document and a key block's
// query tiles end at its last key's document; the document mask runs on tiles that straddle a
// document start.
// Every gradient row is owned by one warp and summed in a fixed order, so results are bitwise
// reproducible; the price is recomputing S and dP once more than FA2 does (7 matmuls instead of 5).
// (A fused 5-matmul kernel adding dQ partials in a fixed key-block order under integer turn
// counters was measured slower: NOTES.md.)
// delta[b,h,t] = <dO[t], o[t]> (f32, in ctx.workspace) is computed first. Warps own 16 rows; tiles
// stream through shared memory with cp.async double buffering, P and dS go from the f32
// accumulators straight into bf16 A fragments of the next mma.
// Layout: q/o/dout/dq [B,T,H,D] and k/v/dk/dv [B,T,Hk,D] with free batch/token strides, lse/delta
// [B,H,T] f32.
#include "attention/attention_common.cuh"
#include "rope/rope.h"

namespace linac {
namespace attn {
namespace {

constexpr int kDeltaWarps = 8;

// bf16 rows (16-byte aligned, D a multiple of 16): eight lanes per (b, t, h) row, 16 bytes of o
// and dout per lane and step, so a warp reads four rows with full 128-byte lines.
__global__ void delta_bf16_kernel(const bf16_t* __restrict__ o, const bf16_t* __restrict__ dout,
                                  float* __restrict__ delta, const Args a, int64_t rows, int D) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  const int sub = threadIdx.x & 7;
  const int64_t h = r % a.H, t = (r / a.H) % a.T, b = r / (int64_t{a.H} * a.T);
  float acc = 0.f;
  if (r < rows) {
    const bf16_t* orow = o + b * a.o.b + t * a.o.t + h * D;
    const bf16_t* grow = dout + b * a.dout.b + t * a.dout.t + h * D;
    for (int c = sub; c < D / 8; c += 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(orow + 8 * c);
      const uint4 gv = *reinterpret_cast<const uint4*>(grow + 8 * c);
      const __nv_bfloat162* op = reinterpret_cast<const __nv_bfloat162*>(&ov);
      const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 of = __bfloat1622float2(op[i]), gf = __bfloat1622float2(gp[i]);
        acc += of.x * gf.x + of.y * gf.y;
      }
    }
  }
  acc = cuda::lanes_sum<8>(acc);
  if (r < rows && sub == 0) delta[(b * a.H + h) * a.T + t] = acc;
}

// f32: one warp per (b, t, h) row.
__global__ void delta_f32_kernel(const float* __restrict__ o, const float* __restrict__ dout,
                                 float* __restrict__ delta, const Args a, int64_t rows, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t h = r % a.H, t = (r / a.H) % a.T, b = r / (int64_t{a.H} * a.T);
  const float* orow = o + b * a.o.b + t * a.o.t + h * D;
  const float* grow = dout + b * a.dout.b + t * a.dout.t + h * D;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += orow[d] * grow[d];
  acc = cuda::warp_sum(acc);
  if (lane == 0) delta[(b * a.H + h) * a.T + t] = acc;
}

// ---- dq pass ---------------------------------------------------------------------------------

template <int D>
struct DqCfg {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int BR = 16 * kWarps;  // queries per CTA
  static constexpr int BC = 32;           // keys per tile: small S/dP tiles fit D = 64 in 128 registers,
  static constexpr int kMinBlocks = D == 64 ? 2 : 1;  // so two CTAs share an SM
  static constexpr size_t kSmem = static_cast<size_t>(2 * BR + 4 * BC) * kRowBytes<D>;
};

// kBand: per-warp group skipping (group_visible); kDocs (with kBand): document bounds.
template <int D, bool kBand, bool kDocs>
__global__ void __launch_bounds__(DqCfg<D>::kThreads, DqCfg<D>::kMinBlocks)
    dq_bf16_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                   const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                   bf16_t* __restrict__ dq, const Args a) {
  using C = DqCfg<D>;
  constexpr int BR = C::BR, BC = C::BC, NT = C::kThreads;
  constexpr uint32_t kTile = BC * kRowBytes<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sDO = sQ + BR * kRowBytes<D>, sK0 = sDO + BR * kRowBytes<D>,
                 sV0 = sK0 + 2 * kTile;

  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int q0 = (cdiv(a.T, BR) - 1 - static_cast<int>(blockIdx.y)) * BR;  // longest causal rows first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int2 kr = key_blocks<kDocs>(a, b, q0, BR, BC);
  const bf16_t* k_head = head_rows<D>(k, a.k, b, kv_head(a, h));
  const bf16_t* v_head = head_rows<D>(v, a.v, b, kv_head(a, h));
  auto load_kv = [&](int kb, int buf) {
    load_kv_block<BC, D, NT>(a, sK0 + buf * kTile, sV0 + buf * kTile, k_head, v_head, kb);
  };

  load_rows<BR, D, NT>(sQ, head_rows<D>(q, a.q, b, h), a.q.t, q0, a.T);
  load_rows<BR, D, NT>(sDO, head_rows<D>(dout, a.dout, b, h), a.dout.t, q0, a.T);
  load_kv(kr.x, 0);

  const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  // Documents: the starts of this thread's rows; per tile the warp's first and last, as in the
  // forward.
  int doc_row[2];
  if constexpr (kDocs) {
    doc_row[0] = doc_start_of(a, b, row0);
    doc_row[1] = doc_start_of(a, b, row0 + 8);
  }
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    // Padding rows get P = 0 everywhere.
    lse2[r] = t < a.T ? lse[int64_t{bh} * a.T + t] * kLog2e : INFINITY;
    dl[r] = t < a.T ? delta[int64_t{bh} * a.T + t] : 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[D / 16][4], dof[D / 16][4];
  lds_a_rows<D>(sQ, warp * 16, qf);
  lds_a_rows<D>(sDO, warp * 16, dof);
  float acc[D / 8][4] = {};

  for (int kb = kr.x; kb <= kr.y; ++kb) {
    const int k0 = kb * BC, buf = double_buffer_step(kb, kr.x, kr.y, load_kv);
    const uint32_t sK = sK0 + buf * kTile, sV = sV0 + buf * kTile;

    const unsigned vis =  // bit np: key group np is visible to this warp's rows
        kBand ? key_groups_visible<BC / 16, kDocs>(a, q0 + warp * 16, k0, kDocs ? doc_row[0] : 0) : ~0u;
    float s[BC / 8][4] = {}, dp[BC / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        if (!(vis >> np & 1u)) continue;
        uint32_t bk[4], bv[4];
        lds_b_nk<D>(sK, np * 16, kk, bk);
        mma_bf16(s[2 * np], qf[kk], bk[0], bk[1]);
        mma_bf16(s[2 * np + 1], qf[kk], bk[2], bk[3]);
        lds_b_nk<D>(sV, np * 16, kk, bv);
        mma_bf16(dp[2 * np], dof[kk], bv[0], bv[1]);
        mma_bf16(dp[2 * np + 1], dof[kk], bv[2], bv[3]);
      }

    bool masked = k0 + BC > a.T || tile_needs_mask(a, q0, BR, k0, BC);
    if constexpr (kDocs) masked |= __shfl_sync(0xffffffffu, doc_row[1], 28) > k0;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, sk = k0 + 8 * nt + 2 * tq + (e & 1);
        float p = fast_exp2(fmaf(s[nt][e], a.scale_log2, -lse2[r]));
        if (masked && (sk >= a.T || !allowed(a, row0 + 8 * r, sk))) p = 0.f;
        if constexpr (kDocs)
          if (masked && sk < doc_row[r]) p = 0.f;
        s[nt][e] = p * (dp[nt][e] - dl[r]);  // dS (without the scale)
      }

    mma_rows_times_tile<D, BC>(acc, s, vis, sK);  // dQ += dS K
  }

  bf16_t* dqb = dq + b * a.dq.b + h * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = row0 + 8 * r;
    if (t >= a.T) continue;
    bf16_t* row = dqb + int64_t{t} * a.dq.t + 2 * tq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(row + dt * 8) = pack_bf16(acc[dt][2 * r] * a.scale, acc[dt][2 * r + 1] * a.scale);
  }
}

// ---- dkdv pass -------------------------------------------------------------------------------

template <int D>
struct DkvCfg {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int BC = 16 * kWarps;        // keys per CTA
  static constexpr int BR = D == 64 ? 64 : 32;  // queries per tile
  static constexpr bool kKeepKV = D == 64;      // K/V A fragments in registers (larger D rereads them)
  static constexpr int kMinBlocks = 1;
  static constexpr size_t kSmem = static_cast<size_t>(2 * BC + 4 * BR) * kRowBytes<D> + 4 * BR * sizeof(float);
};

// kBand, kDocs: as in the dq pass.
template <int D, bool kBand, bool kDocs>
__global__ void __launch_bounds__(DkvCfg<D>::kThreads, DkvCfg<D>::kMinBlocks)
    dkdv_bf16_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                     const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, const Args a) {
  using C = DkvCfg<D>;
  constexpr int BR = C::BR, BC = C::BC, NT = C::kThreads;
  constexpr uint32_t kTile = BR * kRowBytes<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_u32(smem), sV = sK + BC * kRowBytes<D>, sQ0 = sV + BC * kRowBytes<D>,
                 sDO0 = sQ0 + 2 * kTile;
  // Per query of the two buffered tiles: lse * log2(e) and delta.
  float* s_lse = reinterpret_cast<float*>(smem + 2 * BC * kRowBytes<D> + 4 * kTile);
  float* s_dl = s_lse + 2 * BR;

  const int bhk = blockIdx.x, b = bhk / a.Hk, hk = bhk % a.Hk, group = a.H / a.Hk;
  const int k0 = static_cast<int>(blockIdx.y) * BC;  // causal: low key blocks see the most queries; they go first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int2 qr = query_blocks<kDocs>(a, b, k0, BC, BR);
  // The query tiles, numbered 0 .. last: query blocks qr.x .. qr.y of the group's first query head,
  // then of its second, ...: one double-buffered stream, so a head change costs no pipeline drain.
  const int blocks = qr.y - qr.x + 1, last = group * blocks - 1;

  auto load_queries = [&](int tile, int buf) {
    const int member = tile / blocks, h = hk * group + member, t0 = (qr.x + tile - member * blocks) * BR;
    load_rows<BR, D, NT>(sQ0 + buf * kTile, head_rows<D>(q, a.q, b, h), a.q.t, t0, a.T);
    load_rows<BR, D, NT>(sDO0 + buf * kTile, head_rows<D>(dout, a.dout, b, h), a.dout.t, t0, a.T);
    cp_async_commit();
    if (threadIdx.x < BR) {
      const int t = t0 + threadIdx.x;
      const int64_t row = (int64_t{b} * a.H + h) * a.T + t;
      // Padding queries get P = 0 everywhere.
      s_lse[buf * BR + threadIdx.x] = t < a.T ? lse[row] * kLog2e : INFINITY;
      s_dl[buf * BR + threadIdx.x] = t < a.T ? delta[row] : 0.f;
    }
  };

  load_rows<BC, D, NT>(sK, head_rows<D>(k, a.k, b, hk), a.k.t, k0, a.T);
  load_rows<BC, D, NT>(sV, head_rows<D>(v, a.v, b, hk), a.v.t, k0, a.T);
  load_queries(0, 0);
  cp_async_wait<0>();
  __syncthreads();

  uint32_t kf[C::kKeepKV ? D / 16 : 1][4], vf[C::kKeepKV ? D / 16 : 1][4];
  if constexpr (C::kKeepKV) {
    lds_a_rows<D>(sK, warp * 16, kf);
    lds_a_rows<D>(sV, warp * 16, vf);
  }
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const int srow0 = k0 + warp * 16 + g;  // this thread's keys: srow0 and srow0 + 8
  // Documents (rows are keys: the ends) of this thread's keys. Per tile the warp takes those of its
  // first key (a tile with queries at or past it needs the mask) and of its last (for its groups)
  // from lanes 0 and 28.
  int doc_row[2];
  if constexpr (kDocs) {
    doc_row[0] = doc_end_of(a, b, srow0);
    doc_row[1] = doc_end_of(a, b, srow0 + 8);
  }

  for (int tile = 0; tile <= last; ++tile) {
    const int q0 = (qr.x + tile % blocks) * BR, buf = double_buffer_step(tile, 0, last, load_queries);
    const uint32_t sQ = sQ0 + buf * kTile, sDO = sDO0 + buf * kTile;
    const float* lse_t = s_lse + buf * BR;
    const float* dl_t = s_dl + buf * BR;

    const unsigned vis =  // bit np: query group np sees some of this warp's keys
        kBand ? query_groups_visible<BR / 16, kDocs>(a, q0, k0 + warp * 16, kDocs ? doc_row[1] : 0) : ~0u;
    float st[BR / 8][4] = {}, dpt[BR / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      if constexpr (C::kKeepKV) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ka[i] = kf[kk][i], va[i] = vf[kk][i];
      } else {
        lds_a<D>(sK, warp * 16, kk, ka);
        lds_a<D>(sV, warp * 16, kk, va);
      }
#pragma unroll
      for (int np = 0; np < BR / 16; ++np) {
        if (!(vis >> np & 1u)) continue;
        uint32_t bq[4], bg[4];
        lds_b_nk<D>(sQ, np * 16, kk, bq);
        mma_bf16(st[2 * np], ka, bq[0], bq[1]);
        mma_bf16(st[2 * np + 1], ka, bq[2], bq[3]);
        lds_b_nk<D>(sDO, np * 16, kk, bg);
        mma_bf16(dpt[2 * np], va, bg[0], bg[1]);
        mma_bf16(dpt[2 * np + 1], va, bg[2], bg[3]);
      }
    }

    bool masked = tile_needs_mask(a, q0, BR, k0, BC);
    if constexpr (kDocs) masked |= __shfl_sync(0xffffffffu, doc_row[0], 0) <= min(q0 + BR - 1, a.T - 1);
#pragma unroll
    for (int nt = 0; nt < BR / 8; ++nt) {
      const int c = 8 * nt + 2 * tq;
      const float2 l2 = *reinterpret_cast<const float2*>(lse_t + c);
      const float2 d2 = *reinterpret_cast<const float2*>(dl_t + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fast_exp2(fmaf(st[nt][e], a.scale_log2, -((e & 1) ? l2.y : l2.x)));
        if (masked && !allowed(a, q0 + c + (e & 1), srow0 + 8 * (e >> 1))) p = 0.f;
        if constexpr (kDocs)
          if (masked && q0 + c + (e & 1) >= doc_row[e >> 1]) p = 0.f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - ((e & 1) ? d2.y : d2.x));  // dS^T (without the scale)
      }
    }

#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      if (!(vis >> kk & 1u)) continue;
      uint32_t pa[4], da[4];
      c_to_a(st[2 * kk], st[2 * kk + 1], pa);
      c_to_a(dpt[2 * kk], dpt[2 * kk + 1], da);
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t bg[4], bq[4];
        lds_b_kn<D>(sDO, kk, dd * 16, bg);
        mma_bf16(dv_acc[2 * dd], pa, bg[0], bg[1]);
        mma_bf16(dv_acc[2 * dd + 1], pa, bg[2], bg[3]);
        lds_b_kn<D>(sQ, kk, dd * 16, bq);
        mma_bf16(dk_acc[2 * dd], da, bq[0], bq[1]);
        mma_bf16(dk_acc[2 * dd + 1], da, bq[2], bq[3]);
      }
    }
  }

  bf16_t* dkb = dk + b * a.dk.b + hk * D;
  bf16_t* dvb = dv + b * a.dv.b + hk * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = srow0 + 8 * r;
    if (s >= a.T) continue;
    bf16_t* krow = dkb + int64_t{s} * a.dk.t + 2 * tq;
    bf16_t* vrow = dvb + int64_t{s} * a.dv.t + 2 * tq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(krow + dt * 8) =
          pack_bf16(dk_acc[dt][2 * r] * a.scale, dk_acc[dt][2 * r + 1] * a.scale);
      float v0 = dv_acc[dt][2 * r], v1 = dv_acc[dt][2 * r + 1];
      if (a.accumulate_dv) {
        const float2 old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vrow + dt * 8));
        v0 += old.x, v1 += old.y;
      }
      *reinterpret_cast<uint32_t*>(vrow + dt * 8) = pack_bf16(v0, v1);
    }
  }
}

template <int D>
void launch_bwd_bf16(const Ctx& ctx, const Args& a, int B, const Tensor& q, const Tensor& k, const Tensor& v,
                     const float* lse, const float* delta, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) {
  auto st = cuda::stream_of(ctx);
  {
    using C = DqCfg<D>;
    // As in the forward: only windowed attention and documents carry the per-warp group skipping.
    auto kernel = a.doc_start   ? dq_bf16_kernel<D, true, true>
                  : a.window > 0 ? dq_bf16_kernel<D, true, false>
                                 : dq_bf16_kernel<D, false, false>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    const dim3 grid(static_cast<unsigned>(B * a.H), static_cast<unsigned>(cdiv(a.T, C::BR)));
    kernel<<<grid, C::kThreads, C::kSmem, st>>>(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(),
                                                dout.data<bf16_t>(), lse, delta, dq.data<bf16_t>(), a);
    LINAC_CUDA_LAUNCH_CHECK();
  }
  {
    using C = DkvCfg<D>;
    auto kernel = a.doc_start   ? dkdv_bf16_kernel<D, true, true>
                  : a.window > 0 ? dkdv_bf16_kernel<D, true, false>
                                 : dkdv_bf16_kernel<D, false, false>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    const dim3 grid(static_cast<unsigned>(B * a.Hk), static_cast<unsigned>(cdiv(a.T, C::BC)));
    kernel<<<grid, C::kThreads, C::kSmem, st>>>(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(),
                                                dout.data<bf16_t>(), lse, delta, dk.data<bf16_t>(),
                                                dv.data<bf16_t>(), a);
    LINAC_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace
}  // namespace attn

void attention_bwd_cuda(const Ctx& ctx, const AttentionLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  LINAC_CHECK(attention_gpu_head_dim_ok(L.D),
              "attention (GPU): head dim must be a multiple of 16 from 64 to 128, got " + std::to_string(L.D));
  LINAC_CHECK(lse.dtype == DType::F32, "attention (GPU): lse must be f32");
  for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv})
    LINAC_CHECK(t->dtype == q.dtype, "attention (GPU): dtypes must agree");
  if (L.B * L.T * L.H == 0) return;
  const bool rope = L.rope.defined();
  const AttentionBwdWorkspace ws = attention_bwd_workspace(L.B, L.T, L.H, L.D, rope);
  LINAC_CHECK(ctx.workspace_bytes >= ws.bytes, "attention (GPU): workspace too small");
  const attn::Args a = attn::make_args(L);
  const int B = static_cast<int>(L.B), D = static_cast<int>(L.D);
  float* delta = static_cast<float*>(ctx.workspace);
  const int64_t rows = L.B * L.T * L.H;
  if (q.dtype == DType::BF16) {
    attn::check_bf16_rows(o, L.o, "o");
    attn::check_bf16_rows(dout, L.dout, "dout");
    const unsigned blocks = static_cast<unsigned>((rows * 8 + 255) / 256);
    attn::delta_bf16_kernel<<<blocks, 256, 0, cuda::stream_of(ctx)>>>(o.data<attn::bf16_t>(),
                                                                      dout.data<attn::bf16_t>(), delta, a, rows, D);
  } else {
    const unsigned blocks = static_cast<unsigned>((rows + attn::kDeltaWarps - 1) / attn::kDeltaWarps);
    attn::delta_f32_kernel<<<blocks, 32 * attn::kDeltaWarps, 0, cuda::stream_of(ctx)>>>(
        o.data<float>(), dout.data<float>(), delta, a, rows, D);
  }
  LINAC_CUDA_LAUNCH_CHECK();
  // dq and dk rotated back by -angle, where the kernels did not do it themselves.
  auto rope_pass = [&](bool dq_done, bool dk_done) {
    if (!rope) return;
    if (!dq_done) rope_bwd(ctx, dq, L.rope, 0, L.docs);
    if (!dk_done) rope_bwd(ctx, dk, L.rope, 0, L.docs);
  };
  if (q.dtype == DType::F32) {
    attn::bwd_f32(ctx, a, B, D, q.data<float>(), k.data<float>(), v.data<float>(), lse.data<float>(), delta,
                  dout.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>());
    return rope_pass(false, false);
  }
  attn::check_bf16_rows(q, L.q, "q");
  attn::check_bf16_rows(k, L.k, "k");
  attn::check_bf16_rows(v, L.v, "v");
  attn::check_bf16_rows(dq, L.dq, "dq");
  attn::check_bf16_rows(dk, L.dk, "dk");
  attn::check_bf16_rows(dv, L.dv, "dv");
#if LINAC_WITH_SM90A
  if (attn::use_sm90(L)) {
    const bool fused = rope && attention_bwd_fuses_rope(L.D);
    float* const table = fused ? reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + ws.rope_table) : nullptr;
    if (fused) rope_table_cuda(ctx, L.rope, L.D, L.T, table);
    attn::bwd_sm90(ctx, a, L, q, k, v, lse.data<float>(), delta, dout, dq, dk, dv, table);
    rope_pass(fused && attention_bwd_fuses_rope_dq(L.D), fused);
    return;
  }
#endif
  attn::with_head_dim(D, [&](auto d) {
    attn::launch_bwd_bf16<decltype(d)::value>(ctx, a, B, q, k, v, lse.data<float>(), delta, dout, dq, dk, dv);
  });
  rope_pass(false, false);
}

}  // namespace linac
