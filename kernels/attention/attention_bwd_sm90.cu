// CUDA attention backward for Hopper (math in attention.h): the two
// deterministic passes of attention_bwd.cu (no atomics, each gradient row
// summed by one warpgroup in a fixed order, so reruns are bit-identical) with
// wgmma on TMA-loaded tiles and a loading warpgroup ahead of the math
// warpgroups (attention_sm90.cuh). delta = rowsum(dO o) is computed before
// (attention_bwd.cu).
//   dq pass:   CTA = (batch*head, BR = 128 queries), math warpgroup w owns 64
//   of them; Q and dO
//              tiles stay in shared memory, K/V tiles of BC = 64 keys stream:
//              S = Q K^T, dP = dO V^T (A and B K-major in shared memory), P =
//              exp2(S scale log2e - lse log2e), dS = P (dP - delta) in
//              registers, dQ += dS K (A = dS from registers, B = K MN-major).
//   dkdv pass: CTA = (batch*head, BC = 128 keys), warpgroup w owns 64 keys; K
//   and V stay, Q/dO
//              tiles of BR = 64 queries stream with their lse and delta
//              (written to shared memory by the loading warp): S^T = K Q^T,
//              dP^T = V dO^T, P^T, dS^T, dV += P^T dO, dK += dS^T Q (dO and Q
//              MN-major).
// Layout: q/k/v/dout/dq/dk/dv [B,T,H,D] with free batch/token strides,
// lse/delta [B,H,T] f32.
#include "attention/attention_sm90.cuh"

