// CUDA attention backward for Hopper (math in attention.h), FlashAttention-3 style: one pass
// with wgmma on TMA-loaded tiles, a loading warpgroup ahead of two math warpgroups
// (attention_sm90.cuh). delta = rowsum(dO o) is computed before (attention_bwd.cu).
//
// CTA = (batch, key/value head hk, BC = 128 keys); math warpgroup w owns 64 of them. K and V stay
// in shared memory; the Q/dO tiles of BR = 64 queries stream with their lse and delta (written to
// shared memory by the loading warp) for each query head h of the group (h = hk * G .. hk * G + G -
// 1, G = H / Hk) in turn, and per head over the query blocks its keys reach: tile it of the CTA is
// head hk * G + it / n, query block (first) + it % n, n the query blocks per head (the same for
// every head: they depend on the row and the keys only). dK and dV accumulate over all of them, so
// they hold the sums over the group that attention.h asks for and leave once. Per tile:
//   S^T = K Q^T, dP^T = V dO^T        (SS, both K-major)
//   P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - delta)    in registers
//   dS^T -> shared memory (bf16, swizzled like a TMA tile)
//   dV += P^T dO (RS), dK += dS^T Q   (SS, A = the dS^T rows just written; dO and Q MN-major)
//   dQ_part = dS K                    (SS, A = dS^T read MN-major, B = K MN-major), over all 128
//                                     keys, by warpgroup (tile index % 2)
// dQ is deterministic without a second pass: the partials of the key blocks reaching a query
// block of a query head are summed in a fixed order, highest key block first, into an f32 tile of
// the workspace (one per (batch*head, query block): query heads, not key/value heads).
// A counter per tile says how many are in; a writer thread (the loading warpgroup's second warp)
// waits for its turn, then stores (the first) or reduce-adds (the others) the partial that the math
// warpgroup left in shared memory with one bulk copy, and raises the counter. For the last key
// block it loads the sum instead; the math warpgroup adds its partial and writes dq in bf16. A
// query block reached by one key block only is written directly.
// Why highest first: under a causal mask key block j has n_j = n_qb - 2j query blocks per head and
// meets query block i of the group's m-th head at its tile m n_j + i - 2j; block j + 1 got there
// 2m + 2 tiles earlier, so waits are rare.
// No deadlock whatever the GPU schedules: the partials a CTA (b, hk, kb) waits for come only from
// CTAs (b, hk, kb') with kb' > kb (query head h's dQ sums over the key blocks of its own key/value
// head). CTAs take (batch, key/value head, key block) from a ticket counter in launch order, highest
// key block first for every (batch, key/value head), so those took earlier tickets: they are
// resident (running) or done, and a resident CTA keeps its SM until it ends. By induction from the
// highest key block of each (batch, key/value head), which waits for nobody, every CTA finishes.
// Documents shorten both sides: a key block's query tiles end at its last key's document, a query
// block's key blocks (the dQ partials summed) start at its first query's; the two ranges name the
// same pairs (attention_common.cuh), so the counts above still match.
// Head dims 64 to 128 on tiles of DP = 64 or 128 columns (attention_sm90.cuh); the dQ tiles of the
// workspace are DP wide.
// Layout: q/dout/dq [B,T,H,D], k/v/dk/dv [B,T,Hk,D], free batch/token strides; lse/delta
// [B,H,T] f32.
#include <algorithm>
#include <type_traits>

#include "attention/attention_sm90.cuh"

