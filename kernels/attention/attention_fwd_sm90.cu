// CUDA attention forward for Hopper (math in attention.h), FlashAttention-3
// style: wgmma on tiles that TMA brings into shared memory, a loading warpgroup
// ahead of the math warpgroups.
//
// bf16, head dims 64 to 128 on tiles of DP = 64 or 128 columns (attention_sm90.cuh).
// Work item = (batch*head, block of BR = 64 * kMathWGs queries); math warpgroup
// w owns queries q0 + 64w .. q0 + 64w + 63 (its Q rows stay in shared memory).
// Key blocks of BC = 128 stream through kStages stages of K and V tiles of
// key/value head h / (H / Hk) (grouped-query attention). Per key block and warpgroup:
//   S = Q K^T       wgmma, A = Q and B = K from shared memory (both K-major)
//   online softmax on the S accumulators (f32, exp2 with the scale folded in),
//   P rounded to bf16
//   O += P V        wgmma, A = P from registers, B = V (MN-major) from shared
//                   memory
// Only lse = m * scale + log l is stored (f32). Key blocks the causal/window/
// document mask leaves empty are never loaded (with documents an item starts at
// its first query's document); a warpgroup skips the matmuls of a block none of
// its rows sees; the element mask runs only on blocks that straddle its edge, a
// document start or the key tail. Short items (T <= 2048 or a window) run on a
// persistent grid: one CTA per SM taking items from a ticket counter in
// ctx.workspace, with two Q buffers, so the next item's Q and K/V arrive while
// the math warpgroups finish the current one. Items run in groups of
// (batch*head)s whose K and V fit in about 8 MiB of L2, within a group the
// longest first and (batch*head) fastest: the CTAs running at once read each
// K/V tile from DRAM once, and the query heads of one key/value group are
// adjacent items of the same query block. (Over all (batch*head)s at once, as before 2026-12-06, every
// item read its K/V from DRAM: H100, 16 heads x 128, T = 2048, DRAM at 87% of
// its bandwidth, 2.5 GB moved where q, k, v and o are 0.54 GB.)
// Layout: q/o [B,T,H,D], k/v [B,T,Hk,D], free batch/token strides (multiples of
// 8), lse [B,H,T] f32.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "attention/attention_sm90.cuh"

