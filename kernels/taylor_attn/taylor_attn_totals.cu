// Segment totals for the fused Taylor kernels (bf16, Dv <= 64): with several scan
// segments, each segment's sum of the chunk updates,
//   total[seg] = sum over the chunks of seg of phi(X^)^T Y      (X, Y = k^, v~; reverse: q^, g~),
// into carry [P, nseg, kRows, DvP] f32 (the feature order of taylor_attn_common.cuh), which the
// carry kernel turns into the segments' starting states. Grid (P, segments, halves): the segment
// the carries never read (the last in scan order) is left out unless the forward's final state
// needs it.
//
// The state warps' update alone (taylor_attn_state.cuh): the same ten tiles of 16 distinct state
// rows (taylor_attn_state_tiles.h), the same products and k-steps over the same Y fragments, so a
// total is the bits the fused pass would reach; each sum is stored to both of its rows. Two
// shapes: five warps of two tiles each, as the fused kernels' state warps, or the tiles split over
// two CTAs of five one-tile warps where that spreads the CTAs over more SMs (launch_totals). The
// kernel is bound by the instructions that build phi's fragments, not the tensor pipe (NOTES.md).
// Documents (kDocs): the chunk's starts come with its rows, and a total restarts at a chunk in
// which a document starts (chunk_update_docs, as the fused state warps and the scan kernel).
#include <type_traits>

#include "taylor_attn/taylor_attn_state.cuh"
#include "taylor_attn/taylor_attn_state_tiles.h"