namespace linac {
namespace attn {
namespace {

using namespace sm90k;

constexpr int kMathWGs = 2, kStages = 2;
constexpr int kThreads = 128 * (kMathWGs + 1);
using Regs = RegBudget<kMathWGs>;

template <int DP>
struct BwdSm90Cfg {
  static constexpr int BC = 64 * kMathWGs;                        // keys per CTA
  static constexpr int BR = static_cast<int>(kAttentionDqTile);  // queries per tile
  static constexpr uint32_t kRowsBytes = tile_bytes<BC, DP>, kTileBytes = tile_bytes<BR, DP>;
  static constexpr uint32_t kDsBytes = BC * BR * 2;  // dS^T [BC keys, BR queries] bf16, a swizzled tile
  static constexpr uint32_t kDqBytes = BR * DP * 4;   // a dQ tile, f32 in register order
  // dQ slots: tile it's partial goes to slot it % kDqSlots, so warpgroup w (the tiles with it % 2 =
  // w) has kDqSlots / 2 of them. Two each at D = 64 let a warpgroup leave a partial while the
  // writer still reads its previous one; D = 128 has room for one.
  static constexpr int kDqSlots = DP == 64 ? 4 : 2;
  // K, V, Q stages, dO stages, two dS^T buffers, the dQ slots, lse/delta stages (f32), then the
  // barriers: K/V full; per stage full, empty; per dS^T buffer bf (the tiles with it % 2 = bf)
  // full, free; per dQ slot ready (a partial written), free, loaded (the sum of the others).
  static constexpr uint32_t kDsOffset = 2 * kRowsBytes + 2 * kStages * kTileBytes;
  static constexpr uint32_t kDqOffset = kDsOffset + 2 * kDsBytes;
  static constexpr uint32_t kStatsOffset = kDqOffset + kDqSlots * kDqBytes;
  static constexpr uint32_t kBarOffset = kStatsOffset + 2 * kStages * BR * 4;
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (1 + 2 * kStages + 2 * 2 + 3 * kDqSlots);
};

// Phases of the barriers of up to 8 dQ slots as one word: per slot the parity of its use count
// (bit s) and whether it was used before (bit 8 + s).
struct SlotUses {
  uint32_t bits = 0;
  __device__ bool used(int s) const { return (bits >> (8 + s)) & 1; }
  __device__ uint32_t parity(int s) const { return (bits >> s) & 1; }        // of the uses so far
  __device__ uint32_t last_parity(int s) const { return parity(s) ^ 1; }    // of the latest use
  __device__ void bump(int s) { bits = (bits ^ (1u << s)) | (1u << (8 + s)); }
};

// A 64 x N f32 accumulator in shared memory in register order: thread t of the warpgroup keeps its
// four values of column block j at float4 (warp * N / 8 + j) * 32 + lane, so the warpgroup's
// 16-byte accesses are contiguous (no bank conflicts) and a bulk copy moves the tile as it is. A dQ
// tile is DP / 64 of these (64 x 64 each), one per column chunk.
template <int N>
__device__ __forceinline__ int acc_slot() {
  const int t = threadIdx.x & 127;
  return (t >> 5) * (N / 8) * 32 + (t & 31);
}
template <int N>
__device__ __forceinline__ void acc_store(float* tile, const float (&acc)[N / 2]) {
  float4* p = reinterpret_cast<float4*>(tile) + acc_slot<N>();
#pragma unroll
  for (int j = 0; j < N / 8; ++j) p[32 * j] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
}
template <int N>
__device__ __forceinline__ void acc_add(float (&acc)[N / 2], const float* tile) {
  const float4* p = reinterpret_cast<const float4*>(tile) + acc_slot<N>();
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const float4 v = p[32 * j];
    acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
  }
}

// kRope: dk (and at D = DP = 64 dq) leaves rotated back by its RoPE angles (rope_cs,
// store_rows_rope): a thread's dK accumulators hold both ends of each pair (columns c and c + D/2,
// for every head dim of the 128-column kernel: 80, 96, 112, 128); there dQ leaves in 64-column
// chunks, which split the pairs, so dq is rotated by a pass after the kernel. kDocs: document
// bounds (positions restart at each document).
template <int DP, bool kRope, bool kDocs>
__global__ void __launch_bounds__(kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                    const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                    const float* __restrict__ lse, const float* __restrict__ delta, bf16_t* __restrict__ dq,
                    bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, int* __restrict__ counters,
                    int* __restrict__ ticket, float* __restrict__ dq_acc, const float* __restrict__ rope_cs,
                    const Args a, const int n_bhk, const int group) {
  constexpr bool kRopeDq = kRope && DP == 64;  // rotating dq needs its whole head in one chunk
  using C = BwdSm90Cfg<DP>;
  constexpr int BR = C::BR, BC = C::BC, S = kStages;
  extern __shared__ unsigned char smem[];
  __shared__ int s_ticket;
  const uint32_t sK = smem_base_1024(smem), sV = sK + C::kRowsBytes, sQ0 = sV + C::kRowsBytes,
                 sDO0 = sQ0 + S * C::kTileBytes, sDS0 = sK + C::kDsOffset, sDQ0 = sK + C::kDqOffset;
  unsigned char* const base = smem + (sK - smem_u32(smem));
  // Per query of each stage: lse * log2(e), then delta.
  float* s_stats = reinterpret_cast<float*>(base + C::kStatsOffset);
  const uint32_t bar_kv = sK + C::kBarOffset, bar_f0 = bar_kv + 8, bar_e0 = bar_f0 + 8 * S, bar_dsf0 = bar_e0 + 8 * S,
                 bar_dse0 = bar_dsf0 + 16, bar_qr0 = bar_dse0 + 16, bar_qe0 = bar_qr0 + 8 * C::kDqSlots,
                 bar_ql0 = bar_qe0 + 8 * C::kDqSlots;

  const int n_kb = cdiv(a.T, BC), n_qb = cdiv(a.T, BR);
  if (threadIdx.x == 0) {
    s_ticket = atomicAdd(ticket, 1);
    mbar_init(bar_kv, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_f0 + 8 * s, 32);  // the loading warp's lanes (their lse/delta stores), one with the bytes
      mbar_init(bar_e0 + 8 * s, 4 * kMathWGs);
    }
    for (int bf = 0; bf < 2; ++bf) {
      mbar_init(bar_dsf0 + 8 * bf, 4 * kMathWGs);
      mbar_init(bar_dse0 + 8 * bf, 4);
    }
    for (int sl = 0; sl < C::kDqSlots; ++sl) {
      mbar_init(bar_qr0 + 8 * sl, 4);
      mbar_init(bar_qe0 + 8 * sl, 4);
      mbar_init(bar_ql0 + 8 * sl, 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  // Tickets in launch order, by groups of `group` (batch, key/value head)s: each at the highest key
  // block, then the next lower, so the CTAs a CTA waits for took earlier tickets and are running or
  // done. A group's dQ tiles stay open from its first CTA to its last: groups are sized to keep
  // them in L2.
  const GroupedTicket gt = grouped_ticket(s_ticket, n_bhk, n_kb, group);
  const int kb = gt.block, bhk = gt.unit, b = bhk / a.Hk, hk = bhk % a.Hk;
  const int heads = a.H / a.Hk;  // query heads of the group: hk * heads .. hk * heads + heads - 1
  const int k0 = kb * BC;
  const int2 qr = query_blocks<kDocs>(a, b, k0, BC, BR);
  const int head_tiles = qr.y - qr.x + 1, n_tiles = heads * head_tiles;
  // Tile it: query head hk * heads + it / head_tiles, query block qr.x + it % head_tiles.
  auto tile_at = [&](int it) {
    const int j = it / head_tiles;
    return make_int2(hk * heads + j, qr.x + it - j * head_tiles);
  };
  const int wg = warpgroup_index();

  if (wg == 0) {
    regs_dealloc<Regs::kLoad>();
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
      if (lane == 0) {
        mbar_arrive_expect_tx(bar_kv, 2 * C::kRowsBytes);
        load_tile<BC, DP>(sK, &tm_k, bar_kv, k0, hk, b);
        load_tile<BC, DP>(sV, &tm_v, bar_kv, k0, hk, b);
      }
      for (int it = 0; it < n_tiles; ++it) {
        const int2 tile = tile_at(it);
        const int s = it % S, h = tile.x, t0 = tile.y * BR;
        const int64_t stats = (int64_t{b} * a.H + h) * a.T;  // head h's row of lse and delta
        if (it >= S) mbar_wait(bar_e0 + 8 * s, (it / S - 1) & 1);
        float* st = s_stats + s * 2 * BR;
        for (int i = lane; i < BR; i += 32) {
          const int tt = t0 + i;
          // Padding queries get P = 0 everywhere.
          st[i] = tt < a.T ? lse[stats + tt] * kLog2e : INFINITY;
          st[BR + i] = tt < a.T ? delta[stats + tt] : 0.f;
        }
        if (lane == 0) {
          mbar_arrive_expect_tx(bar_f0 + 8 * s, 2 * C::kTileBytes);
          load_tile<BR, DP>(sQ0 + s * C::kTileBytes, &tm_q, bar_f0 + 8 * s, t0, h, b);
          load_tile<BR, DP>(sDO0 + s * C::kTileBytes, &tm_do, bar_f0 + 8 * s, t0, h, b);
        } else {
          mbar_arrive(bar_f0 + 8 * s);
        }
      }
    } else if (threadIdx.x == 32) {
      // The dQ writer: the partials of the key blocks reaching query block qb of head h go into its
      // f32 tile highest key block first (kr.y - kb of them before this one, counted by the tile's
      // counter).
      // The first stores, the others add; the last (kr.x) instead loads the sum for its math
      // warpgroup, which adds its own partial and writes dq. An add completes (and its count goes
      // up) while the math warpgroups produce the next partial.
      SlotUses uses, ready;  // ready: the partials taken from each slot
      int pending = -1;      // the tile (index below) whose add is in flight
      auto finish_pending = [&] {
        if (pending < 0) return;
        bulk_wait<0>();
        fence_proxy_async_global();
        counter_add_release(counters + pending, 1);
        pending = -1;
      };
      for (int it = 0; it < n_tiles; ++it) {
        const int2 tile = tile_at(it);
        const int sl = it % C::kDqSlots, qb = tile.y;
        const int2 kr = key_blocks<kDocs>(a, b, qb * BR, BR, BC);
        if (kr.x == kr.y) continue;  // one key block: the math warpgroup writes dq itself
        const uint32_t slot = sDQ0 + sl * C::kDqBytes;
        // The tile's counter and f32 accumulator, per (batch*head, query block) of the query heads.
        // An int index (at least 16 KiB of workspace per tile: fewer than 2^31 tiles), as a 64-bit
        // `pending` doubled the spills of the loading warpgroup's 24 registers (with documents).
        const int index = (b * a.H + tile.x) * n_qb + qb;
        int* const count = counters + index;
        float* const acc = dq_acc + int64_t{index} * BR * DP;
        if (kb == kr.x) {
          finish_pending();
          if (uses.used(sl)) mbar_wait(bar_qe0 + 8 * sl, uses.last_parity(sl));
          counter_wait(count, kr.y - kr.x);
          fence_proxy_async_global();
          mbar_arrive_expect_tx(bar_ql0 + 8 * sl, C::kDqBytes);
          bulk_load(slot, acc, C::kDqBytes, bar_ql0 + 8 * sl);
        } else {
          mbar_wait(bar_qr0 + 8 * sl, ready.parity(sl));
          ready.bump(sl);
          finish_pending();
          counter_wait(count, kr.y - kb);
          fence_proxy_async_global();
          if (kb == kr.y)
            bulk_store(acc, slot, C::kDqBytes);
          else
            bulk_reduce_add(acc, slot, C::kDqBytes);
          bulk_commit();
          bulk_wait_read<0>();
          mbar_arrive(bar_qe0 + 8 * sl, 4);
          pending = index;
        }
        uses.bump(sl);
      }
      finish_pending();
    }
  } else {
    regs_alloc<Regs::kMath>();
    const int w = wg - 1, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
    const int kw0 = k0 + 64 * w,
              srow0 = kw0 + 16 * warp + g;  // this thread's keys: srow0 and srow0 + 8
    const int2 qw = query_blocks<kDocs>(a, b, kw0, 64, BR);
    // Documents (rows are keys: the ends) of this thread's keys; per tile the warp takes that of
    // its first key from lane 0 (a tile with queries at or past it needs the mask). Row b's starts
    // give the RoPE positions.
    int doc_row[2] = {0, 0};
    if constexpr (kDocs) {
      doc_row[0] = doc_end_of(a, b, srow0);
      doc_row[1] = doc_end_of(a, b, srow0 + 8);
    }
    const int32_t* const rope_starts = kDocs ? a.doc_start + int64_t{b} * a.T : nullptr;
    float* const slots = reinterpret_cast<float*>(base + C::kDqOffset);
    float dk_acc[DP / 2], dv_acc[DP / 2];
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) dk_acc[i] = 0.f, dv_acc[i] = 0.f;
    SlotUses uses, loaded;  // of this warpgroup's dQ slots
    mbar_wait(bar_kv, 0);

    // dQ of tile itq from this key block, dS (dS^T read MN-major) times K (MN-major), one column
    // chunk of 64 at a time (registers). Warpgroup itq % 2 computes it one tile late, in the next
    // tile's iteration, when the other warpgroup's dS^T rows are long written (computed right after
    // the tile, it waited for them). dq_issue starts the matmul of chunk c, dq_finish takes the
    // result after wgmma_wait: written to dq (the only key block reaching the tile), added to the
    // sum of the others and written (the last), or left in the slot for the writer.
    auto dq_issue = [&](int itq, int c, float(&part)[32]) {
      const int bf = itq & 1;
      const uint32_t sDS = sDS0 + bf * C::kDsBytes;
      if (c == 0) mbar_wait(bar_dsf0 + 8 * bf, (itq >> 1) & 1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        Wgmma<64>::template ss<1, 1>(part, desc_mn_major(sDS, BC, kk), desc_mn_major(sK + c * BC * 128, BC, kk), kk);
      wgmma_commit();
    };
    auto dq_finish = [&](int itq, int c, float(&part)[32]) {
      const int2 tile = tile_at(itq);
      const int bf = itq & 1, h = tile.x, q0 = tile.y * BR;
      const int2 kr = key_blocks<kDocs>(a, b, q0, BR, BC);
      const bool single = kr.x == kr.y, last = kb == kr.x;
      const int sl = itq % C::kDqSlots;
      if (c == DP / 64 - 1) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_dse0 + 8 * bf);
      }
      if (c == 0 && !single) {
        if (last) {
          mbar_wait(bar_ql0 + 8 * sl, loaded.parity(sl));
          loaded.bump(sl);
        } else if (uses.used(sl)) {
          mbar_wait(bar_qe0 + 8 * sl, uses.last_parity(sl));
        }
      }
      float* const chunk = slots + sl * (C::kDqBytes / 4) + c * 64 * 64;
      if (single || last) {
        if (last && !single) acc_add<64>(part, chunk);
        const float scale[2] = {a.scale, a.scale};
        if constexpr (kRopeDq)
          store_rows_rope<64>(dq + h * a.D, a.dq, b, a.T, q0 + 16 * warp + g, part, scale, rope_cs, rope_starts);
        else
          store_rows<64>(dq + h * a.D + 64 * c, a.dq, b, a.T, q0 + 16 * warp + g, part, scale, a.D - 64 * c);
      } else {
        acc_store<64>(chunk, part);
      }
      if (c == DP / 64 - 1 && !single) {
        if (!last) fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) mbar_arrive(last ? bar_qe0 + 8 * sl : bar_qr0 + 8 * sl);
        uses.bump(sl);
      }
    };
    // At D = 64 the registers hold the dQ accumulators next to S^T and dP^T, so the dQ matmul of the
    // previous tile runs under this tile's softmax gradient, and dV goes with dK. At D = 128 the dQ
    // matmul runs after the dS^T store, and dV += P^T dO (all it needs is P) is issued before it,
    // running while dS^T goes to shared memory. (H200, T = 8192: issuing dV early made the D = 128
    // backward 5.44 ms instead of 5.99, the D = 64 one 4.11 instead of 3.52.)
    // All chunks of tile itq's dQ, one after the other.
    auto dq_tile = [&](int itq) {
      float part[32];
#pragma unroll
      for (int c = 0; c < DP / 64; ++c) {
        dq_issue(itq, c, part);
        wgmma_wait<0>();
        fence_regs(part);
        dq_finish(itq, c, part);
      }
    };
    constexpr bool kDqUnderSoftmax = DP == 64;
    auto dv_issue = [&](const uint32_t(&pa)[BR / 16][4], uint32_t sDO) {
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk) Wgmma<DP>::template rs<1>(dv_acc, pa[kk], desc_mn_major(sDO, BR, kk), 1);
    };

    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % S, bf = it & 1, qb = tile_at(it).y, q0 = qb * BR;
      const uint32_t sQ = sQ0 + s * C::kTileBytes, sDO = sDO0 + s * C::kTileBytes, sDS = sDS0 + bf * C::kDsBytes;
      const float* lse_t = s_stats + s * 2 * BR;
      const float* dl_t = lse_t + BR;
      const bool seen = qb >= qw.x && qb <= qw.y, dq_prev = it >= 1 && ((it - 1) & 1) == w;
      mbar_wait(bar_f0 + 8 * s, (it / S) & 1);
      uint32_t pa[BR / 16][4];
      float dst[BR / 2];  // dS^T
      float part[32];     // dQ of the previous tile (a 64-column chunk)
      if (seen) {
        float st[BR / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk)
          Wgmma<BR>::template ss<0, 0>(st, desc_k_major(sK, BC, 64 * w, kk), desc_k_major(sQ, BR, 0, kk), kk);
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk)
          Wgmma<BR>::template ss<0, 0>(dst, desc_k_major(sV, BC, 64 * w, kk), desc_k_major(sDO, BR, 0, kk), kk);
        wgmma_commit();
        if (kDqUnderSoftmax && dq_prev) {
          dq_issue(it - 1, 0, part);
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        fence_regs(st);
        fence_regs(dst);

        // Two copies of the loop, so that tiles off the diagonal/window edge carry no mask code; a
        // masked score becomes -inf (a select, no branch), so P = 0.
        auto p_ds = [&](auto masked) {
#pragma unroll
          for (int j = 0; j < BR / 8; ++j) {
            const int c = 8 * j + 2 * tq;
            const float2 l2 = *reinterpret_cast<const float2*>(lse_t + c);
            const float2 d2 = *reinterpret_cast<const float2*>(dl_t + c);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float x = st[4 * j + e];
              if constexpr (decltype(masked)::value) {
                const int tt = q0 + c + (e & 1);
                bool ok = allowed(a, tt, srow0 + 8 * (e >> 1));
                if constexpr (kDocs) ok &= tt < doc_row[e >> 1];
                x = ok ? x : -INFINITY;
              }
              const float p = fast_exp2(fmaf(x, a.scale_log2, -((e & 1) ? l2.y : l2.x)));
              st[4 * j + e] = p;
              dst[4 * j + e] = p * (dst[4 * j + e] - ((e & 1) ? d2.y : d2.x));  // dS^T (without the scale)
            }
          }
        };
        const int doc_first = kDocs ? __shfl_sync(0xffffffffu, doc_row[0], 0) : 0;
        if (tile_needs_mask(a, q0, BR, kw0, 64) || (kDocs && doc_first <= min(q0 + BR - 1, a.T - 1)))
          p_ds(std::true_type{});
        else
          p_ds(std::false_type{});
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) acc_to_a<BR>(st, kk, pa[kk]);
        if constexpr (!kDqUnderSoftmax) {
          wgmma_fence();
          dv_issue(pa, sDO);
          wgmma_commit();
        }
      } else if (kDqUnderSoftmax && dq_prev) {
        dq_issue(it - 1, 0, part);
      }
      if (kDqUnderSoftmax && dq_prev) {
        wgmma_wait<0>();
        fence_regs(part);
        dq_finish(it - 1, 0, part);
      }
      // dS^T to shared memory for the dQ matmul of warpgroup bf: rows are keys, 128-byte swizzled
      // rows of 64 queries (chunk j of row r at j ^ (r & 7)), as TMA would have written them.
      if (it >= 2) mbar_wait(bar_dse0 + 8 * bf, ((it >> 1) - 1) & 1);
      if (seen) {
        const uint32_t row = sDS + (64 * w + 16 * warp + g) * 128 + 4 * tq;
#pragma unroll
        for (int j = 0; j < BR / 8; ++j)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row + 8 * r * 128 + ((j ^ g) << 4)),
                         "r"(pack_bf16(dst[4 * j + 2 * r], dst[4 * j + 2 * r + 1]))
                         : "memory");
      } else {
        // Zeros where this warpgroup's keys do not see the tile: the dQ matmul runs over all 128.
        const uint32_t row = sDS + (64 * w + 16 * warp + g) * 128 + 16 * tq;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(row + 8 * (i & 1) * 128 + 64 * (i >> 1)),
                       "r"(0)
                       : "memory");
      }
      fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_dsf0 + 8 * bf);
      if (!kDqUnderSoftmax && dq_prev) dq_tile(it - 1);
      if (seen) {
        // dK's A operand is the warpgroup's dS^T rows just written (K-major): all four warps' rows.
        named_barrier_sync(1 + w, 128);
        wgmma_fence();
        if constexpr (kDqUnderSoftmax) dv_issue(pa, sDO);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk)
          Wgmma<DP>::template ss<0, 1>(dk_acc, desc_k_major(sDS, BC, 64 * w, kk), desc_mn_major(sQ, BR, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dv_acc);
        fence_regs(dk_acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_e0 + 8 * s);
    }
    if (((n_tiles - 1) & 1) == w) dq_tile(n_tiles - 1);  // the last tile's dQ
    const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};
    if constexpr (kRope) {
      auto rotated = [&](auto d) {
        store_rows_rope<DP, decltype(d)::value>(dk + hk * a.D, a.dk, b, a.T, srow0, dk_acc, scale, rope_cs,
                                                rope_starts);
      };
      if constexpr (DP == 64) {
        rotated(std::integral_constant<int, 64>{});
      } else {  // the pair distance must be known at compile time: the accumulators are registers
        if (a.D == 80)
          rotated(std::integral_constant<int, 80>{});
        else if (a.D == 96)
          rotated(std::integral_constant<int, 96>{});
        else if (a.D == 112)
          rotated(std::integral_constant<int, 112>{});
        else
          rotated(std::integral_constant<int, 128>{});
      }
    }
    else
      store_rows<DP>(dk + hk * a.D, a.dk, b, a.T, srow0, dk_acc, scale, a.D);
    store_rows<DP>(dv + hk * a.D, a.dv, b, a.T, srow0, dv_acc, one, a.D, a.accumulate_dv);
  }
}

