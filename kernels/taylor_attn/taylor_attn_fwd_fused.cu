// Fused Taylor attention forward: the state scan and the per-chunk output in one kernel, so the
// per-chunk states S_n never leave the SM (math in taylor_attn.h; feature order and padding in
// taylor_attn_common.cuh). Built for bf16, F = 16, Dv <= 64 and no document bounds; other calls run
// the prep + scan + chunk launches of taylor_attn_fwd.cu.
//
// Grid (P, segments of kSegChunks chunks), one CTA of 13 warps per (pair, segment), sequential over
// the segment's chunks:
//   warps 0..8   (state) each hold two 16-feature blocks of the f32 state (288 x DvP) in mma
//                accumulators. Per chunk n: store bf16(S), the exclusive state S_n, into shared
//                memory; then S += phi(K^_n)^T V~_n, phi(K^_n)^T built straight into mma A fragments.
//   warps 9..12  (output) each own 16 query rows: o~ = tril(kappa(Q^ K^^T)) V~ + phi(Q^) S_n, phi(Q^)
//                built into A fragments one 16-feature block (one k-step) at a time, S_n read from
//                shared memory; o = o~ / den, den = o~[Dv] + eps.
// S_n is double-buffered and q, k, v come through a 3-stage cp.async ring straight from the strided
// inputs (v~'s "1" column written beside them), so a chunk costs one barrier and there is no prep
// pass and, with one segment, no workspace. The products and sums run in the order of the scan +
// chunk kernels, so with one segment (T <= 2048) o, den and the final state are those kernels' bits.
// With several segments a first launch (kTotals: the state warps alone) writes each segment's sum
// to the carry buffer, the forward carry kernel turns the sums into the segments' starting states
// and the final state, and the output launch starts each segment's accumulators from its carry.
#include <algorithm>

#include "common/sm90.cuh"
#include "taylor_attn/taylor_attn_common.cuh"