namespace linac {
namespace attn {
namespace {

using namespace sm90k;

constexpr int kMathWGs = 2, kStages = 2;
constexpr int kThreads = 128 * (kMathWGs + 1);
using Regs = RegBudget<kMathWGs>;

// ---- dq pass
// ---------------------------------------------------------------------------------

template <int D>
struct DqSm90Cfg {
  static constexpr int BR = 64 * kMathWGs;  // queries per CTA
  static constexpr int BC = 64;             // keys per tile
  static constexpr uint32_t kRowsBytes = tile_bytes<BR, D>, kTileBytes = tile_bytes<BC, D>;
  // Q, dO, then K and V stages, then the barriers: Q/dO full, K/V full, stage
  // empty.
  static constexpr uint32_t kBarOffset = 2 * kRowsBytes + 2 * kStages * kTileBytes;
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (1 + 2 * kStages);
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    dq_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                   const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                   const float* __restrict__ lse, const float* __restrict__ delta, bf16_t* __restrict__ dq,
                   const Args a) {
  using C = DqSm90Cfg<D>;
  constexpr int BR = C::BR, BC = C::BC, S = kStages;
  extern __shared__ unsigned char smem[];
  const uint32_t sQ = smem_base_1024(smem), sDO = sQ + C::kRowsBytes, sK0 = sDO + C::kRowsBytes,
                 sV0 = sK0 + S * C::kTileBytes;
  const uint32_t bar_q = sQ + C::kBarOffset, bar_f0 = bar_q + 8, bar_e0 = bar_f0 + 8 * S;

  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int q0 = (cdiv(a.T, BR) - 1 - static_cast<int>(blockIdx.y)) * BR;  // longest causal rows first
  const int2 kr = key_blocks(a, q0, BR, BC);
  const int n_tiles = kr.y - kr.x + 1;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_f0 + 8 * s, 1);
      mbar_init(bar_e0 + 8 * s, 4 * kMathWGs);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<Regs::kLoad>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar_q, 2 * C::kRowsBytes);
      load_tile<BR, D>(sQ, &tm_q, bar_q, q0, h, b);
      load_tile<BR, D>(sDO, &tm_do, bar_q, q0, h, b);
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % S, t0 = (kr.x + it) * BC;
        if (it >= S) mbar_wait(bar_e0 + 8 * s, (it / S - 1) & 1);
        mbar_arrive_expect_tx(bar_f0 + 8 * s, 2 * C::kTileBytes);
        load_tile<BC, D>(sK0 + s * C::kTileBytes, &tm_k, bar_f0 + 8 * s, t0, h, b);
        load_tile<BC, D>(sV0 + s * C::kTileBytes, &tm_v, bar_f0 + 8 * s, t0, h, b);
      }
    }
  } else {
    regs_alloc<Regs::kMath>();
    const int w = wg - 1, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
    const int qw = q0 + 64 * w,
              row0 = qw + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
    const int2 kw = key_blocks(a, qw, 64, BC);
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tt = row0 + 8 * r;
      // Padding rows get P = 0 everywhere.
      lse2[r] = tt < a.T ? lse[int64_t{bh} * a.T + tt] * kLog2e : INFINITY;
      dl[r] = tt < a.T ? delta[int64_t{bh} * a.T + tt] : 0.f;
    }
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    mbar_wait(bar_q, 0);

    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % S, kb = kr.x + it, k0 = kb * BC;
      const uint32_t sK = sK0 + s * C::kTileBytes, sV = sV0 + s * C::kTileBytes;
      mbar_wait(bar_f0 + 8 * s, (it / S) & 1);
      if (kb >= kw.x && kb <= kw.y) {
        float sc[BC / 2], dp[BC / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<BC>::template ss<0>(sc, desc_k_major(sQ, BR, 64 * w, kk), desc_k_major(sK, BC, 0, kk), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<BC>::template ss<0>(dp, desc_k_major(sDO, BR, 64 * w, kk), desc_k_major(sV, BC, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sc);
        fence_regs(dp);

        const bool masked = k0 + BC > a.T || tile_needs_mask(a, qw, 64, k0, BC);
#pragma unroll
        for (int j = 0; j < BC / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, sk = k0 + 8 * j + 2 * tq + (e & 1);
            float p = fast_exp2(fmaf(sc[4 * j + e], a.scale_log2, -lse2[r]));
            if (masked && (sk >= a.T || !allowed(a, row0 + 8 * r, sk))) p = 0.f;
            sc[4 * j + e] = p * (dp[4 * j + e] - dl[r]);  // dS (without the scale)
          }
        uint32_t da[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) acc_to_a<BC>(sc, kk, da[kk]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) Wgmma<D>::template rs<1>(acc, da[kk], desc_mn_major(sK, BC, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_e0 + 8 * s);
    }
    const float scale[2] = {a.scale, a.scale};
    store_rows<D>(dq, a.dq, b, h, a.T, row0, acc, scale);
  }
}

// ---- dkdv pass
// -------------------------------------------------------------------------------

template <int D>
struct DkvSm90Cfg {
  static constexpr int BC = 64 * kMathWGs;  // keys per CTA
  static constexpr int BR = 64;             // queries per tile
  static constexpr uint32_t kRowsBytes = tile_bytes<BC, D>, kTileBytes = tile_bytes<BR, D>;
  // K, V, then Q and dO stages, lse and delta stages (f32), then the barriers:
  // K/V full, stage full, stage empty.
  static constexpr uint32_t kStatsOffset = 2 * kRowsBytes + 2 * kStages * kTileBytes;
  static constexpr uint32_t kBarOffset = kStatsOffset + 2 * kStages * BR * 4;
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (1 + 2 * kStages);
};

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                     const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                     const float* __restrict__ lse, const float* __restrict__ delta, bf16_t* __restrict__ dk,
                     bf16_t* __restrict__ dv, const Args a) {
  using C = DkvSm90Cfg<D>;
  constexpr int BR = C::BR, BC = C::BC, S = kStages;
  extern __shared__ unsigned char smem[];
  const uint32_t sK = smem_base_1024(smem), sV = sK + C::kRowsBytes, sQ0 = sV + C::kRowsBytes,
                 sDO0 = sQ0 + S * C::kTileBytes;
  // Per query of each stage: lse * log2(e), then delta.
  float* s_stats = reinterpret_cast<float*>(smem + (sK - smem_addr(smem)) + C::kStatsOffset);
  const uint32_t bar_kv = sK + C::kBarOffset, bar_f0 = bar_kv + 8, bar_e0 = bar_f0 + 8 * S;

  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int k0 = static_cast<int>(blockIdx.y) * BC;  // causal: low key blocks see the most queries; they go first
  const int2 qr = query_blocks(a, k0, BC, BR);
  const int n_tiles = qr.y - qr.x + 1;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_f0 + 8 * s, 32);  // the loading warp's lanes (their
                                      // lse/delta stores), one with the bytes
      mbar_init(bar_e0 + 8 * s, 4 * kMathWGs);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<Regs::kLoad>();
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
      if (lane == 0) {
        mbar_arrive_expect_tx(bar_kv, 2 * C::kRowsBytes);
        load_tile<BC, D>(sK, &tm_k, bar_kv, k0, h, b);
        load_tile<BC, D>(sV, &tm_v, bar_kv, k0, h, b);
      }
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % S, t0 = (qr.x + it) * BR;
        if (it >= S) mbar_wait(bar_e0 + 8 * s, (it / S - 1) & 1);
        float* st = s_stats + s * 2 * BR;
        for (int i = lane; i < BR; i += 32) {
          const int tt = t0 + i;
          // Padding queries get P = 0 everywhere.
          st[i] = tt < a.T ? lse[int64_t{bh} * a.T + tt] * kLog2e : INFINITY;
          st[BR + i] = tt < a.T ? delta[int64_t{bh} * a.T + tt] : 0.f;
        }
        if (lane == 0) {
          mbar_arrive_expect_tx(bar_f0 + 8 * s, 2 * C::kTileBytes);
          load_tile<BR, D>(sQ0 + s * C::kTileBytes, &tm_q, bar_f0 + 8 * s, t0, h, b);
          load_tile<BR, D>(sDO0 + s * C::kTileBytes, &tm_do, bar_f0 + 8 * s, t0, h, b);
        } else {
          mbar_arrive(bar_f0 + 8 * s);
        }
      }
    }
  } else {
    regs_alloc<Regs::kMath>();
    const int w = wg - 1, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
    const int kw0 = k0 + 64 * w,
              srow0 = kw0 + 16 * warp + g;  // this thread's keys: srow0 and srow0 + 8
    const int2 qw = query_blocks(a, kw0, 64, BR);
    float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk_acc[i] = 0.f, dv_acc[i] = 0.f;
    mbar_wait(bar_kv, 0);

    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % S, qb = qr.x + it, q0 = qb * BR;
      const uint32_t sQ = sQ0 + s * C::kTileBytes, sDO = sDO0 + s * C::kTileBytes;
      const float* lse_t = s_stats + s * 2 * BR;
      const float* dl_t = lse_t + BR;
      mbar_wait(bar_f0 + 8 * s, (it / S) & 1);
      if (qb >= qw.x && qb <= qw.y) {
        float st[BR / 2], dpt[BR / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<BR>::template ss<0>(st, desc_k_major(sK, BC, 64 * w, kk), desc_k_major(sQ, BR, 0, kk), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<BR>::template ss<0>(dpt, desc_k_major(sV, BC, 64 * w, kk), desc_k_major(sDO, BR, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(st);
        fence_regs(dpt);

        const bool masked = tile_needs_mask(a, q0, BR, kw0, 64);
#pragma unroll
        for (int j = 0; j < BR / 8; ++j) {
          const int c = 8 * j + 2 * tq;
          const float2 l2 = *reinterpret_cast<const float2*>(lse_t + c);
          const float2 d2 = *reinterpret_cast<const float2*>(dl_t + c);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = fast_exp2(fmaf(st[4 * j + e], a.scale_log2, -((e & 1) ? l2.y : l2.x)));
            if (masked && !allowed(a, q0 + c + (e & 1), srow0 + 8 * (e >> 1))) p = 0.f;
            st[4 * j + e] = p;
            dpt[4 * j + e] = p * (dpt[4 * j + e] - ((e & 1) ? d2.y : d2.x));  // dS^T (without the scale)
          }
        }
        uint32_t pa[BR / 16][4], da[BR / 16][4];
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
          acc_to_a<BR>(st, kk, pa[kk]);
          acc_to_a<BR>(dpt, kk, da[kk]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) Wgmma<D>::template rs<1>(dv_acc, pa[kk], desc_mn_major(sDO, BR, kk), 1);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) Wgmma<D>::template rs<1>(dk_acc, da[kk], desc_mn_major(sQ, BR, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dv_acc);
        fence_regs(dk_acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_e0 + 8 * s);
    }
    const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};
    store_rows<D>(dk, a.dk, b, h, a.T, srow0, dk_acc, scale);
    store_rows<D>(dv, a.dv, b, h, a.T, srow0, dv_acc, one);
  }
}

template <int D>
void launch_bwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
                     const Tensor& v, const float* lse, const float* delta, const Tensor& dout, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv) {
  auto st = cuda::stream_of(ctx);
  const unsigned bh = static_cast<unsigned>(L.B * a.H);
  {
    using C = DqSm90Cfg<D>;
    const CUtensorMap tm_q = rows_map(q, L, L.q, C::BR), tm_do = rows_map(dout, L, L.dout, C::BR),
                      tm_k = rows_map(k, L, L.k, C::BC), tm_v = rows_map(v, L, L.v, C::BC);
    auto kernel = dq_sm90_kernel<D>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    kernel<<<dim3(bh, static_cast<unsigned>(cdiv(a.T, C::BR))), kThreads, C::kSmem, st>>>(tm_q, tm_do, tm_k, tm_v, lse,
                                                                                          delta, dq.data<bf16_t>(), a);
    LINAC_CUDA_LAUNCH_CHECK();
  }
  {
    using C = DkvSm90Cfg<D>;
    const CUtensorMap tm_q = rows_map(q, L, L.q, C::BR), tm_do = rows_map(dout, L, L.dout, C::BR),
                      tm_k = rows_map(k, L, L.k, C::BC), tm_v = rows_map(v, L, L.v, C::BC);
    auto kernel = dkdv_sm90_kernel<D>;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    kernel<<<dim3(bh, static_cast<unsigned>(cdiv(a.T, C::BC))), kThreads, C::kSmem, st>>>(
        tm_q, tm_do, tm_k, tm_v, lse, delta, dk.data<bf16_t>(), dv.data<bf16_t>(), a);
    LINAC_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

void bwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
              const Tensor& v, const float* lse, const float* delta, const Tensor& dout, const Tensor& dq,
              const Tensor& dk, const Tensor& dv) {
  if (L.D == 64)
    launch_bwd_sm90<64>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv);
  else
    launch_bwd_sm90<128>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv);
}

}  // namespace attn
}  // namespace linac
