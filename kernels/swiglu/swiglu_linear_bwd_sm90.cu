// Hopper backward through W_out and the gate (math in swiglu_linear.h):
//   da = dy W_out           (f32 accumulation, rounded to bf16; never written to memory)
//   dh = swiglu_bwd(h, da)  from that rounded da, as swiglu_bwd computes it
//   dots (optional)         swiglu_value_dots(h, dh): per 8-column unit, sum du u of the rounded du
// Layout: dy [N, d], W_out [d, F], h and dh [N, 2F] (g | u, dg | du); bf16. dots [N, F / 8] f32.
//
// Output tile: rows m0 .. m0 + 127 and columns f0 .. f0 + 255 of da; a math warpgroup's 64 x 256
// accumulator (wgmma m64n256k16). k runs in steps of 32 through four stages of A = dy [128, 32]
// (K-major, 64-byte rows and swizzle) and B = W_out [32, 256] as four 64-column chunks (MN-major:
// W_out's rows run along k). In clusters of 2, rank r loads B's chunks 2r and 2r + 1 of each stage
// and multicasts them to both CTAs. Beside the stages, the tile's g and u (128 rows x 256 columns
// each, as eight boxes of 64 columns with the 128-byte swizzle): the loading thread copies them in
// as the tile's matmuls begin, once the math warpgroups are past the last tile's epilogue.
//
// The math warpgroups run the epilogue themselves, on their accumulators in registers, while the
// loading thread fills the stages of the next tile: the accumulators are rounded to bf16 and
// transposed within each quad of lanes so that a lane holds 8 consecutive columns of a row
// (quad_rows_bf16: a unit), whose g and u it reads from shared memory and whose dg and du it stores
// to global memory, 16 bytes each.
//
// Why this schedule (H100, 2026-12-06, kernels/swiglu/NOTES.md): the gate's epilogue moves 8 bytes
// per output, and its g and u loads must be in flight long before they are needed. The earlier
// kernel (128 x 128 tiles, seven epilogue warps holding g and u in registers) hid that, but its
// small tiles cost shared-memory bandwidth: every k-step its wgmmas read 48 KB and its copies wrote
// 32 KB for 2.1 MFLOP, against 40 and 24 KB at 128 x 256 (an SM's shared memory moves 128 bytes
// per cycle; its tensor cores do 4,096 FLOP). 128 x 256 accumulators leave no registers for g and
// u, and loading them from global memory in the epilogue, a few units ahead, waited out a memory
// latency per unit (the loads share the warp's scoreboards); copied in by the TMA they land during
// the matmuls, at the price of the operand stages that their 128 KB take.

#include "common/gemm_sm90.cuh"
#include "common/mma_sm80.cuh"
#include "swiglu/swiglu_linear.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace glu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = 256, kBK = 32, kStages = 4;
using Cta = Roles<false>;

struct BwdCfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBChunkBytes = kBK * 64 * 2,
                            kStageBytes = kABytes + 4 * kBChunkBytes;
  static constexpr uint32_t kGuBoxBytes = kBM * 64 * 2;  // 128 rows x 64 columns of g or u
  static constexpr uint32_t kGuOffset = kStages * kStageBytes, kGuBytes = 8 * kGuBoxBytes;  // g boxes 0-3, u 4-7
  static constexpr uint32_t kBarOffset = kGuOffset + kGuBytes;
  // full and empty per stage; full and empty for g and u
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 2);
};

// A math thread's units in its warpgroup's 64 x 256 block: unit i = 2 c + r is row 8 r and columns
// 32 c .. 32 c + 7 from the thread's first (row 16 warp + lane / 4, column 8 (lane % 4)):
// quad_rows_bf16's layout of accumulator n-tiles 4 c .. 4 c + 3, half r.
constexpr int kUnitsPerThread = 16;