template <int DP, bool kRope, bool kDocs>
void launch_bwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
                     const Tensor& v, const float* lse, const float* delta, const Tensor& dout, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv, const float* rope_cs) {
  using C = BwdSm90Cfg<DP>;
  auto st = cuda::stream_of(ctx);
  const unsigned n_bh = static_cast<unsigned>(L.B * a.H), n_bhk = static_cast<unsigned>(L.B * a.Hk),
                 n_qb = cdiv(a.T, C::BR), n_kb = cdiv(a.T, C::BC);
  const AttentionBwdWorkspace ws = attention_bwd_workspace(L.B, L.T, L.H, L.D);
  char* const wbase = static_cast<char*>(ctx.workspace);
  int* const counters = reinterpret_cast<int*>(wbase + ws.counters);
  float* const dq_acc = reinterpret_cast<float*>(wbase + ws.dq_acc);
  int* const ticket = counters + size_t{n_bh} * n_qb;
  // The tile counters and the launch ticket start at zero; the accumulator tiles need no clearing
  // (the first partial of each is stored, not added).
  LINAC_CUDA_CHECK(cudaMemsetAsync(counters, 0, (size_t{n_bh} * n_qb + 1) * sizeof(int), st));
  const CUtensorMap tm_q = rows_map(q, L, L.q, C::BR), tm_do = rows_map(dout, L, L.dout, C::BR),
                    tm_k = rows_map(k, L, L.k, C::BC), tm_v = rows_map(v, L, L.v, C::BC);
  // (batch, key/value head)s per ticket group: their open dQ tiles, n_qb for each of the H / Hk
  // query heads of each (H200, 16 heads x 64, T = 2048 / 8192 / 32768: one group of all 8-12%
  // slower).
  const int group = units_in_l2(int64_t{n_qb} * (a.H / a.Hk) * C::kDqBytes, n_bhk);
  auto kernel = bwd_sm90_kernel<DP, kRope, kDocs>;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  kernel<<<n_bhk * n_kb, kThreads, C::kSmem, st>>>(tm_q, tm_do, tm_k, tm_v, lse, delta, dq.data<bf16_t>(),
                                                   dk.data<bf16_t>(), dv.data<bf16_t>(), counters, ticket, dq_acc,
                                                   rope_cs, a, static_cast<int>(n_bhk), group);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

void bwd_sm90(const Ctx& ctx, const Args& a, const AttentionLayout& L, const Tensor& q, const Tensor& k,
              const Tensor& v, const float* lse, const float* delta, const Tensor& dout, const Tensor& dq,
              const Tensor& dk, const Tensor& dv, const float* rope_cs) {
  LINAC_CHECK(!rope_cs || attention_bwd_fuses_rope(L.D),
              "attention (GPU): the Hopper backward rotates RoPE gradients at head dims 64, 80, 96, 112, 128 only");
  auto launch = [&](auto docs) {
    constexpr bool kDocs = decltype(docs)::value;
    if (attention_sm90_tile_cols(a.D) == 64 && rope_cs)
      launch_bwd_sm90<64, true, kDocs>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv, rope_cs);
    else if (rope_cs)
      launch_bwd_sm90<128, true, kDocs>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv, rope_cs);
    else if (attention_sm90_tile_cols(a.D) == 64)
      launch_bwd_sm90<64, false, kDocs>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv, nullptr);
    else
      launch_bwd_sm90<128, false, kDocs>(ctx, a, L, q, k, v, lse, delta, dout, dq, dk, dv, nullptr);
  };
  if (a.doc_start)
    launch(std::true_type{});
  else
    launch(std::false_type{});
}

}  // namespace attn
}  // namespace linac