namespace linac {
namespace attn {
namespace {

using namespace sm90k;

template <int DP, int WGS, bool kPersistent>
struct FwdSm90Cfg {
  static constexpr int kMathWGs = WGS;
  static constexpr int kThreads = 128 * (kMathWGs + 1);
  static constexpr int BR = 64 * kMathWGs;  // queries per work item
  static constexpr int BC = 128;            // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kQBufs = kPersistent ? 2 : 1;
  static constexpr uint32_t kQBytes = tile_bytes<BR, DP>, kTileBytes = tile_bytes<BC, DP>;
  // Q buffers, K and V stages, then the barriers: Q full and Q empty per buffer (two slots each),
  // K full, V full, stage empty.
  static constexpr uint32_t kBarOffset = kQBufs * kQBytes + 2 * kStages * kTileBytes;
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (4 + 3 * kStages);
};

// Work item i: (batch*head, query block), in grouped_ticket's order (the last query blocks, the
// longest causal rows, first within a group).
struct FwdItem {
  int bh, q0;
};
__device__ __forceinline__ FwdItem fwd_item(int i, int n_bh, int n_qb, int BR, int group) {
  const GroupedTicket g = grouped_ticket(i, n_bh, n_qb, group);
  return {g.unit, g.block * BR};
}

template <int DP, int WGS, bool kPersistent, bool kDocs>
__global__ void __launch_bounds__(FwdSm90Cfg<DP, WGS, kPersistent>::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, bf16_t* __restrict__ o, float* __restrict__ lse,
                    const Args a, const int n_bh, const int group, int* __restrict__ ticket) {
  // kPersistent: items from the ticket counter; otherwise one item per CTA, blockIdx.x, compiled
  // without the item loop and with one Q buffer. kDocs: document bounds.
  using C = FwdSm90Cfg<DP, WGS, kPersistent>;
  constexpr int kItemsPerCta = kPersistent ? INT_MAX : 1;
  constexpr int BR = C::BR, BC = C::BC, S = C::kStages;
  extern __shared__ unsigned char smem[];
  __shared__ int s_item[2];  // the item whose Q is in buffer j, -1: no more
  const uint32_t sQ0 = smem_base_1024(smem), sK0 = sQ0 + C::kQBufs * C::kQBytes, sV0 = sK0 + S * C::kTileBytes;
  const uint32_t bar_q0 = sQ0 + C::kBarOffset, bar_qe0 = bar_q0 + 16, bar_k0 = bar_qe0 + 16, bar_v0 = bar_k0 + 8 * S,
                 bar_e0 = bar_v0 + 8 * S;
  const int n_qb = cdiv(a.T, BR), n_items = n_bh * n_qb;
  const int wg = warpgroup_index();  // 0 loads, 1.. compute

  if (threadIdx.x == 0) {
    for (int j = 0; j < 2; ++j) {
      mbar_init(bar_q0 + 8 * j, 1);
      mbar_init(bar_qe0 + 8 * j, 4 * C::kMathWGs);
    }
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_k0 + 8 * s, 1);
      mbar_init(bar_v0 + 8 * s, 1);
      mbar_init(bar_e0 + 8 * s, 4 * C::kMathWGs);  // one arrival per math warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Persistent (short items), one CTA per SM: the loading warp takes the next item from a ticket
  // counter (the longest first, so the last ones to finish are short) and fetches its Q and first
  // K/V tiles while the math warpgroups finish the current one. Tiles are counted across items
  // (gt) for the stage phases.
  if (wg == 0) {
    regs_dealloc<RegBudget<C::kMathWGs>::kLoad>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_q);
      prefetch_tensor_map(&tm_k);
      prefetch_tensor_map(&tm_v);
      int gt = 0;
      for (int n = 0; n < kItemsPerCta; ++n) {
        const int idx = kPersistent ? atomicAdd(ticket, 1) : static_cast<int>(blockIdx.x);
        const uint32_t qb = n & 1;
        if (n >= 2) mbar_wait(bar_qe0 + 8 * qb, ((n >> 1) - 1) & 1);
        if (idx >= n_items) {
          s_item[qb] = -1;
          mbar_arrive(bar_q0 + 8 * qb);
          break;
        }
        s_item[qb] = idx;
        const FwdItem item = fwd_item(idx, n_bh, n_qb, BR, group);
        const int b = item.bh / a.H, h = item.bh % a.H, hk = h / (a.H / a.Hk);
        mbar_arrive_expect_tx(bar_q0 + 8 * qb, C::kQBytes);
        load_tile<BR, DP>(sQ0 + qb * C::kQBytes, &tm_q, bar_q0 + 8 * qb, item.q0, h, b);
        const int2 kr = key_blocks<kDocs>(a, b, item.q0, BR, BC);
        for (int kb = kr.x; kb <= kr.y; ++kb, ++gt) {
          const int s = gt % S;
          if (gt >= S) mbar_wait(bar_e0 + 8 * s, (gt / S - 1) & 1);
          mbar_arrive_expect_tx(bar_k0 + 8 * s, C::kTileBytes);
          load_tile<BC, DP>(sK0 + s * C::kTileBytes, &tm_k, bar_k0 + 8 * s, kb * BC, hk, b);
          mbar_arrive_expect_tx(bar_v0 + 8 * s, C::kTileBytes);
          load_tile<BC, DP>(sV0 + s * C::kTileBytes, &tm_v, bar_v0 + 8 * s, kb * BC, hk, b);
        }
      }
    }
  } else {
    regs_alloc<RegBudget<C::kMathWGs>::kMath>();
    const int w = wg - 1, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
    int gt = 0;
    for (int n = 0; n < kItemsPerCta; ++n) {
      const uint32_t qb = n & 1, sQ = sQ0 + qb * C::kQBytes;
      mbar_wait(bar_q0 + 8 * qb, (n >> 1) & 1);
      const int idx = kPersistent ? *static_cast<volatile int*>(&s_item[qb]) : static_cast<int>(blockIdx.x);
      if (idx < 0) break;
      const FwdItem item = fwd_item(idx, n_bh, n_qb, BR, group);
      const int b = item.bh / a.H, h = item.bh % a.H;
      const int2 kr = key_blocks<kDocs>(a, b, item.q0, BR, BC);
      const int qw = item.q0 + 64 * w;               // this warpgroup's first query
      const int row0 = qw + 16 * warp + g;           // this thread's rows: row0 and row0 + 8
      const int2 kw = key_blocks<kDocs>(a, b, qw, 64, BC);  // the key blocks its rows see
      // Documents: the starts of the warpgroup's last row (a block with keys before it needs the
      // mask) and of this thread's rows.
      int doc_last = 0, doc_row[2] = {0, 0};
      if constexpr (kDocs) {
        doc_last = doc_start_of(a, b, qw + 63);
        doc_row[0] = doc_start_of(a, b, row0);
        doc_row[1] = doc_start_of(a, b, row0 + 8);
      }
      float acc[DP / 2];
#pragma unroll
      for (int i = 0; i < DP / 2; ++i) acc[i] = 0.f;
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

      for (int kb = kr.x; kb <= kr.y; ++kb, ++gt) {
        const int s = gt % S, k0 = kb * BC;
        const uint32_t phase = (gt / S) & 1, sK = sK0 + s * C::kTileBytes, sV = sV0 + s * C::kTileBytes;
        mbar_wait(bar_k0 + 8 * s, phase);
        mbar_wait(bar_v0 + 8 * s, phase);
        if (kb >= kw.x && kb <= kw.y) {
          float sc[BC / 2];
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < DP / 16; ++kk)
            Wgmma<BC>::template ss<0, 0>(sc, desc_k_major(sQ, BR, 64 * w, kk), desc_k_major(sK, BC, 0, kk), kk);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(sc);

          if (k0 + BC > a.T || tile_needs_mask(a, qw, 64, k0, BC) || (kDocs && doc_last > k0)) {
#pragma unroll
            for (int j = 0; j < BC / 8; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int tt = row0 + 8 * (e >> 1), sk = k0 + 8 * j + 2 * tq + (e & 1);
                bool ok = (sk < a.T) & allowed(a, tt, sk);
                if constexpr (kDocs) ok &= sk >= doc_row[e >> 1];
                sc[4 * j + e] = ok ? sc[4 * j + e] : -INFINITY;
              }
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float mx = m[r];
#pragma unroll
            for (int j = 0; j < BC / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * r], sc[4 * j + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // A row whose keys so far are all masked keeps m = -inf; exp2 against
            // 0 then gives P = 0.
            const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
            const float alpha = fast_exp2(m[r] * a.scale_log2 - base);
            m[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < BC / 8; ++j) {
              sc[4 * j + 2 * r] = fast_exp2(fmaf(sc[4 * j + 2 * r], a.scale_log2, -base));
              sc[4 * j + 2 * r + 1] = fast_exp2(fmaf(sc[4 * j + 2 * r + 1], a.scale_log2, -base));
              sum += sc[4 * j + 2 * r] + sc[4 * j + 2 * r + 1];
            }
            l[r] = l[r] * alpha + sum;
#pragma unroll
            for (int j = 0; j < DP / 8; ++j) {
              acc[4 * j + 2 * r] *= alpha;
              acc[4 * j + 2 * r + 1] *= alpha;
            }
          }

          uint32_t pa[BC / 16][4];
#pragma unroll
          for (int kk = 0; kk < BC / 16; ++kk) acc_to_a<BC>(sc, kk, pa[kk]);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BC / 16; ++kk) Wgmma<DP>::template rs<1>(acc, pa[kk], desc_mn_major(sV, BC, kk), 1);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(acc);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_e0 + 8 * s);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_qe0 + 8 * qb);  // Q read for the last time

      float inv[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        inv[r] = 1.f / sum;
        const int tt = row0 + 8 * r;
        if (tq == 0 && tt < a.T) lse[int64_t{item.bh} * a.T + tt] = m[r] * a.scale + logf(sum);
      }
      store_rows<DP>(o + h * a.D, a.o, b, a.T, row0, acc, inv, a.D);
    }
  }
}

