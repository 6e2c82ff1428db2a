// Fused Taylor attention: the state scan and the per-chunk products in one kernel, so the per-chunk
// states never leave the SM (math in taylor_attn.h; feature order and padding in
// taylor_attn_common.cuh). Built for bf16, F = 16 and Dv <= 64; other calls run the prep + scan +
// chunk launches of taylor_attn_fwd.cu and taylor_attn_bwd.cu. One pass over the
// sequence per mode (the chunk kernel's modes, taylor_attn_common.cuh):
//   kOut    forward, chunks in order, state S_n = sum over earlier chunks of phi(K^)^T V~:
//           o~ = phi(Q^) S_n + tril(kappa(Q^ K^^T)) V~, o = o~ / den, den = o~[Dv] + eps.
//   kGradQ  backward sweep 1, the same state: dq from G~ S_n^T through the feature map plus
//           (tril(G~ V~^T) * (1 + Q^ K^^T)) K^.
//   kGradK  backward sweep 2, chunks in reverse, state R_n = sum over later chunks of phi(Q^)^T G~:
//           dk from V~ R_n^T through the feature map plus (triu(V~ G~^T) * (1 + K^ Q^^T)) Q^, and
//           dv = phi(K^) R_n + triu(kappa(K^ Q^^T)) G~.
// g~ = [dout/den, -(dout . o)/den, 0..] comes chunk-major from the prep kernel (rows past T zero).
//
// Grid (P, segments of kSegChunks chunks), one CTA of 9 warps per (pair, segment):
//   warps 0..3   (output, one warpgroup) each own 16 rows of the chunk (queries; keys in kGradK):
//                the intra-chunk terms (mma.sync), then one walk over the state's 18 feature blocks
//                per product. kWg = false (any sm_80+ GPU): mma.sync, phi of the rows built into A
//                fragments, the next block's state fragments loaded while the current block
//                multiplies. kWg = true (sm_90a, taylor_attn_fused_sm90.cu): the same products as
//                warpgroup wgmmas reading the state straight from shared memory, phi(X) (or Y) from
//                registers, so a block's products run while the warps build the next block's phi
//                or contract the last block's dL/dphi.
//   warps 4..8   (state) each hold two of the ten 16-row tiles of the f32 state (288 x DvP) in
//                mma accumulators: the state's quadratic rows come in equal pairs (16 f + j and
//                16 j + f hold the same product), so the tiles sum each distinct row once
//                (taylor_attn_state_tiles.h). Per chunk: store its bf16 copy, the exclusive
//                state, into shared memory, each row to both its places; then add phi(X)^T Y for
//                the chunk (X, Y = K^, V~, or Q^, G~ in kGradK), phi(X)^T built straight into mma
//                A fragments.
// The state is double-buffered and q, k, v (and g~) come through a 3-stage cp.async ring straight
// from the strided inputs (v~'s "1" column written beside them), so a chunk costs one barrier. The
// products and sums run in the order of the scan + chunk kernels, so with one segment (T <= 2048)
// the mma.sync walks give those kernels' bits (a GPU test demands it). With several segments the
// totals kernel (taylor_attn_totals.cu, the state warps' update alone) first writes each segment's
// sum to the carry buffer, the carry kernel turns the sums into the segments' starting states (and
// the forward's final state), and this kernel starts each segment's accumulators from its carry.
// The wgmma walks sum each product's k-steps inside the tensor core in an order of its own, so their
// bits differ from the mma.sync walks' (by rounding; GPU tests compare both to the references).
// Documents (kDocs; the math in taylor_attn.h): the chunk's starts ride in the stage beside its
// rows; the state warps restart at a chunk in which a document starts and add only the rows the
// next state holds (taylor_attn_state.cuh), the output warps mask the intra-chunk pairs by document
// and weigh each row's inter-chunk term by whether its document is the one the state holds (the
// chunk kernel's masks, so at one segment the mma.sync walks give its bits here too).
#pragma once

#include <type_traits>

#include "common/sm90.cuh"
#include "taylor_attn/taylor_attn_state.cuh"

