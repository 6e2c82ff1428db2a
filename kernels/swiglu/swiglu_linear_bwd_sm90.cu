// Hopper backward through W_out and the gate (math in swiglu_linear.h):
//   da = dy W_out           (f32 accumulation, rounded to bf16; never written to memory)
//   dh = swiglu_bwd(h, da)  from that rounded da, as swiglu_bwd computes it
//   dots (optional)         swiglu_value_dots(h, dh): per 8-column unit, sum du u of the rounded du
// Layout: dy [N, d], W_out [d, F], h and dh [N, 2F] (g | u, dg | du); bf16. dots [N, F / 8] f32.
//
// Output tile: rows m0 .. m0 + 127 and columns f0 .. f0 + 255 of da; a math warpgroup's 64 x 256
// accumulator (wgmma m64n256k16). k runs in steps of 32 through nine stages of A = dy [128, 32]
// (K-major, 64-byte rows and swizzle) and B = W_out [32, 256] as four 64-column chunks (MN-major:
// W_out's rows run along k). In clusters of 2, rank r loads B's chunks 2r and 2r + 1 of each stage
// and multicasts them to both CTAs.
//
// The math warpgroups run the epilogue themselves, on their accumulators in registers, while the
// loading thread fills the stages of the next tile: the accumulators are rounded to bf16 and
// transposed within each quad of lanes so that a lane holds 8 consecutive columns of a row
// (quad_rows_bf16: a unit), whose g and u it loads and whose dg and du it stores, 16 bytes each.
// The tile's g and u were brought into L2 as its matmuls began. Why not epilogue warps beside the
// matmuls, as the forward has: the gate's epilogue moves 8 bytes per output (g and u in, dg and du
// out) and waits on global loads, so it needs many warps, and the accumulators of a 128 x 256 tile
// leave the registers of only three. The earlier kernel (128 x 128 tiles, seven epilogue warps
// in a 512-thread CTA) kept its epilogue hidden but its tiles small: every k-step its wgmmas read
// 48 KB of shared memory and its copies wrote 32 KB for 2.1 MFLOP, where 128 x 256 tiles read
// 40 KB and write 24 KB for the same work (an SM's shared memory moves 128 bytes per cycle; the
// tensor cores do 4,096 FLOP per cycle).
#include <algorithm>

#include "common/gemm_sm90.cuh"
#include "common/mma_sm80.cuh"
#include "swiglu/swiglu_linear.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace glu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = 256, kBK = 32, kStages = 9;
using Cta = Roles<false>;

struct BwdCfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBChunkBytes = kBK * 64 * 2,
                            kStageBytes = kABytes + 4 * kBChunkBytes;
  static constexpr uint32_t kBarOffset = kStages * kStageBytes;
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * 2 * kStages;  // full and empty per stage
};

// A math thread's units in its warpgroup's 64 x 256 block: unit i = 2 c + r is row 8 r and columns
// 32 c .. 32 c + 7 from the thread's first (row 16 warp + lane / 4, column 8 (lane % 4)):
// quad_rows_bf16's layout of accumulator n-tiles 4 c .. 4 c + 3, half r.
constexpr int kUnitsPerThread = 16;
// Units whose g and u are loaded ahead of the one being computed: the loads come from L2 (~600
// cycles under load) and the registers beside the accumulators hold about two units' worth.
constexpr int kAhead = 2;

template <GluAct kAct, int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    swiglu_linear_bwd_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_w,
                             const __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ dh,
                             float* __restrict__ dots, const int n, const int f, const int d) {
  using C = BwdCfg;
  extern __shared__ unsigned char smem[];
  const uint32_t stage0 = smem_base_1024(smem);
  const StagePipe<kStages, kCluster> pipe{stage0, C::kStageBytes, stage0 + C::kBarOffset};
  const TileGrid<kCluster> grid(n, cdiv(f, kBN));
  const int nk = cdiv(d, kBK);
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    pipe.init();
    mbar_init_fence();
  }
  barriers_ready<kCluster>();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_dy);
      prefetch_tensor_map(&tm_w);
      typename StagePipe<kStages, kCluster>::Slot slot;
      for (int t = grid.first(); t < grid.count; t += grid.step()) {
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
        }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1, lane = threadIdx.x & 31, tid = threadIdx.x & 127;
    typename StagePipe<kStages, kCluster>::Slot slot;
    for (int t = grid.first(); t < grid.count; t += grid.step()) {
      const int block_row = grid.row0(t) + 64 * w, f0 = grid.col_block(t) * kBN;
      // The block's g and u into L2: 64 rows of 4 + 4 128-byte lines, 4 per thread.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int line = tid + 128 * j, row = block_row + (line >> 3), col = f0 + 64 * (line & 3);
        if (row < n && col < f) prefetch_l2(h + row * (2 * int64_t{f}) + col + (line & 4 ? f : 0));
      }
      float acc[128];
      pipe.matmuls(nk, slot, [&](uint32_t a, int accumulate) {
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          Wgmma<256>::ss<0, 1>(acc, desc_k_major_sw64(a, 64 * w, kk), desc_mn_major(a + C::kABytes, kBK, kk),
                               accumulate || kk > 0);
      });
      fence_regs(acc);
      const int row0 = block_row + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2), col0 = f0 + 8 * (lane & 3);
      // Offset of unit i's g in h (its u is f further; dg, du at the same places in dh); -1 where
      // the unit is past the matrix (f is a multiple of 8: a unit is all in or all out).
      auto unit_at = [&](int i) -> int64_t {
        const int row = row0 + 8 * (i & 1), col = col0 + 32 * (i >> 1);
        return row < n && col < f ? row * (2 * int64_t{f}) + col : -1;
      };
      uint4 gv[kUnitsPerThread], uv[kUnitsPerThread];
      auto load = [&](int i) {
        const int64_t at = unit_at(i);
        gv[i] = at >= 0 ? __ldcs(reinterpret_cast<const uint4*>(h + at)) : make_uint4(0, 0, 0, 0);
        uv[i] = at >= 0 ? __ldcs(reinterpret_cast<const uint4*>(h + at + f)) : make_uint4(0, 0, 0, 0);
      };
#pragma unroll
      for (int i = 0; i < kAhead; ++i) load(i);
      const auto& tiles = reinterpret_cast<const float(&)[kBN / 8][4]>(acc);
#pragma unroll
      for (int i = 0; i < kUnitsPerThread; ++i) {
        if (i + kAhead < kUnitsPerThread) load(i + kAhead);
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
  const CUtensorMap tm_dy = matrix_map(dy.ptr, n, d, d, 1, 0, kBM, kBK);
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
