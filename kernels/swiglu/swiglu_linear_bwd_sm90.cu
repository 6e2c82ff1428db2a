// Hopper backward through W_out and the gate (math in swiglu_linear.h):
//   da = dy W_out           (f32 accumulation, rounded to bf16; never written to memory)
//   dh = swiglu_bwd(h, da)  from that rounded da, as swiglu_bwd computes it
//   dots (optional)         swiglu_value_dots(h, dh): per 8-column unit, sum du u of the rounded du
// Layout: dy [N, d], W_out [d, F], h and dh [N, 2F] (g | u, dg | du); bf16. dots [N, F / 8] f32.
//
// Output tile: rows m0 .. m0 + 127 and columns f0 .. f0 + 127 of da; a math warpgroup's 64 x 128
// accumulator (wgmma m64n128k16). k runs in steps of 64 through kStages stages of A = dy [128, 64]
// (K-major) and B = W_out [64, 128] as two 64-column chunks (MN-major: W_out's rows run along k).
// Per math warpgroup w two staging blocks for da (two chunks each), which it dumps alternate tiles
// into. The epilogue runs on seven warps (a wide kernel, gemm_sm90.cuh): each thread reads da of its
// units (8 columns of a row) into registers, the warp hands the block back to the math warpgroup,
// and the thread computes dg, du from g and u that it loaded from global memory into registers
// while the block was being computed, and stores them straight to global memory. Keeping h out of
// shared memory leaves room for five operand stages next to the four staging blocks: clock
// counters in the kernel had the math warpgroups waiting for their operands through ~55% of each
// tile with four stages and one block per warpgroup (H100: 125M layer, 12 k-steps per tile,
// ~14,000 cycles per tile of which ~5,000 are matmuls). With one block per warpgroup and six
// stages, Nsight Compute's samples had the math warpgroups waiting ~10% of their time for the
// epilogue to free the block and the epilogue ~13% for the next one: 237.9 -> 235.1 us (H100).
// In clusters of 2, rank r loads B's 64-column chunk r of each stage and multicasts it to both CTAs.
#include <algorithm>

#include "common/gemm_sm90.cuh"
#include "swiglu/swiglu_linear.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace glu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = 128, kBK = 64, kStages = 5, kBuffers = 2;
using Cta = Roles<true>;
constexpr int kUnitsPerThread = cdiv(kUnits, Cta::kEpilogueThreads);

struct BwdCfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBK * kBN * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kStagingBytes = 2 * kChunkBytes;  // a staging block: da of 64 rows
  static constexpr uint32_t kBarOffset = kStages * kStageBytes + 2 * kBuffers * kStagingBytes;
  // full and empty per stage; staged and freed per staging block
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 4 * kBuffers);
};