namespace linac::taylor_cuda::fused {

using linac::cuda::pack_bf16;
using linac::cuda::to_float;
using sm80::ldsm_a_mk;
using sm80::ldsm_b_kn;
using sm80::ldsm_b_nk;
using sm80::mma_bf16;
using sm80::smem_u32;

constexpr int kStateWarps = taylor_tiles::kTiles / 2, kOutWarps = kC / 16, kThreads = 32 * (kStateWarps + kOutWarps);
constexpr int kStages = 3;
constexpr int kNT = kNTSmall;  // value n-tiles: DvP <= 80
constexpr int kKV = kNT / 2;   // value k-steps / n-tile pairs

// Shared memory: the stages (q, k, v~ and, in the gradient modes, g~; with documents the chunk's
// starts), the state's two buffers, the output warps' masked intra matrices and (gradient modes)
// their f32 dx rows and intra dx terms.
// A state buffer is row-major (rows of ldv) for the mma.sync walks; for wgmma it is 8 x 8 core
// matrices of 128 bytes, kNT to a band of 8 feature rows (s_at), which wgmma reads both ways: with
// the features as k (phi(X) S) and as n (Y S^T).
template <bool kG, bool kWg, bool kDocs>
struct Smem {
  static constexpr int ldx = ld_of<bf16_t>(kF), ldv = ld_of<bf16_t>(8 * kNT), ldm = ld_of<bf16_t>(kC), ldf = kF + 4;
  static constexpr int q = 0, k = q + kC * ldx * 2, v = k + kC * ldx * 2, g = v + kC * ldv * 2;
  static constexpr int st = g + (kG ? kC * ldv * 2 : 0), stage = st + (kDocs ? kC * 4 : 0);
  static constexpr int s = kStages * stage, s_bytes = kRows * (kWg ? 8 * kNT : ldv) * 2;
  static constexpr int core = 128, band = kNT * core;  // wgmma layout: a core matrix, 8 feature rows
  static __device__ __forceinline__ int s_at(int r, int c) {
    if constexpr (kWg)
      return ((r >> 3) * kNT + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
    else
      return r * ldv + c;
  }
  static constexpr int m = s + 2 * s_bytes, dx = m + kC * ldm * 2, dxi = dx + (kG ? kC * ldf * 4 : 0);
  static constexpr int bytes = dxi + (kG ? kC * ldf * 4 : 0);
};

template <int kMode, bool kWg, bool kDocs>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(Args a, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                 const bf16_t* __restrict__ gt, float* __restrict__ carry, bf16_t* __restrict__ out,
                 float* __restrict__ den, float* __restrict__ s_final, bf16_t* __restrict__ dx) {
  constexpr bool kRev = kMode == kGradK, kG = kMode != kOut;
  constexpr bool kHasOut = kMode != kGradQ, kHasGrad = kMode != kOut;
  extern __shared__ __align__(16) unsigned char smem[];
  using L = Smem<kG, kWg, kDocs>;
  const int pl = blockIdx.x, seg = blockIdx.y, pair = a.p0 + pl, b = pair / a.H, h = pair % a.H;
  const int tid = threadIdx.x, warp = tid >> 5, Dv = a.Dv, DvP = a.DvP, ntv = DvP / 8;
  const int c0 = seg * kSegChunks, N = min(kSegChunks, a.N - c0);
  const Frag f;
  auto chunk = [&](int step) { return c0 + (kRev ? N - 1 - step : step); };
  auto tile = [&](int s, int off) { return reinterpret_cast<bf16_t*>(smem + s * L::stage + off); };
  // kDocs: the document start of each token of the stage's chunk (rows past T: the last row's).
  auto starts = [&](int s) { return reinterpret_cast<int*>(smem + s * L::stage + L::st); };
  const int32_t* row_start = kDocs ? a.doc_start + static_cast<int64_t>(b) * a.T : nullptr;
  auto state_buf = [&](int step) { return reinterpret_cast<bf16_t*>(smem + L::s + (step & 1) * L::s_bytes); };
  auto barrier = [] { sm90::named_barrier_sync(1, kThreads); };

  // v~'s padding columns Dv + 1 .. 8 kNT - 1 and g~'s DvP .. 8 kNT - 1 stay zero in every stage.
  // Column Dv is issue()'s alone: a zero written here by another thread before the first barrier
  // could land after its 1.
  const int vpad = 8 * kNT - 1 - Dv;
  for (int idx = tid; idx < kStages * kC * vpad; idx += kThreads)
    tile(idx / (kC * vpad), L::v)[(idx / vpad) % kC * L::ldv + Dv + 1 + idx % vpad] = bf16_t(0.f);
  if constexpr (kG) {
    const int gpad = 8 * kNT - DvP;
    for (int idx = tid; idx < kStages * kC * gpad; idx += kThreads)
      tile(idx / (kC * gpad), L::g)[(idx / gpad) % kC * L::ldv + DvP + idx % gpad] = bf16_t(0.f);
  }
  // Chunk `step` of the segment into stage step % kStages: q and k rows are two 16-byte pieces, v
  // rows Dv / 8, g~ rows DvP / 8 (dense in the workspace, zero past T), document starts one 4-byte
  // piece each (kDocs); q, k, v rows past T read as zero (v~'s "1" too). A group per step, empty
  // past the end. The pieces are one index space of fixed spans (q, k, then v rows of 8 pieces, g~
  // rows of kNT, those past a row's data skipped, and the starts):
  // each span a whole number of warps and every division by a constant, so a warp takes one branch
  // and a piece costs a few instructions (a division by a per-call piece count and a four-way
  // branch inside warps cost several times that: NOTES.md).
  auto issue = [&](int step) {
    if (step < N) {
      constexpr int kQEnd = 2 * kC, kKEnd = kQEnd + 2 * kC, kVEnd = kKEnd + 8 * kC, kGEnd = kVEnd + (kG ? kNT * kC : 0);
      constexpr int kEnd = kGEnd + (kDocs ? kC : 0);
      static_assert(kQEnd % 32 == 0 && kKEnd % 32 == 0 && kVEnd % 32 == 0 && kGEnd % 32 == 0, "spans of whole warps");
      const int s = step % kStages, nv = Dv / 8, ng = DvP / 8;
      const int64_t t0 = static_cast<int64_t>(chunk(step)) * kC;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));
      // A row's source (rows past T: the row's base, not read), from the kernel's parameters.
      auto src = [&](const bf16_t* x, const TaylorAttnLayout::Strides& st, int col0, int r, int c) {
        return x + b * st.b + (t0 + (r < rows ? r : 0)) * st.t + col0 + c;
      };
      for (int idx = tid; idx < kEnd; idx += kThreads) {
        if (idx < kKEnd) {
          const bool is_q = idx < kQEnd;
          const int i = is_q ? idx : idx - kQEnd, r = i >> 1, c = 8 * (i & 1);
          cp_async16(tile(s, is_q ? L::q : L::k) + r * L::ldx + c,
                     is_q ? src(q, a.q, h * kF, r, c) : src(k, a.k, h * kF, r, c), r < rows);
        } else if (idx < kVEnd) {
          const int i = idx - kKEnd, r = i >> 3, c = 8 * (i & 7);
          if (c < 8 * nv) cp_async16(tile(s, L::v) + r * L::ldv + c, src(v, a.v, h * Dv, r, c), r < rows);
        } else if (!kDocs || idx < kGEnd) {
          const int i = idx - kVEnd, r = i / kNT, c = 8 * (i % kNT);
          if (c < 8 * ng)
            cp_async16(tile(s, L::g) + r * L::ldv + c, gt + (static_cast<int64_t>(pl) * a.N * kC + t0 + r) * DvP + c,
                       true);
        } else if constexpr (kDocs) {
          const int r = idx - kGEnd;
          sm80::cp_async_ca<4>(starts(s) + r, row_start + t0 + min(r, rows - 1));
        }
      }
      if (tid < kC) tile(s, L::v)[tid * L::ldv + Dv] = bf16_t(tid < rows ? 1.f : 0.f);
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  if constexpr (kWg) {
    // wgmma reads all 8 * kNT columns of a state buffer: those past DvP (the state warps never
    // write them) are zero, so they add nothing to the unused columns of phi(X) S, and no ks-step
    // of Y S^T reaches them.
    const int pad = 8 * kNT - DvP;
    for (int idx = tid; idx < 2 * kRows * pad; idx += kThreads) {
      bf16_t* Sb = state_buf(idx / (kRows * pad));
      Sb[L::s_at(idx / pad % kRows, DvP + idx % pad)] = bf16_t(0.f);
    }
    sm90::fence_proxy_async_shared();
  }

  // Both roles run the same steps, each with one barrier: the step's tiles (and the state) are
  // visible after it, and every warp is done with the stage the next issue() refills.
  if (warp >= kOutWarps) {
    const int tiles[2] = {2 * (warp - kOutWarps), 2 * (warp - kOutWarps) + 1};
    float S[2][kNT][4] = {};
    taylor_tiles::Targets to[2][2];
    lane_row_targets(tiles, to);
    if (a.nseg > 1) {
      // The segment's starting state: the lane's four target rows first, then one load per
      // element. With the tile map looked up per element these loads cost 30 of the fused
      // kernels' ~330 us at T = 8192 (H100, 2026-12-07; the map's branches between the loads, by
      // our reading: no SASS was looked at).
      const float* seg_carry = carry + (static_cast<int64_t>(pl) * a.nseg + seg) * kRows * DvP;
#pragma unroll
      for (int bl = 0; bl < 2; ++bl)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            S[bl][nt][e] = nt < ntv ? seg_carry[to[bl][e >> 1].sum * DvP + f.col(0, nt, e)] : 0.f;
    }
    const bool final_state = kMode == kOut && a.nseg == 1 && s_final;
    for (int step = 0; step < N; ++step) {
      bf16_t* Sn = state_buf(step);
#pragma unroll
      for (int bl = 0; bl < 2; ++bl)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const taylor_tiles::Targets& t = to[bl][hf];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            if (nt >= ntv) break;
            const float x0 = S[bl][nt][2 * hf], x1 = S[bl][nt][2 * hf + 1];
            const int c = f.col(0, nt, 0);
            store2(Sn + L::s_at(t.sum, c), x0, x1);
            if (t.other >= 0) store2(Sn + L::s_at(t.other, c), t.other_zero ? 0.f : x0, t.other_zero ? 0.f : x1);
          }
        }
      if constexpr (kWg) sm90::fence_proxy_async_shared();  // the output warps' wgmmas read it
      cp_async_wait<kStages - 2>();
      barrier();
      issue(step + kStages - 1);
      if (step == N - 1 && !final_state) break;  // that update would feed nothing
      const int s = step % kStages;
      const bf16_t* Xs = tile(s, kRev ? L::q : L::k);
      const bf16_t* Ys = tile(s, kRev ? L::g : L::v);
      if constexpr (kDocs) {
        const int t0 = chunk(step) * kC;
        state_tiles_add_chunk_docs<kRev>(S, Xs, L::ldx, Ys, L::ldv, tiles, ntv, starts(s), t0, min(kC, a.T - t0));
      } else {
        state_tiles_add_chunk(S, Xs, L::ldx, Ys, L::ldv, tiles, ntv);
      }
    }
    if (final_state) {  // the exported layout [pairs, 273, Dv + 1]
      const int R = kF * kF + kF + 1, W = Dv + 1;
      float* sf = s_final + static_cast<int64_t>(pair) * R * W;
      each_state_element(S, tiles, ntv, [&](float v, const taylor_tiles::Targets& t, int c) {
        each_target(t, v, [&](int r, float x) {
          if (r < R && c < W) sf[r * W + c] = x;
        });
      });
    }
    return;
  }

