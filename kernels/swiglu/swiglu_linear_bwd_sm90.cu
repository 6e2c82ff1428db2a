// Hopper backward through W_out and the gate (math in swiglu_linear.h):
//   da = dy W_out           (f32 accumulation, rounded to bf16; never written to memory)
//   dh = swiglu_bwd(h, da)  from that rounded da, as swiglu_bwd computes it
//   dots (optional)         swiglu_value_dots(h, dh): per 8-column unit, sum du u of the rounded du
// Layout: dy [N, d], W_out [d, F], h and dh [N, 2F] (g | u, dg | du); bf16. dots [N, F / 8] f32.
//
// A ping-pong kernel: the epilogue (8 bytes of traffic and ~15 instructions per output) outweighs
// what the tensor cores spend on an output at K = 768, so each math warpgroup runs the epilogue of
// its own tile while the other warpgroup's matmuls have the tensor cores. The CTA's tile is rows
// m0 .. m0 + 127 and columns f0 .. f0 + 127 of da as in gemm_sm90.cuh; math warpgroup w owns rows
// m0 + 64 w .. + 63 as a 64 x 128 accumulator (wgmma m64n128k16) and takes its turn on the tensor
// cores after the other's matmuls are issued ("turn" barriers). A stage holds A = dy [64, 64]
// (K-major) and B = W_out [64, 128] as two 64-column chunks (MN-major: W_out's rows run along k);
// the loading thread fills them in the order the turns take them: warpgroup 0's k-steps of a tile,
// then warpgroup 1's. The turns also keep each warpgroup's waits on the stage barriers sound: a
// warpgroup waits on a stage's round only after the stage's previous round was waited on, by the
// other warpgroup if not by itself.
//
// Epilogue, from registers: the thread's g and u are loaded as its tile's matmuls begin (they land
// during them), the accumulators are rounded to bf16 and transposed within each quad of lanes so
// that a lane holds 8 consecutive columns of a row (16-byte loads and stores: units), then dg and du
// are computed and stored. No staging in shared memory and no epilogue warps: the old wide kernel
// (a staging block per warpgroup, seven epilogue warps) kept its math warpgroups waiting on the
// epilogue (H200, 125M layer: 53% tensor pipe, 226 us).
// In clusters of 2, rank r loads B's 64-column chunk r of each stage and multicasts it to both CTAs.
#include <algorithm>

#include "common/gemm_sm90.cuh"
#include "common/mma_sm80.cuh"
#include "swiglu/swiglu_linear.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace glu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = 128, kBK = 64, kRows = 64, kStages = 9;
using Cta = Roles<false>;

struct BwdCfg {
  static constexpr uint32_t kABytes = kRows * kBK * 2, kBBytes = kBK * kBN * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kBarOffset = kStages * kStageBytes;
  // full and empty per stage; a turn per math warpgroup
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 2);
};

// A math thread's units: unit i = 2 c + r is row 8 r and columns 32 c .. 32 c + 7 from the thread's
// first (row 16 warp + lane / 4 of its warpgroup's 64, column 8 (lane % 4)), quad_rows_bf16's layout
// of accumulator n-tiles 4 c .. 4 c + 3, half r.
constexpr int kUnitsPerThread = 8;