namespace linac {
namespace taylor_cuda {
namespace {

using linac::cuda::pack_bf16;
using linac::cuda::to_float;

constexpr int kStateWarps = kBlocks / 2, kOutWarps = kC / 16, kThreads = 32 * (kStateWarps + kOutWarps);
constexpr int kStages = 3;
constexpr int kNT = kNTSmall;  // value n-tiles: DvP <= 80

struct Smem {
  static constexpr int ldx = ld_of<bf16_t>(kF), ldv = ld_of<bf16_t>(8 * kNT), ldm = ld_of<bf16_t>(kC);
  static constexpr int q = 0, k = q + kC * ldx * 2, v = k + kC * ldx * 2, stage = v + kC * ldv * 2;
  static constexpr int s = kStages * stage, s_bytes = kRows * ldv * 2;
  static constexpr int m = s + 2 * s_bytes, bytes = m + kC * ldm * 2;
};

// Feature jj of block fb of a row whose prescaled values are xf = x[fb] and xj = x[jj] (first: jj == 0),
// the same f32 arithmetic as feature() in taylor_attn_common.cuh.
__device__ __forceinline__ float phi_of(int fb, float xf, float xj, bool first) {
  if (fb < kF) return xf * xj * kRsqrt2;
  if (fb == kF) return xj;
  return fb == kF + 1 && first ? 1.f : 0.f;
}

// x^ = x / 2 (F^(-1/4) at F = 16, exact), as prep stores it.
__device__ __forceinline__ float scaled(bf16_t x) { return 0.5f * to_float(x); }

// B fragments of the 16 x 16 tile of `src` (stored [k][n], row length ld) at (k0, n0).
__device__ __forceinline__ void ldsm_kn(const bf16_t* src, int ld, int k0, int n0, uint32_t (&b)[4]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  sm80::ldsm_x4_trans(src + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8, b);
}

template <bool kTotals>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_fused_kernel(Args a, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                     float* __restrict__ carry, bf16_t* __restrict__ o, float* __restrict__ den,
                     float* __restrict__ s_final) {
  extern __shared__ __align__(16) unsigned char smem[];
  using L = Smem;
  const int pl = blockIdx.x, seg = blockIdx.y, pair = a.p0 + pl, b = pair / a.H, h = pair % a.H;
  const int tid = threadIdx.x, warp = tid >> 5, Dv = a.Dv, DvP = a.DvP, ntv = DvP / 8;
  const int c0 = seg * kSegChunks, N = min(kSegChunks, a.N - c0);
  const Frag f;
  auto tile = [&](int s, int off) { return reinterpret_cast<bf16_t*>(smem + s * L::stage + off); };
  auto state_buf = [&](int step) { return reinterpret_cast<bf16_t*>(smem + L::s + (step & 1) * L::s_bytes); };
  auto barrier = [] { sm90::named_barrier_sync(1, kThreads); };

  // v~'s padding columns Dv + 1 .. DvP - 1 stay zero in every stage. Column Dv is issue()'s alone:
  // a zero written here by another thread before the first barrier could land after its 1.
  for (int idx = tid; idx < kStages * kC * 15; idx += kThreads)
    tile(idx / (kC * 15), L::v)[(idx / 15) % kC * L::ldv + Dv + 1 + idx % 15] = bf16_t(0.f);
  // Chunk `step` of the segment into stage step % kStages: q and k rows are two 16-byte pieces,
  // v rows Dv / 8; rows past T read as zero (v~'s "1" too). A group per step, empty past the end.
  auto issue = [&](int step) {
    if (step < N) {
      const int s = step % kStages, per_row = 4 + Dv / 8;
      const int64_t t0 = static_cast<int64_t>(c0 + step) * kC;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));
      const bf16_t* qs = q + b * a.q.b + t0 * a.q.t + h * kF;
      const bf16_t* ks = k + b * a.k.b + t0 * a.k.t + h * kF;
      const bf16_t* vs = v + b * a.v.b + t0 * a.v.t + h * Dv;
      for (int idx = tid; idx < kC * per_row; idx += kThreads) {
        const int r = idx / per_row, c = idx % per_row;
        const bool ok = r < rows;
        if (c < 2)
          cp_async16(tile(s, L::q) + r * L::ldx + 8 * c, ok ? qs + r * a.q.t + 8 * c : qs, ok);
        else if (c < 4)
          cp_async16(tile(s, L::k) + r * L::ldx + 8 * (c - 2), ok ? ks + r * a.k.t + 8 * (c - 2) : ks, ok);
        else
          cp_async16(tile(s, L::v) + r * L::ldv + 8 * (c - 4), ok ? vs + r * a.v.t + 8 * (c - 4) : vs, ok);
      }
      if (tid < kC) tile(s, L::v)[tid * L::ldv + Dv] = bf16_t(tid < rows ? 1.f : 0.f);
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  // Both roles run the same steps, each with one barrier: the step's tiles (and S_n) are visible
  // after it, and every warp is done with the stage the next issue() refills.
  if (warp < kStateWarps) {
    const int fb0 = 2 * warp;
    float S[2][kNT][4] = {};
    // fn(element, state row, state column) over this warp's accumulator elements within DvP.
    auto each = [&](auto&& fn) {
#pragma unroll
      for (int bl = 0; bl < 2; ++bl)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (nt < ntv) fn(S[bl][nt][e], 16 * (fb0 + bl) + f.row(0, e), f.col(0, nt, e));
    };
    float* seg_carry = carry + (static_cast<int64_t>(pl) * a.nseg + seg) * kRows * DvP;
    if (!kTotals && a.nseg > 1) each([&](float& x, int r, int c) { x = seg_carry[r * DvP + c]; });
    const bool final_state = !kTotals && a.nseg == 1 && s_final;
    for (int step = 0; step < N; ++step) {
      if (!kTotals) {
        bf16_t* Sn = state_buf(step);
#pragma unroll
        for (int bl = 0; bl < 2; ++bl)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
              if (nt < ntv)
                store2(Sn + (16 * (fb0 + bl) + f.row(0, 2 * hf)) * L::ldv + f.col(0, nt, 0), S[bl][nt][2 * hf],
                       S[bl][nt][2 * hf + 1]);
      }
      cp_async_wait<kStages - 2>();
      barrier();
      issue(step + kStages - 1);
      if (!kTotals && step == N - 1 && !final_state) break;  // that update would feed nothing
      // S += phi(K^)^T V~, a k-step per 16 tokens: lane holds tokens tb, tb + 1, tb + 8, tb + 9 of
      // feature rows g and g + 8 of each of its two blocks.
      const bf16_t* Ks = tile(step % kStages, L::k);
      const bf16_t* Vs = tile(step % kStages, L::v);
#pragma unroll
      for (int kstep = 0; kstep < kC / 16; ++kstep) {
        const int tb = 16 * kstep + 2 * f.q;
        float xg[4], xg8[4], xf[2][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bf16_t* row = Ks + (tb + (i & 1) + 8 * (i >> 1)) * L::ldx;
          xg[i] = scaled(row[f.g]);
          xg8[i] = scaled(row[f.g + 8]);
#pragma unroll
          for (int bl = 0; bl < 2; ++bl) xf[bl][i] = fb0 + bl < kF ? scaled(row[fb0 + bl]) : 0.f;
        }
        uint32_t A[2][4];
#pragma unroll
        for (int bl = 0; bl < 2; ++bl) {
          const int fb = fb0 + bl;
          const bool first = f.g == 0;
          A[bl][0] = pack_bf16(phi_of(fb, xf[bl][0], xg[0], first), phi_of(fb, xf[bl][1], xg[1], first));
          A[bl][1] = pack_bf16(phi_of(fb, xf[bl][0], xg8[0], false), phi_of(fb, xf[bl][1], xg8[1], false));
          A[bl][2] = pack_bf16(phi_of(fb, xf[bl][2], xg[2], first), phi_of(fb, xf[bl][3], xg[3], first));
          A[bl][3] = pack_bf16(phi_of(fb, xf[bl][2], xg8[2], false), phi_of(fb, xf[bl][3], xg8[3], false));
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          if (2 * np >= ntv) break;
          uint32_t B[4];
          ldsm_kn(Vs, L::ldv, 16 * kstep, 16 * np, B);
#pragma unroll
          for (int bl = 0; bl < 2; ++bl) {
            sm80::mma_bf16(S[bl][2 * np], A[bl], B[0], B[1]);
            sm80::mma_bf16(S[bl][2 * np + 1], A[bl], B[2], B[3]);
          }
        }
      }
    }
    if (kTotals) {
      each([&](float& x, int r, int c) { seg_carry[r * DvP + c] = x; });
    } else if (final_state) {  // the exported layout [pairs, 273, Dv + 1]
      const int R = kF * kF + kF + 1, W = Dv + 1;
      float* sf = s_final + static_cast<int64_t>(pair) * R * W;
      each([&](float& x, int r, int c) {
        if (r < R && c < W) sf[r * W + c] = x;
      });
    }
    return;
  }

  constexpr int kP = kNT / 2;  // value n-tile pairs
  const int ow = warp - kStateWarps, m0 = 16 * ow, npt = ntv / 2;
  bf16_t* M = reinterpret_cast<bf16_t*>(smem + L::m) + m0 * L::ldm;  // this warp's rows of kappa
  for (int step = 0; step < N; ++step) {
    cp_async_wait<kStages - 2>();
    barrier();
    issue(step + kStages - 1);
    if (kTotals) continue;
    const bf16_t* Qs = tile(step % kStages, L::q);
    const bf16_t* Ks = tile(step % kStages, L::k);
    const bf16_t* Vs = tile(step % kStages, L::v);
    const bf16_t* Sn = state_buf(step);
    const int64_t t0 = static_cast<int64_t>(c0 + step) * kC;
    const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));