  const int ow = warp, m0 = 16 * ow, npt = ntv / 2, ksv = DvP / 16;
  bf16_t* M = reinterpret_cast<bf16_t*>(smem + L::m) + m0 * L::ldm;    // this warp's rows of the intra matrix
  float* DX = reinterpret_cast<float*>(smem + L::dx) + m0 * L::ldf;    // this warp's dx rows (gradient modes)
  float* DXI = reinterpret_cast<float*>(smem + L::dxi) + m0 * L::ldf;  // and their intra-chunk terms
  // Key blocks the causal mask leaves for this warp's rows: k-steps [k0, k0 + ks) of 16. Rows are
  // queries (lower triangle) or, in kGradK, keys (upper).
  const int k0 = kRev ? m0 : 0, ks = kRev ? kOutWarps - ow : ow + 1;
  for (int step = 0; step < N; ++step) {
    cp_async_wait<kStages - 2>();
    barrier();
    issue(step + kStages - 1);
    const int s = step % kStages;
    // The warp's rows X and the other side Xo; Y pairs with X's rows, Z with Xo's (the chunk kernel's
    // operands, taylor_attn_common.cuh).
    const bf16_t* Xs = tile(s, kRev ? L::k : L::q);
    const bf16_t* Xo = tile(s, kRev ? L::q : L::k);
    const bf16_t* Ys = tile(s, kRev ? L::v : L::g);
    const bf16_t* Zs = tile(s, kRev ? L::g : L::v);
    const bf16_t* Sn = state_buf(step);
    const int64_t t0 = static_cast<int64_t>(chunk(step)) * kC;
    const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));
    // Documents (the chunk kernel's masks): a pair (query, key) of one document only, and w[ri], 1
    // where this lane's row g + 8 ri reads the state (a query whose document started before the
    // chunk; kGradK: a key of the chunk's last document, which R_n holds the later queries of),
    // weighs that row's phi and its dL/dphi (the chunk kernel's zero rows, so the same bits).
    const int* Dst = kDocs ? starts(s) : nullptr;
    float w[2] = {1.f, 1.f};
    if constexpr (kDocs) {
      const int last = Dst[rows - 1];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const int r = m0 + f.g + 8 * ri;
        w[ri] = (kRev ? t0 + r >= last : Dst[r] < t0) ? 1.f : 0.f;
      }
    }
    // (query, key) = (t0 + r, t0 + c), or (t0 + c, t0 + r) in kGradK.
    auto keep = [&](int r, int c) {
      if constexpr (kDocs) return kRev ? c >= r && Dst[c] <= t0 + r : c <= r && t0 + c >= Dst[r];
      return kRev ? c >= r : c <= r;
    };
    // x^ at this lane's rows g, g + 8 and columns 2q, 2q + 1, 2q + 8, 2q + 9 (read where each pass
    // starts, so they do not hold registers through the other).
    auto load_xj = [&](float(&xj)[2][4]) {
#pragma unroll
      for (int ri = 0; ri < 2; ++ri)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xj[ri][i] = scaled(Xs[(m0 + f.g + 8 * ri) * L::ldx + 2 * f.q + (i & 1) + 8 * (i >> 1)]);
    };

    // Intra-chunk: U = X^ Xo^^T is the product of the stored rows times 1/4 (exact); each pass forms
    // its own (one k-step), so U holds no registers through the other pass.
    auto intra_u = [&](float(&U)[8][4]) {
      warp_mma<bf16_t, false, false, 8>(U, Xs, L::ldx, m0, 0, Xo, L::ldx, 0, 0, 1);
    };
    // The masked matrix of this warp's rows into M (only this warp reads it back).
    auto write_m = [&](auto&& entry) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
          store2(M + (r - m0) * L::ldm + c, keep(r, c) ? entry(nt, 2 * hf) : 0.f,
                 keep(r, c + 1) ? entry(nt, 2 * hf + 1) : 0.f);
        }
      __syncwarp();
    };
    if constexpr (kHasGrad) {
      // (Y Z^T) * (1 + U), masked, times Xo^: the stored Xo is 2 Xo^, so the product is halved.
      float U[8][4] = {}, Pm[8][4] = {}, dxi[2][4] = {};
      intra_u(U);
      warp_mma<bf16_t, false, false, 8>(Pm, Ys, L::ldv, m0, 0, Zs, L::ldv, 0, 0, ksv);
      write_m([&](int nt, int e) { return Pm[nt][e] * (1.f + 0.25f * U[nt][e]); });
      warp_mma<bf16_t, false, true, 2>(dxi, M, L::ldm, 0, k0, Xo, L::ldx, k0, 0, ks);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          *reinterpret_cast<float2*>(DXI + (f.g + 8 * hf) * L::ldf + f.col(0, nt, 0)) =
              make_float2(0.5f * dxi[nt][2 * hf], 0.5f * dxi[nt][2 * hf + 1]);
      __syncwarp();  // M is rewritten below
    }

    if constexpr (kHasOut) {
      // out~ = kappa(U) Z (masked) + phi(X^) S, one feature block per k-step; the next block's
      // state fragments are loaded before this block's products, so the shared-memory latency
      // hides behind them.
      float U[8][4] = {};
      intra_u(U);
      write_m([&](int nt, int e) {
        const float x = 0.25f * U[nt][e];
        return 1.f + x + 0.5f * x * x;
      });
      float acc[kNT][4] = {}, xj[2][4];
      warp_mma<bf16_t, false, true, kNT>(acc, M, L::ldm, 0, k0, Zs, L::ldv, k0, 0, ks, ntv);
      load_xj(xj);
      // The A fragment of feature block fb: phi of this warp's rows.
      auto phi_a = [&](int fb, uint32_t(&A)[4]) {
        float xf[2];
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) xf[ri] = fb < kF ? scaled(Xs[(m0 + f.g + 8 * ri) * L::ldx + fb]) : 0.f;
        const bool first = f.q == 0;
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
          auto phi = [&](int i, bool first_col) {
            const float p = phi_of(fb, xf[ri], xj[ri][i], first_col);
            return kDocs ? w[ri] * p : p;
          };
          A[ri] = pack_bf16(phi(0, first), phi(1, false));
          A[2 + ri] = pack_bf16(phi(2, false), phi(3, false));
        }
      };
      if constexpr (kWg) {
        // acc += phi(X^) S, one m64 n80 k16 wgmma per feature block (S: k = features, MN-major).
        // A block's fragment must stay untouched until its wgmma is done: two buffers, and the
        // block before's wait comes before its buffer is rebuilt.
        float(&d)[4 * kNT] = reinterpret_cast<float(&)[4 * kNT]>(acc);
        const uint32_t sb = smem_u32(Sn);
        uint32_t A[2][4];
#pragma unroll
        for (int fb = 0; fb < kBlocks; ++fb) {
          phi_a(fb, A[fb & 1]);
          sm90::wgmma_fence();
          sm90::Wgmma<8 * kNT>::rs<1>(d, A[fb & 1], sm90::desc_no_swizzle(sb + 2 * fb * L::band, L::band, L::core), 1);
          sm90::wgmma_commit();
          if (fb > 0) {
            sm90::wgmma_wait<1>();
            sm90::fence_regs(A[(fb - 1) & 1]);
          }
        }
        sm90::wgmma_wait<0>();
        sm90::fence_regs(A[(kBlocks - 1) & 1]);
        sm90::fence_regs(d);
      } else {
        // Two buffers in the forward; kGradK's registers hold one (ptxas schedules its loads).
        constexpr int kBufs = kMode == kOut ? 2 : 1;
        uint32_t Bf[kBufs][kKV][4];
        auto load_b = [&](int fb, uint32_t(&dst)[kKV][4]) {
#pragma unroll
          for (int lp = 0; lp < kKV; ++lp)
            if (lp < npt) ldsm_b_kn(Sn, L::ldv, 16 * fb, 16 * lp, dst[lp]);
        };
        if (kBufs == 2) load_b(0, Bf[0]);
#pragma unroll
        for (int fb = 0; fb < kBlocks; ++fb) {
          if (kBufs == 1)
            load_b(fb, Bf[0]);
          else if (fb + 1 < kBlocks)
            load_b(fb + 1, Bf[(fb + 1) % kBufs]);
          uint32_t A[4];
          phi_a(fb, A);
#pragma unroll
          for (int lp = 0; lp < kKV; ++lp)
            if (lp < npt) {
              mma_bf16(acc[2 * lp], A, Bf[fb % kBufs][lp][0], Bf[fb % kBufs][lp][1]);
              mma_bf16(acc[2 * lp + 1], A, Bf[fb % kBufs][lp][2], Bf[fb % kBufs][lp][3]);
            }
        }
      }
      if constexpr (kMode == kOut) {
        float d[2];
        strip_den(acc, a, pair, t0, m0, rows, den, d);
        store_strip(acc, d, m0, rows, Dv, out + b * a.o.b + t0 * a.o.t + h * Dv, a.o.t);
      } else {
        const float d[2] = {1.f, 1.f};
        store_strip(acc, d, m0, rows, Dv, out + b * a.dv.b + t0 * a.dv.t + h * Dv, a.dv.t);
      }
    }

    if constexpr (kHasGrad) {
      // G = Y S^T, dL/dphi(x) for one feature block at a time, contracted with x^ at once: each
      // G[t, 16 b + j] (b < 16) adds x_j G to dx_b and x_b G to dx_j (times 1/sqrt 2), G[t, 256 + j]
      // adds G to dx_j. A block's dx_b is complete after its block: its four lanes' partials are
      // summed in a fixed order and stored to DX right away.
      float xj[2][4], dxb[2][4] = {}, dx1[2][4] = {};  // [row g / g + 8][column as xj]
      load_xj(xj);
      // kWg: block fb's G from kKV m64 n16 k16 wgmmas (S: n = features, K-major) into Gw[fb & 1],
      // issued one block ahead of the contraction; Y's fragments stay in registers throughout. All
      // kKV k-steps run whatever DvP is (a k-step count known at compile time keeps the compiler
      // from moving accumulators between the wgmmas): the columns past DvP are zero on both sides.
      uint32_t Ya[kWg ? kKV : 1][4];
      float Gw[2][8];
      auto issue_g = [&](int fb) {
        if constexpr (kWg) {
          const uint32_t sb = smem_u32(Sn) + 2 * fb * L::band;
#pragma unroll
          for (int e = 0; e < 8; ++e) Gw[fb & 1][e] = 0.f;  // before the fence: no register write inside the group
          sm90::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kKV; ++kk)
            sm90::Wgmma<16>::rs<0>(Gw[fb & 1], Ya[kk], sm90::desc_no_swizzle(sb + 2 * kk * L::core, L::core, L::band),
                                   1);
          sm90::wgmma_commit();
        }
      };
      if constexpr (kWg) {
#pragma unroll
        for (int kk = 0; kk < kKV; ++kk) ldsm_a_mk(Ys, L::ldv, m0, 16 * kk, Ya[kk]);
        issue_g(0);
      }