template <GluAct kAct, int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    swiglu_linear_bwd_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_w,
                             const __grid_constant__ CUtensorMap tm_h, __nv_bfloat16* __restrict__ dh,
                             float* __restrict__ dots, const int n, const int f, const int d) {
  using C = BwdCfg;
  extern __shared__ unsigned char smem[];
  const uint32_t stage0 = smem_base_1024(smem), gu0 = stage0 + C::kGuOffset;
  const StagePipe<kStages, kCluster> pipe{stage0, C::kStageBytes, stage0 + C::kBarOffset};
  const uint32_t gu_full = pipe.end(), gu_empty = gu_full + 8;
  const TileGrid<kCluster> grid(n, cdiv(f, kBN));
  const int nk = cdiv(d, kBK);
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    pipe.init();
    mbar_init(gu_full, 1);
    mbar_init(gu_empty, 8);  // one arrival per math warp
    mbar_init_fence();
  }
  barriers_ready<kCluster>();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_dy);
      prefetch_tensor_map(&tm_w);
      prefetch_tensor_map(&tm_h);
      typename StagePipe<kStages, kCluster>::Slot slot;
      // g and u go in after the tile's first `gu_at` stages: a later stage waits for the math
      // warpgroups to take this tile's first, so they are past the last tile's epilogue anyway.
      const int gu_at = (nk < kStages ? nk : kStages) - 1;
      int nt = 0;
      for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
        const int m0 = grid.row0(t), f0 = grid.col_block(t) * kBN;
        for (int kb = 0; kb < nk; ++kb, slot.next()) {
          const uint32_t a = pipe.acquire(slot), b = a + C::kABytes, bar = pipe.full(slot);
          tma_load_4d(a, &tm_dy, bar, kb * kBK, m0, 0, 0);
          if (kCluster == 1) {
#pragma unroll
            for (int c = 0; c < 4; ++c) tma_load_4d(b + c * C::kBChunkBytes, &tm_w, bar, f0 + 64 * c, kb * kBK, 0, 0);
          } else {
#pragma unroll
            for (int c = 2 * static_cast<int>(grid.rank); c < 2 * static_cast<int>(grid.rank) + 2; ++c)
              tma_load_4d_multicast(b + c * C::kBChunkBytes, &tm_w, bar, 3, f0 + 64 * c, kb * kBK, 0, 0);
          }
          if (kb == gu_at) {
            mbar_wait(gu_empty, (nt & 1) ^ 1);  // the first tile's wait is for the phase before the first
            mbar_arrive_expect_tx(gu_full, C::kGuBytes);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              tma_load_4d(gu0 + j * C::kGuBoxBytes, &tm_h, gu_full, f0 + 64 * j, m0, 0, 0);
              tma_load_4d(gu0 + (4 + j) * C::kGuBoxBytes, &tm_h, gu_full, f + f0 + 64 * j, m0, 0, 0);
            }
          }
        }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1, lane = threadIdx.x & 31;
    const int row_in = 64 * w + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);  // the thread's first row in the tile
    typename StagePipe<kStages, kCluster>::Slot slot;
    int nt = 0;
    for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
      float acc[128];
      pipe.matmuls(nk, slot, [&](uint32_t a, int accumulate) {
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          Wgmma<256>::ss<0, 1>(acc, desc_k_major_sw64(a, 64 * w, kk), desc_mn_major(a + C::kABytes, kBK, kk),
                               accumulate || kk > 0);
      });
      fence_regs(acc);
      const int row0 = grid.row0(t) + row_in, col0 = grid.col_block(t) * kBN + 8 * (lane & 3);
      const auto& tiles = reinterpret_cast<const float(&)[kBN / 8][4]>(acc);
      mbar_wait(gu_full, nt & 1);
#pragma unroll
      for (int i = 0; i < kUnitsPerThread; ++i) {
        const uint4 dv = sm80::quad_rows_bf16(tiles, 4 * (i >> 1), i & 1);  // every lane: shuffles
        const int row = row0 + 8 * (i & 1), col = col0 + 32 * (i >> 1);
        if (row >= n || col >= f) continue;  // f is a multiple of 8: a unit is all in or all out
        // The unit in the g and u boxes: box col / 64 of the tile's columns, 16-byte group (col % 64) / 8.
        const int r = row_in + 8 * (i & 1), c = 32 * (i >> 1) + 8 * (lane & 3);
        const uint32_t off = (c >> 6) * C::kGuBoxBytes + chunk_offset(r, (c & 63) >> 3, 0);
        const uint4 gv = ld_shared_v4(gu0 + off), uv = ld_shared_v4(gu0 + 4 * C::kGuBoxBytes + off);
        const uint32_t gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w},
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
        __nv_bfloat16* out = dh + row * (2 * int64_t{f}) + col;
        *reinterpret_cast<uint4*>(out) = make_uint4(dgs[0], dgs[1], dgs[2], dgs[3]);
        *reinterpret_cast<uint4*>(out + f) = make_uint4(dus[0], dus[1], dus[2], dus[3]);
        if (dots) dots[int64_t{row} * (f / 8) + col / 8] = dot;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(gu_empty);  // this warp's reads of g and u are done
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
  const CUtensorMap tm_dy = matrix_map(dy.ptr, n, d, d, 1, 0, kBM, kBK);
  const CUtensorMap tm_w = matrix_map(w.ptr, d, f, f, 1, 0, kBK, 64);
  const CUtensorMap tm_h = matrix_map(h.ptr, n, 2 * f, 2 * f, 1, 0, kBM, 64);
  const int tiles = cdiv(cdiv(static_cast<int>(n), kBM), kCluster) * cdiv(static_cast<int>(f), kBN);
  launch_clusters<kCluster>(swiglu_linear_bwd_kernel<kAct, kCluster>, tiles, C::kSmem, cuda::stream_of(ctx), tm_dy,
                            tm_w, tm_h, dh.data<__nv_bfloat16>(), dots, static_cast<int>(n), static_cast<int>(f),
                            static_cast<int>(d));
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