namespace linac::taylor_cuda {
namespace {

constexpr int kWarps = taylor_tiles::kTiles / 2, kThreads = 32 * kWarps, kStages = 4, kNT = kNTSmall;

template <bool kDocs>
struct TotalsSmem {
  static constexpr int ldx = ld_of<bf16_t>(kF), ldy = ld_of<bf16_t>(8 * kNT);
  static constexpr int y = kC * ldx * 2, st = y + kC * ldy * 2, stage = st + (kDocs ? kC * 4 : 0);
  static constexpr int bytes = kStages * stage;
};

// x: k (forward) or q (reverse), strided; y: v (forward, strided; v~'s "1" column added here) or
// g~ (reverse, the chunk-major workspace of the group, rows past T zero). kNB: tiles per warp (2:
// blockIdx.z = 0 holds all ten, warp w tiles 2w and 2w + 1; 1: warp w of CTA z holds tile 2w + z,
// so that the tail tiles stay on warp 4 either way).
template <bool kRev, int kNB, bool kDocs>
__global__ void __launch_bounds__(kThreads, kNB == 1 ? 4 : 3)
    totals_kernel(Args a, const bf16_t* __restrict__ x, const bf16_t* __restrict__ y, float* __restrict__ carry) {
  extern __shared__ __align__(16) unsigned char smem[];
  using L = TotalsSmem<kDocs>;
  const int pl = blockIdx.x, seg = blockIdx.y + (kRev ? a.nseg - static_cast<int>(gridDim.y) : 0);
  const int pair = a.p0 + pl, b = pair / a.H, h = pair % a.H, tid = threadIdx.x, warp = tid >> 5;
  const int Dv = a.Dv, DvP = a.DvP, ntv = DvP / 8, c0 = seg * kSegChunks, N = min(kSegChunks, a.N - c0);
  auto tile = [&](int s, int off) { return reinterpret_cast<bf16_t*>(smem + s * L::stage + off); };
  auto starts = [&](int s) { return reinterpret_cast<int*>(smem + s * L::stage + L::st); };
  const int32_t* row_start = kDocs ? a.doc_start + static_cast<int64_t>(b) * a.T : nullptr;

  // Y's columns past its data stay zero in every stage (v~: Dv + 1 on; Dv is issue()'s, see the
  // fused kernel; g~: DvP on).
  const int first_pad = kRev ? DvP : Dv + 1, pad = 8 * kNT - first_pad;
  for (int idx = tid; idx < kStages * kC * pad; idx += kThreads)
    tile(idx / (kC * pad), L::y)[(idx / pad) % kC * L::ldy + first_pad + idx % pad] = bf16_t(0.f);
  // Chunk `step` of the segment (in scan order) into stage step % kStages; rows past T read as zero.
  // The pieces as in the fused kernel's issue(): X rows of 2, Y rows of kNT (those past the row's
  // data skipped), then (kDocs) the starts, spans of whole warps.
  auto issue = [&](int step) {
    if (step < N) {
      constexpr int kXEnd = 2 * kC, kYEnd = kXEnd + kNT * kC, kEnd = kYEnd + (kDocs ? kC : 0);
      static_assert(kXEnd % 32 == 0 && kYEnd % 32 == 0, "spans of whole warps");
      const int s = step % kStages, ny = (kRev ? DvP : Dv) / 8;
      const int64_t t0 = static_cast<int64_t>(c0 + (kRev ? N - 1 - step : step)) * kC;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));
      const TaylorAttnLayout::Strides& xs = kRev ? a.q : a.k;
      const bf16_t* xr = x + b * xs.b + t0 * xs.t + h * kF;
      const int64_t yt = kRev ? DvP : a.v.t;
      const bf16_t* yr = kRev ? y + (static_cast<int64_t>(pl) * a.N * kC + t0) * DvP : y + b * a.v.b + t0 * yt + h * Dv;
      for (int idx = tid; idx < kEnd; idx += kThreads) {
        if (idx < kXEnd) {
          const int r = idx >> 1, c = 8 * (idx & 1);
          const bool ok = r < rows;
          cp_async16(tile(s, 0) + r * L::ldx + c, ok ? xr + r * xs.t + c : xr, ok);
        } else if (idx < kYEnd) {
          const int i = idx - kXEnd, r = i / kNT, c = 8 * (i % kNT);
          const bool ok = kRev || r < rows;
          if (c < 8 * ny) cp_async16(tile(s, L::y) + r * L::ldy + c, ok ? yr + r * yt + c : yr, ok);
        } else if constexpr (kDocs) {
          const int r = idx - kYEnd;
          sm80::cp_async_ca<4>(starts(s) + r, row_start + t0 + min(r, rows - 1));
        }
      }
      if (!kRev && tid < kC) tile(s, L::y)[tid * L::ldy + Dv] = bf16_t(tid < rows ? 1.f : 0.f);
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  int tiles[kNB];
#pragma unroll
  for (int bl = 0; bl < kNB; ++bl) tiles[bl] = 2 * warp + (kNB == 2 ? bl : static_cast<int>(blockIdx.z));
  float S[kNB][kNT][4] = {};
  for (int step = 0; step < N; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // the step's tiles are in; every warp is done with the stage issue() refills
    issue(step + kStages - 1);
    const int s = step % kStages;
    const bf16_t *Xs = tile(s, 0), *Ys = tile(s, L::y);
    if constexpr (kDocs) {
      const int t0 = (c0 + (kRev ? N - 1 - step : step)) * kC;
      state_tiles_add_chunk_docs<kRev>(S, Xs, L::ldx, Ys, L::ldy, tiles, ntv, starts(s), t0, min(kC, a.T - t0));
    } else {
      state_tiles_add_chunk(S, Xs, L::ldx, Ys, L::ldy, tiles, ntv);
    }
  }
  float* total = carry + (static_cast<int64_t>(pl) * a.nseg + seg) * kRows * DvP;
  each_state_element(S, tiles, ntv, [&](float v, const taylor_tiles::Targets& t, int c) {
    each_target(t, v, [&](int r, float x) { total[r * DvP + c] = x; });
  });
}

}  // namespace

void launch_totals(const Ctx& ctx, const Args& a, int P, bool reverse, const bf16_t* x, const bf16_t* y, float* carry,
                   bool all) {
  const int segs = all && !reverse ? a.nseg : a.nseg - 1;
  const bool halves = taylor_attn_totals_in_halves(int64_t{P} * segs, gpu_sm_count());
  auto go = [&](auto docs) {
    constexpr bool D = decltype(docs)::value;
    constexpr int bytes = TotalsSmem<D>::bytes;
    auto kernel = halves ? (reverse ? totals_kernel<true, 1, D> : totals_kernel<false, 1, D>)
                         : (reverse ? totals_kernel<true, 2, D> : totals_kernel<false, 2, D>);
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    const dim3 grid(static_cast<unsigned>(P), static_cast<unsigned>(segs), halves ? 2 : 1);
    kernel<<<grid, kThreads, bytes, cuda::stream_of(ctx)>>>(a, x, y, carry);
    LINAC_CUDA_LAUNCH_CHECK();
  };
  if (a.doc_start)
    go(std::true_type{});
  else
    go(std::false_type{});
}

}  // namespace linac::taylor_cuda