#pragma unroll
      for (int fb = 0; fb < kBlocks - 1; ++fb) {  // block 17 (the constant feature) has no x
        float Gm[2][4] = {};
        float(&G)[2][4] = kWg ? reinterpret_cast<float(&)[2][4]>(Gw[fb & 1]) : Gm;
        if constexpr (kWg) {
          if (fb + 1 < kBlocks - 1) {
            issue_g(fb + 1);
            sm90::wgmma_wait<1>();
          } else {
            sm90::wgmma_wait<0>();
#pragma unroll
            for (int kk = 0; kk < kKV; ++kk) sm90::fence_regs(Ya[kk]);
          }
          sm90::fence_regs(Gw[fb & 1]);
        } else {
#pragma unroll
          for (int kk = 0; kk < kKV; ++kk)
            if (kk < ksv) {
              uint32_t A[4], B[4];
              ldsm_a_mk(Ys, L::ldv, m0, 16 * kk, A);
              ldsm_b_nk(Sn, L::ldv, 16 * kk, 16 * fb, B);
              mma_bf16(G[0], A, B[0], B[1]);
              mma_bf16(G[1], A, B[2], B[3]);
            }
        }
        if (fb < kF) {
          float xf[2], dxa[2] = {};
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) xf[ri] = scaled(Xs[(m0 + f.g + 8 * ri) * L::ldx + fb]);
#pragma unroll
          for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int ri = e >> 1, i = 2 * h8 + (e & 1);
              dxa[ri] = fmaf(G[h8][e], xj[ri][i], dxa[ri]);
              dxb[ri][i] = fmaf(G[h8][e], xf[ri], dxb[ri][i]);
            }
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) {
            float s = dxa[ri];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (f.q == 0) DX[(f.g + 8 * ri) * L::ldf + fb] = kDocs ? w[ri] * (kRsqrt2 * s) : kRsqrt2 * s;
          }
        } else {
#pragma unroll
          for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
            for (int e = 0; e < 4; ++e) dx1[e >> 1][2 * h8 + (e & 1)] += G[h8][e];
        }
      }
      __syncwarp();