    // intra: kappa(Q^ K^^T) = 1 + u + u^2 / 2 on and below the diagonal, through this warp's M into
    // the matmul with V~. Q K^T of the unscaled rows times 1/4 is Q^ K^^T exactly.
    float U[8][4] = {};
    warp_mma<bf16_t, false, false, 8>(U, Qs, L::ldx, m0, 0, Ks, L::ldx, 0, 0, 1);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
        float u[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = 0.25f * U[nt][2 * hf + e];
          u[e] = c + e <= r ? 1.f + x + 0.5f * x * x : 0.f;
        }
        store2(M + (r - m0) * L::ldm + c, u[0], u[1]);
      }
    __syncwarp();
    float acc[kNT][4] = {};
    warp_mma<bf16_t, false, true, kNT>(acc, M, L::ldm, 0, 0, Vs, L::ldv, 0, 0, ow + 1, ntv);

    // inter: phi(Q^) S_n, one feature block per k-step. Lane holds rows g, g + 8 and feature
    // columns 2q, 2q + 1, 2q + 8, 2q + 9 of each block. The next block's S_n fragments are loaded
    // before this block's products, so the shared-memory latency hides behind them.
    float xj[2][4];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        xj[ri][i] = scaled(Qs[(m0 + f.g + 8 * ri) * L::ldx + 2 * f.q + (i & 1) + 8 * (i >> 1)]);
    uint32_t Bf[2][kP][4];
    auto load_b = [&](int fb, uint32_t(&dst)[kP][4]) {
#pragma unroll
      for (int lp = 0; lp < kP; ++lp)
        if (lp < npt) ldsm_kn(Sn, L::ldv, 16 * fb, 16 * lp, dst[lp]);
    };
    load_b(0, Bf[0]);
#pragma unroll
    for (int fb = 0; fb < kBlocks; ++fb) {
      if (fb + 1 < kBlocks) load_b(fb + 1, Bf[(fb + 1) & 1]);
      float xf[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) xf[ri] = fb < kF ? scaled(Qs[(m0 + f.g + 8 * ri) * L::ldx + fb]) : 0.f;
      const bool first = f.q == 0;
      uint32_t A[4];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        A[ri] = pack_bf16(phi_of(fb, xf[ri], xj[ri][0], first), phi_of(fb, xf[ri], xj[ri][1], false));
        A[2 + ri] = pack_bf16(phi_of(fb, xf[ri], xj[ri][2], false), phi_of(fb, xf[ri], xj[ri][3], false));
      }
#pragma unroll
      for (int lp = 0; lp < kP; ++lp)
        if (lp < npt) {
          sm80::mma_bf16(acc[2 * lp], A, Bf[fb & 1][lp][0], Bf[fb & 1][lp][1]);
          sm80::mma_bf16(acc[2 * lp + 1], A, Bf[fb & 1][lp][2], Bf[fb & 1][lp][3]);
        }
    }