template <int DP, int WGS, bool kPersistent, bool kDocs>
void launch_fwd_sm90_grid(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& lse, int n_bh, unsigned grid, int* ticket) {
  using C = FwdSm90Cfg<DP, WGS, kPersistent>;
  const int group = units_in_l2(int64_t{a.T} * 2 * C::kTileBytes / C::BC, n_bh);  // a head's K and V
  const CUtensorMap tm_q = rows_map(q, L, L.q, C::BR), tm_k = rows_map(k, L, L.k, C::BC),
                    tm_v = rows_map(v, L, L.v, C::BC);
  auto kernel = fwd_sm90_kernel<DP, WGS, kPersistent, kDocs>;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  kernel<<<grid, C::kThreads, C::kSmem, cuda::stream_of(ctx)>>>(tm_q, tm_k, tm_v, o.data<bf16_t>(), lse.data<float>(),
                                                                a, n_bh, group, ticket);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <int DP, int WGS>
void launch_fwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& o, const Tensor& lse) {
  constexpr int BR = FwdSm90Cfg<DP, WGS, true>::BR, BC = FwdSm90Cfg<DP, WGS, true>::BC;
  const int n_bh = static_cast<int>(L.B * a.H);
  const int64_t n_items = int64_t{n_bh} * cdiv(a.T, BR);
  // Items of up to 16 key tiles (T <= 2048, or a window) run on a persistent grid, which hides
  // each item's start (H200, 16 heads x 64: 0.469 against 0.484 ms at T = 2048, 0.229 against 0.29
  // with a window of 64); longer ones one CTA each (persistent: 1.32 against 1.25 ms at T = 8192,
  // 4.9 against 4.3 at 32768; 4096 not measured). Documents only shorten items (bounds on the
  // device, unknown here), so the choice stays the one without them.
  const int max_tiles = a.window > 0 ? std::min(cdiv(a.T, BC), cdiv(a.window + BR, BC) + 1) : cdiv(a.T, BC);
  auto launch = [&](auto docs) {
    constexpr bool kDocs = decltype(docs)::value;
    if (max_tiles <= 16) {
      LINAC_CHECK(ctx.workspace_bytes >= sizeof(int), "attention forward (GPU): needs 4 bytes of workspace");
      int* ticket = static_cast<int*>(ctx.workspace);
      LINAC_CUDA_CHECK(cudaMemsetAsync(ticket, 0, sizeof(int), cuda::stream_of(ctx)));
      const auto grid = static_cast<unsigned>(std::min<int64_t>(n_items, gpu_sm_count()));
      launch_fwd_sm90_grid<DP, WGS, true, kDocs>(ctx, a, L, q, k, v, o, lse, n_bh, grid, ticket);
    } else {
      launch_fwd_sm90_grid<DP, WGS, false, kDocs>(ctx, a, L, q, k, v, o, lse, n_bh, static_cast<unsigned>(n_items),
                                                 nullptr);
    }
  };
  if (a.doc_start)
    launch(std::true_type{});
  else
    launch(std::false_type{});
}

}  // namespace

void fwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& o, const Tensor& lse) {
  // Three math warpgroups at D = 64 (0.48 ms against 0.57 with two at T = 2048, H200); 128-column
  // tiles need two to fit their registers.
  if (attention_sm90_tile_cols(a.D) == 64)
    launch_fwd_sm90<64, 3>(ctx, a, L, q, k, v, o, lse);
  else
    launch_fwd_sm90<128, 2>(ctx, a, L, q, k, v, o, lse);
}

}  // namespace attn
}  // namespace linac
