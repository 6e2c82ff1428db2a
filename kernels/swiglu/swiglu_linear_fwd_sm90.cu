// Hopper up-projection with the gate in its epilogue (math in swiglu_linear.h):
//   h = x W_in^T    (f32 accumulation, rounded to bf16)
//   a = act(g) * u  from that rounded h, as swiglu_fwd computes it
// Layout: x [N, d], W_in [2F, d] (gate rows [0, F), value rows [F, 2F)), h [N, 2F], a [N, F]; bf16.
//
// Output tile: rows m0 .. m0 + 127 and gate columns f0 .. f0 + 127 with the same value columns:
// B is 128 gate rows of W_in followed by the 128 value rows, so a math warpgroup's 64 x 256
// accumulator (wgmma m64n256k16) is [g | u] of its 64 rows at these columns. k runs in steps of 32
// (64-byte rows, 64-byte swizzle) through six stages of A = x [128, 32] and B [256, 32], both
// K-major. The TMA reads W_in's rows past F as zero (W_in is mapped as [2, F, d]). In clusters of
// 2, rank 0 loads the gate half of each B stage and rank 1 the value half, each multicast to both.
// Per math warpgroup a staging block of g (chunks 0-1) and u (2-3) of its 64 rows as it dumped
// them; the epilogue warps read 8 columns of a row of g and u at a time, compute a, and store g, u
// and a straight from registers (rows past N and columns past F are not stored).
// Why not TMA stores from shared memory: the two math warpgroups' wgmmas read ~960 KB of shared
// memory per tile and the operand copies write ~576 KB, near the 128 bytes per cycle an SM's
// shared memory moves; staging a and reading g, u, a back for the copy engine added 128 KB per tile,
// and its two extra chunks per warpgroup took the room of a sixth operand stage. Clock counters in
// the kernel (H100, 125M layer) had the math warpgroups waiting for operands through ~40% of each
// tile with five stages.
#include <algorithm>

#include "common/gemm_sm90.cuh"
#include "swiglu/swiglu_linear.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace glu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBF = 128;  // gate columns per tile
using Cta = Roles<false>;

// k-steps of 32 (64-byte rows): six stages fit next to the staging blocks; three of 64 measured
// slower (H200: 328 vs 277 us for the matmuls alone with five of 32 at N = 32768, d = 768, F = 2048).
constexpr int kBK = 32, kStages = 6;

struct FwdCfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = 2 * kBF * kBK * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kStagingBytes = 4 * kChunkBytes;  // per math warpgroup: g, u
  static constexpr uint32_t kBarOffset = kStages * kStageBytes + 2 * kStagingBytes;
  // full and empty per stage, staged and free per math warpgroup
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 4);
};

template <GluAct kAct, int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    swiglu_linear_fwd_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                             __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ a, const int n, const int f,
                             const int d) {
  using C = FwdCfg;
  extern __shared__ unsigned char smem[];
  const FusedSmem<C, kStages, kCluster> sm(smem);
  const auto& [pipe, hs] = sm;
  const TileGrid<kCluster> grid(n, cdiv(f, kBF));
  const int nk = cdiv(d, kBK);
  const int wg = warpgroup_index();
  sm.init_barriers();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_x);
      prefetch_tensor_map(&tm_w);
      // W's gate and up rows of the tile are the two halves (the tensor map's third coordinate).
      load_stages(pipe, grid, nk, [&](int t) {
        const int m0 = grid.row0(t), f0 = grid.col_block(t) * kBF;
        return [&, m0, f0](uint32_t stage, uint32_t bar, int kb) {
          tma_load_4d(stage, &tm_x, bar, kb * kBK, m0, 0, 0);
          load_weight_halves<kCluster>(stage + C::kABytes, &tm_w, bar, C::kBBytes / 2, grid.rank,
                                       [&](int half) { return make_int4(kb * kBK, f0, half, 0); });
        };
      });
    } else if (threadIdx.x >= 32) {
      // Epilogue warps: thread e takes units e, e + 96, ... (8 columns of a row) of each block.
      const int e = epilogue_thread();
      int nt = 0;
      for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
        for (int w = 0; w < 2; ++w) {
          const uint32_t st = hs.block(w, nt);
          const int row0 = grid.row0(t) + 64 * w, f0 = grid.col_block(t) * kBF;
          hs.wait_staged(w, nt);
          for (int u = e; u < kUnits; u += Cta::kEpilogueThreads) {
            const uint32_t off = unit_offset(u);
            const uint4 gv = ld_shared_v4(st + off), uv = ld_shared_v4(st + 2 * kChunkBytes + off);
            const int64_t row = row0 + (u >> 4);
            const int col = f0 + 8 * (u & 15);
            if (row >= n || col >= f) continue;  // f is a multiple of 8: a unit is all in or all out
            const uint32_t gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w};
            uint32_t as[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 g2 = unpack_bf16(gs[i]), u2 = unpack_bf16(us[i]);
              as[i] = pack_bf16(cuda::swiglu<kAct>(g2.x, u2.x), cuda::swiglu<kAct>(g2.y, u2.y));
            }
            __nv_bfloat16* hg = h + row * (2 * int64_t{f}) + col;
            __stcs(reinterpret_cast<uint4*>(hg), gv);
            __stcs(reinterpret_cast<uint4*>(hg + f), uv);
            __stcs(reinterpret_cast<uint4*>(a + row * f + col), make_uint4(as[0], as[1], as[2], as[3]));
          }
          hs.release(w, nt);
        }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1;
    math_k_major<2 * kBF, kBK>(pipe, grid, nk, C::kABytes, hs, w);
  }
  if (kCluster > 1) cluster_sync();  // no CTA leaves while another may still arrive on its barriers
}

template <GluAct kAct, int kCluster>
void launch_in_clusters(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& h, const Tensor& a) {
  using C = FwdCfg;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  const int64_t n = x.size(0), d = x.size(1), f = a.size(1);
  const CUtensorMap tm_x = matrix_map(x.ptr, n, d, d, 1, 0, kBM, kBK);
  const CUtensorMap tm_w = matrix_map(w.ptr, f, d, d, 2, f * d, kBF, kBK);
  const int tiles = cdiv(cdiv(static_cast<int>(n), kBM), kCluster) * cdiv(static_cast<int>(f), kBF);
  launch_clusters<kCluster>(swiglu_linear_fwd_kernel<kAct, kCluster>, tiles, C::kSmem, cuda::stream_of(ctx), tm_x,
                            tm_w, h.data<__nv_bfloat16>(), a.data<__nv_bfloat16>(), static_cast<int>(n),
                            static_cast<int>(f), static_cast<int>(d));
}

template <GluAct kAct>
void launch(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& h, const Tensor& a) {
  if (::linac::swiglu_linear_cluster() == 2)
    launch_in_clusters<kAct, 2>(ctx, x, w, h, a);
  else
    launch_in_clusters<kAct, 1>(ctx, x, w, h, a);
}

}  // namespace
}  // namespace glu_sm90

void swiglu_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w_in, const Tensor& h, const Tensor& a,
                            GluAct act) {
  LINAC_CHECK(x.size(0) < (int64_t{1} << 31) - glu_sm90::kBM, "swiglu_linear_fwd: too many rows for one call");
  if (act == GluAct::Silu)
    glu_sm90::launch<GluAct::Silu>(ctx, x, w_in, h, a);
  else
    glu_sm90::launch<GluAct::Identity>(ctx, x, w_in, h, a);
}

}  // namespace linac