    float d[2];
    strip_den(acc, a, pair, t0, m0, rows, den, d);
    store_strip(acc, d, m0, rows, Dv, o + b * a.o.b + t0 * a.o.t + h * Dv, a.o.t);
  }
}

template <bool kTotals>
void launch(const Ctx& ctx, const Args& a, int P, const bf16_t* q, const bf16_t* k, const bf16_t* v, float* carry,
            bf16_t* o, float* den, float* s_final) {
  auto kernel = fwd_fused_kernel<kTotals>;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::bytes));
  const dim3 grid(static_cast<unsigned>(P), static_cast<unsigned>(a.nseg));
  kernel<<<grid, kThreads, Smem::bytes, cuda::stream_of(ctx)>>>(a, q, k, v, carry, o, den, s_final);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool fwd_fused_applies(const Args& a, DType act) {
  return act == DType::BF16 && a.doc_start == nullptr && a.DvP <= 8 * kNT;
}

void fwd_fused(const Ctx& ctx, const TaylorAttnLayout& L, Args a, const bf16_t* q, const bf16_t* k, const bf16_t* v,
               bf16_t* o, float* den, float* s_final) {
  // Workspace: the f32 segment carries only, none with one segment.
  const size_t per = a.nseg > 1 ? static_cast<size_t>(a.nseg) * kRows * a.DvP * 4 : 0;
  const int64_t BH = L.B * L.H, size = balanced_group(ctx, L, [&](int64_t P) { return P * per; });
  float* carry = static_cast<float*>(ctx.workspace);
  for (int64_t p0 = 0; p0 < BH; p0 += size) {
    const int P = static_cast<int>(std::min(size, BH - p0));
    a.p0 = static_cast<int>(p0);
    if (a.nseg > 1) {
      launch<true>(ctx, a, P, q, k, v, carry, o, den, s_final);
      launch_carry(ctx, a, P, false, carry, s_final);
    }
    launch<false>(ctx, a, P, q, k, v, carry, o, den, s_final);
  }
}

}  // namespace taylor_cuda
}  // namespace linac