template <GluAct kAct, int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    swiglu_linear_bwd_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_w,
                             const __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ dh,
                             float* __restrict__ dots, const int n, const int f, const int d) {
  using C = BwdCfg;
  using Pipe = StagePipe<kStages, kCluster, 4>;
  extern __shared__ unsigned char smem[];
  const uint32_t stage0 = smem_base_1024(smem);
  const Pipe pipe{stage0, C::kStageBytes, stage0 + C::kBarOffset};
  const uint32_t turn0 = pipe.end();  // turn0 + 8 w: warpgroup w may issue its matmuls
  const TileGrid<kCluster> grid(n, cdiv(f, kBN));
  const int nk = cdiv(d, kBK);
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    pipe.init();
    mbar_init(turn0, 4);
    mbar_init(turn0 + 8, 4);
    mbar_init_fence();
  }
  barriers_ready<kCluster>();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_dy);
      prefetch_tensor_map(&tm_w);
      typename Pipe::Slot slot;
      for (int t = grid.first(); t < grid.count; t += grid.step()) {
        const int m0 = grid.row0(t), f0 = grid.col_block(t) * kBN;
        for (int w = 0; w < 2; ++w)
          for (int kb = 0; kb < nk; ++kb, slot.next()) {
            const uint32_t a = pipe.acquire(slot), b = a + C::kABytes, bar = pipe.full(slot);
            tma_load_4d(a, &tm_dy, bar, kb * kBK, m0 + kRows * w, 0, 0);
            if (kCluster == 1) {
              tma_load_4d(b, &tm_w, bar, f0, kb * kBK, 0, 0);
              tma_load_4d(b + C::kBBytes / 2, &tm_w, bar, f0 + 64, kb * kBK, 0, 0);
            } else {
              const int half = static_cast<int>(grid.rank);
              tma_load_4d_multicast(b + half * (C::kBBytes / 2), &tm_w, bar, 3, f0 + 64 * half, kb * kBK, 0, 0);
            }
          }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const uint32_t my_turn = turn0 + 8 * w, their_turn = turn0 + 8 * (1 - w);
    typename Pipe::Slot slot;
    if (w == 1) slot.skip(nk);
    int nt = 0;
    for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
      const int row0 = grid.row0(t) + kRows * w + 16 * warp + (lane >> 2);
      const int col0 = grid.col_block(t) * kBN + 8 * (lane & 3);
      // Offset of unit i's g in h (its u is f further; dg, du at the same places in dh); -1 where
      // the unit is past the matrix (f is a multiple of 8: a unit is all in or all out).
      auto unit_at = [&](int i) -> int64_t {
        const int row = row0 + 8 * (i & 1), col = col0 + 32 * (i >> 1);
        return row < n && col < f ? row * (2 * int64_t{f}) + col : -1;
      };
      uint4 gv[kUnitsPerThread], uv[kUnitsPerThread];
#pragma unroll
      for (int i = 0; i < kUnitsPerThread; ++i) {
        const int64_t at = unit_at(i);
        gv[i] = at >= 0 ? __ldcs(reinterpret_cast<const uint4*>(h + at)) : make_uint4(0, 0, 0, 0);
        uv[i] = at >= 0 ? __ldcs(reinterpret_cast<const uint4*>(h + at + f)) : make_uint4(0, 0, 0, 0);
      }
      // Warpgroup 0's first tile waits for the phase before the barrier's first (complete).
      mbar_wait(my_turn, (nt & 1) ^ (w == 0 ? 1 : 0));
      float acc[64];
      pipe.matmuls(
          nk, slot,
          [&](uint32_t a, int accumulate) {
#pragma unroll
            for (int kk = 0; kk < kBK / 16; ++kk)
              Wgmma<128>::ss<0, 1>(acc, desc_k_major(a, 0, 0, kk), desc_mn_major(a + C::kABytes, kBK, kk),
                                   accumulate || kk > 0);
          },
          [&] {
            if (lane == 0) mbar_arrive(their_turn);
          });
      slot.skip(nk);
      fence_regs(acc);
      const auto& tiles = reinterpret_cast<const float(&)[16][4]>(acc);
#pragma unroll
      for (int i = 0; i < kUnitsPerThread; ++i) {
        const uint4 dv = sm80::quad_rows_bf16(tiles, 4 * (i >> 1), i & 1);  // every lane: shuffles
        const int64_t at = unit_at(i);
        if (at < 0) continue;
        const uint32_t gs[4] = {gv[i].x, gv[i].y, gv[i].z, gv[i].w}, us[4] = {uv[i].x, uv[i].y, uv[i].z, uv[i].w},
                       ds[4] = {dv.x, dv.y, dv.z, dv.w};
        uint32_t dgs[4], dus[4];
        float dot = 0;  // the unit's du u, from du as rounded for dh (swiglu_value_dots' bits)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 g2 = unpack_bf16(gs[j]), u2 = unpack_bf16(us[j]), d2 = unpack_bf16(ds[j]);
          float2 dg, du;
          cuda::swiglu_grad<kAct>(g2.x, u2.x, d2.x, dg.x, du.x);
          cuda::swiglu_grad<kAct>(g2.y, u2.y, d2.y, dg.y, du.y);
          dgs[j] = pack_bf16(dg.x, dg.y);
          dus[j] = pack_bf16(du.x, du.y);
          const float2 dr = unpack_bf16(dus[j]);
          dot = __fmaf_rn(dr.y, u2.y, __fmaf_rn(dr.x, u2.x, dot));
        }
        *reinterpret_cast<uint4*>(dh + at) = make_uint4(dgs[0], dgs[1], dgs[2], dgs[3]);
        *reinterpret_cast<uint4*>(dh + at + f) = make_uint4(dus[0], dus[1], dus[2], dus[3]);
        if (dots) dots[int64_t{row0 + 8 * (i & 1)} * (f / 8) + (col0 >> 3) + 4 * (i >> 1)] = dot;
      }
    }
  }
  if (kCluster > 1) cluster_sync();  // no CTA leaves while another may still arrive on its barriers
}

template <GluAct kAct, int kCluster>
void launch_in_clusters(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& h, const Tensor& dh,
                        float* dots) {
  using C = BwdCfg;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  const int64_t n = dy.size(0), d = dy.size(1), f = w.size(1);
  const CUtensorMap tm_dy = matrix_map(dy.ptr, n, d, d, 1, 0, kRows, kBK);
  const CUtensorMap tm_w = matrix_map(w.ptr, d, f, f, 1, 0, kBK, 64);
  const int tiles = cdiv(cdiv(static_cast<int>(n), kBM), kCluster) * cdiv(static_cast<int>(f), kBN);
  launch_clusters<kCluster>(swiglu_linear_bwd_kernel<kAct, kCluster>, tiles, C::kSmem, cuda::stream_of(ctx), tm_dy,
                            tm_w, h.data<__nv_bfloat16>(), dh.data<__nv_bfloat16>(), dots, static_cast<int>(n),
                            static_cast<int>(f), static_cast<int>(d));
}

template <GluAct kAct>
void launch(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& h, const Tensor& dh, float* dots) {
  if (::linac::swiglu_linear_cluster() == 2)
    launch_in_clusters<kAct, 2>(ctx, dy, w, h, dh, dots);
  else
    launch_in_clusters<kAct, 1>(ctx, dy, w, h, dh, dots);
}

}  // namespace
}  // namespace glu_sm90

void swiglu_linear_bwd_sm90(const Ctx& ctx, const Tensor& dy, const Tensor& w_out, const Tensor& h, const Tensor& dh,
                            GluAct act, float* dots) {
  LINAC_CHECK(dy.size(0) < (int64_t{1} << 31) - glu_sm90::kBM, "swiglu_linear_bwd: too many rows for one call");
  if (act == GluAct::Silu)
    glu_sm90::launch<GluAct::Silu>(ctx, dy, w_out, h, dh, dots);
  else
    glu_sm90::launch<GluAct::Identity>(ctx, dy, w_out, h, dh, dots);
}

}  // namespace linac