#pragma unroll
      for (int ri = 0; ri < 2; ++ri)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int at = (f.g + 8 * ri) * L::ldf + 2 * f.q + (i & 1) + 8 * (i >> 1);
          if constexpr (kDocs)
            DX[at] += w[ri] * (kRsqrt2 * dxb[ri][i] + dx1[ri][i]) + DXI[at];
          else
            DX[at] += kRsqrt2 * dxb[ri][i] + dx1[ri][i] + DXI[at];
        }
      __syncwarp();
      // dx = dx^ / 2 (x^ = x / 2).
      const TaylorAttnLayout::Strides& ds = kRev ? a.dk : a.dq;
      bf16_t* dxr = dx + b * ds.b + t0 * ds.t + h * kF;
      for (int idx = tid & 31; idx < 16 * kF / 2; idx += 32) {
        const int r = idx / (kF / 2), c = 2 * (idx % (kF / 2));
        if (m0 + r < rows) store2(dxr + (m0 + r) * ds.t + c, 0.5f * DX[r * L::ldf + c], 0.5f * DX[r * L::ldf + c + 1]);
      }
    }
  }
}

template <int kMode, bool kWg, bool kDocs>
void launch(const Ctx& ctx, const Args& a, int P, const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* gt,
            float* carry, bf16_t* out, float* den, float* s_final, bf16_t* dx) {
  auto kernel = fused_kernel<kMode, kWg, kDocs>;
  constexpr int bytes = Smem<kMode != kOut, kWg, kDocs>::bytes;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const dim3 grid(static_cast<unsigned>(P), static_cast<unsigned>(a.nseg));
  kernel<<<grid, kThreads, bytes, cuda::stream_of(ctx)>>>(a, q, k, v, gt, carry, out, den, s_final, dx);
  LINAC_CUDA_LAUNCH_CHECK();
}

// The launch of `mode` with the walks of family kWg (the kDocs instance where a.doc_start is set).
template <bool kWg>
void launch_mode(const Ctx& ctx, Mode mode, const Args& a, int P, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                 const bf16_t* gt, float* carry, bf16_t* out, float* den, float* s_final, bf16_t* dx) {
  const auto go = [&](auto kernel_launch) { kernel_launch(ctx, a, P, q, k, v, gt, carry, out, den, s_final, dx); };
  const auto by_mode = [&](auto docs) {
    constexpr bool D = decltype(docs)::value;
    if (mode == kOut)
      go(launch<kOut, kWg, D>);
    else if (mode == kGradQ)
      go(launch<kGradQ, kWg, D>);
    else
      go(launch<kGradK, kWg, D>);
  };
  if (a.doc_start)
    by_mode(std::true_type{});
  else
    by_mode(std::false_type{});
}

// launch_mode<true> (taylor_attn_fused_sm90.cu, in sm_90a builds only).
void launch_sm90(const Ctx& ctx, Mode mode, const Args& a, int P, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                 const bf16_t* gt, float* carry, bf16_t* out, float* den, float* s_final, bf16_t* dx);

}  // namespace linac::taylor_cuda::fused