template <GluAct kAct, int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    swiglu_linear_bwd_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_w,
                             const __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ dh,
                             float* __restrict__ dots, const int n, const int f, const int d) {
  using C = BwdCfg;
  extern __shared__ unsigned char smem[];
  const FusedSmem<C, kStages, kCluster, true, kBuffers> sm(smem);
  const auto& [pipe, hs] = sm;
  const TileGrid<kCluster> grid(n, cdiv(f, kBN));
  const int nk = cdiv(d, kBK);
  const int wg = warpgroup_index();
  sm.init_barriers();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_dy);
      prefetch_tensor_map(&tm_w);
      // W_out as stored ([d, f], MN-major here): the tile's 128 columns in two boxes of 64.
      load_stages(pipe, grid, nk, [&](int t) {
        const int m0 = grid.row0(t), f0 = grid.col_block(t) * kBN;
        return [&, m0, f0](uint32_t stage, uint32_t bar, int kb) {
          tma_load_4d(stage, &tm_dy, bar, kb * kBK, m0, 0, 0);
          load_weight_halves<kCluster>(stage + C::kABytes, &tm_w, bar, C::kBBytes / 2, grid.rank,
                                       [&](int half) { return make_int4(f0 + 64 * half, kb * kBK, 0, 0); });
        };
      });
    } else if (threadIdx.x >= 32) {
      // Epilogue warps: dg, du from g, u and da, 8 columns of a row per unit; thread e takes units
      // e, e + 224, ... of each math warpgroup's block. g and u come from global memory into
      // registers, the next block's loads issued as soon as this block's results are out. Both
      // math warpgroups finish a tile at once, so block 1's loads would wait out a whole DRAM
      // latency: block 0 starts by prefetching them into L2 (H100, 125M layer: 245 -> 232 us).
      // Loading each unit's next g and u right after its results went out instead measured 362
      // us: loads share a warp's few scoreboards, so waiting for a unit's old loads also waited for
      // the new ones issued since.
      const int e = epilogue_thread();
      uint4 gv[kUnitsPerThread], uv[kUnitsPerThread];
      // Address of unit i's g in h (its u is f further; dg, du at the same places in dh); -1 where
      // the unit is past the matrix (f is a multiple of 8: a unit is all in or all out).
      auto unit_at = [&](int t, int w, int i) -> int64_t {
        const int u = e + i * Cta::kEpilogueThreads;
        const int64_t row = grid.row0(t) + 64 * w + (u >> 4);
        const int col = grid.col_block(t) * kBN + 8 * (u & 15);
        return u < kUnits && row < n && col < f ? row * (2 * int64_t{f}) + col : -1;
      };
      auto load_gu = [&](int t, int w) {
#pragma unroll
        for (int i = 0; i < kUnitsPerThread; ++i) {
          const int64_t at = unit_at(t, w, i);
          if (at >= 0) {
            gv[i] = __ldcs(reinterpret_cast<const uint4*>(h + at));
            uv[i] = __ldcs(reinterpret_cast<const uint4*>(h + at + f));
          }
        }
      };
      // Called by one thread per 128-byte line of g and of u (8 units: e % 8 == 0).
      auto prefetch_gu = [&](int t, int w) {
#pragma unroll
        for (int i = 0; i < kUnitsPerThread; ++i) {
          const int64_t at = unit_at(t, w, i);
          if (at >= 0) {
            prefetch_l2(h + at);
            prefetch_l2(h + at + f);
          }
        }
      };
      if (grid.first() < grid.count) load_gu(grid.first(), 0);
      int nt = 0;
      for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
        for (int w = 0; w < 2; ++w) {
          const uint32_t dab = hs.block(w, nt);
          hs.wait_staged(w, nt);
          if (w == 0 && e % 8 == 0) prefetch_gu(t, 1);
          uint4 dv[kUnitsPerThread];
#pragma unroll
          for (int i = 0; i < kUnitsPerThread; ++i) {
            const int u = e + i * Cta::kEpilogueThreads;
            if (u < kUnits) dv[i] = ld_shared_v4(dab + unit_offset(u));
          }
          hs.release(w, nt);
#pragma unroll
          for (int i = 0; i < kUnitsPerThread; ++i) {
            const int64_t at = unit_at(t, w, i);
            if (at < 0) continue;
            const uint32_t gs[4] = {gv[i].x, gv[i].y, gv[i].z, gv[i].w}, us[4] = {uv[i].x, uv[i].y, uv[i].z, uv[i].w},
                           ds[4] = {dv[i].x, dv[i].y, dv[i].z, dv[i].w};
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
            if (dots) {
              const int u = e + i * Cta::kEpilogueThreads;
              const int64_t row = grid.row0(t) + 64 * w + (u >> 4);
              dots[row * (f / 8) + grid.col_block(t) * (kBN / 8) + (u & 15)] = dot;
            }
          }
          if (w == 0)
            load_gu(t, 1);
          else if (t + grid.step() < grid.count)
            load_gu(t + grid.step(), 0);
        }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1;
    math_tiles<128>(pipe, grid, nk, hs, w,
                    [&](float(&acc)[64], uint32_t a, int accumulate) {
#pragma unroll
                      for (int kk = 0; kk < kBK / 16; ++kk)
                        Wgmma<128>::ss<0, 1>(acc, desc_k_major(a, 0, 64 * w, kk),
                                             desc_mn_major(a + C::kABytes, kBK, kk), accumulate || kk > 0);
                    });
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
  launch_clusters<kCluster, true>(swiglu_linear_bwd_kernel<kAct, kCluster>, tiles, C::kSmem, cuda::stream_of(ctx),
                                  tm_dy, tm_w, h.data<__nv_bfloat16>(), dh.data<__nv_bfloat16>(), dots,
                                  static_cast<int>(n), static_cast<int>(f), static_cast<int>(d));
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
