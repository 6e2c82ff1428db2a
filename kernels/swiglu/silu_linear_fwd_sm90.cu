// Hopper projection whose epilogue applies SiLU to its output columns from c0 on (math in
// swiglu_linear.h, silu_linear_fwd; the Transformer-VQ GAU's input projection [Qr | Kr | V'] and
// V = SiLU(V')):
//   y = x W^T                       (f32 accumulation, rounded to bf16)
//   a[:, j] = silu(y[:, c0 + j])    from that rounded y, as silu_fwd computes it (the same bits)
// Layout: x [N, d], W [M, d], y [N, M], a [N, M - c0], contiguous, bf16; c0 a multiple of 8.
//
// Output tile: rows m0 .. m0 + 127 and columns c .. c + 255; a math warpgroup's 64 x 256
// accumulator (wgmma m64n256k16). k runs in steps of 32 (64-byte rows, 64-byte swizzle) through six
// stages of A = x [128, 32] and B = W [256, 32] (two boxes of 128 rows), both K-major, as in the
// SwiGLU up-projection (swiglu_linear_fwd_sm90.cu), whose operand pipeline and staging this shares.
// The TMA reads W's rows past M as zero. In clusters of 2, rank r loads B's box r of each stage and
// multicasts it to both CTAs. The epilogue warps read 8 columns of a row at a time from the staging
// block and store them to y and, at or past c0, their SiLU to a; four units per thread at a time,
// each phase branch-free, so that the units' latencies overlap.
//
// The epilogue stores twice the SwiGLU up-projection's columns per tile and applies SiLU to twice
// as many, on the same three warps, so the GEMM runs at ~520 TFLOP/s where that one reaches
// 660-740 (H200, kernels/vq_attn/NOTES.md); it still beats the GEMM and a separate SiLU pass. A
// variant that also multiplied by a value read from memory (the GAU's gate) ran slower than its
// two kernels and was not kept.
#include "activation/sigmoid.cuh"
#include "common/gemm_sm90.cuh"
#include "swiglu/swiglu_linear.h"

namespace linac {
namespace silu_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = 256;  // output columns per tile
using Cta = Roles<false>;
constexpr int kBK = 32, kStages = 6;
constexpr int kBlockUnits = 2 * kUnits;  // a staging block: 64 rows x 256 columns, 8 columns a unit
constexpr int kBatch = 4;                // units per epilogue thread in flight together

struct Cfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kStagingBytes = 4 * kChunkBytes;  // per math warpgroup: its 64 x 256 outputs
  static constexpr uint32_t kBarOffset = kStages * kStageBytes + 2 * kStagingBytes;
  // full and empty per stage, staged and freed per math warpgroup
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 4);
};

struct Out {
  __nv_bfloat16* y;
  __nv_bfloat16* a;
  int n, m, c0, d;
};

template <int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    silu_linear_fwd_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                           const Out o) {
  using C = Cfg;
  extern __shared__ unsigned char smem[];
  const FusedSmem<C, kStages, kCluster> sm(smem);
  const auto& [pipe, hs] = sm;
  const TileGrid<kCluster> grid(o.n, cdiv(o.m, kBN));
  const int nk = cdiv(o.d, kBK);
  const int wg = warpgroup_index();
  sm.init_barriers();

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_x);
      prefetch_tensor_map(&tm_w);
      load_stages(pipe, grid, nk, [&](int t) {
        const int m0 = grid.row0(t), c = grid.col_block(t) * kBN;
        return [&, m0, c](uint32_t stage, uint32_t bar, int kb) {
          tma_load_4d(stage, &tm_x, bar, kb * kBK, m0, 0, 0);
          load_weight_halves<kCluster>(stage + C::kABytes, &tm_w, bar, C::kBBytes / 2, grid.rank,
                                       [&](int half) { return make_int4(kb * kBK, c + half * (kBN / 2), 0, 0); });
        };
      });
    } else if (threadIdx.x >= 32) {
      // Epilogue warps: thread e takes units e, e + 96, ... of each math warpgroup's block.
      const int e = epilogue_thread();
      int nt = 0;
      for (int t = grid.first(); t < grid.count; t += grid.step(), ++nt) {
        const int row0 = grid.row0(t), c = grid.col_block(t) * kBN;
        for (int w = 0; w < 2; ++w) {
          const uint32_t st = hs.block(w, nt);
          hs.wait_staged(w, nt);
          for (int base = e; base < kBlockUnits; base += kBatch * Cta::kEpilogueThreads) {
            // A batch in phases (its staged y, y's stores, SiLU, a's stores).
            uint4 yv[kBatch];
            int64_t at_y[kBatch], at_a[kBatch];  // -1: nothing to store
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              const int u = base + b * Cta::kEpilogueThreads;
              const int row = row0 + 64 * w + ((u & 1023) >> 4), col = c + 128 * (u >> 10) + 8 * (u & 15);
              // m and c0 are multiples of 8: a unit is all in or all out, all through SiLU or not
              const bool in = u < kBlockUnits && row < o.n && col < o.m;
              at_y[b] = in ? int64_t{row} * o.m + col : -1;
              at_a[b] = in && col >= o.c0 ? int64_t{row} * (o.m - o.c0) + (col - o.c0) : -1;
              yv[b] = u < kBlockUnits ? ld_shared_v4(st + (u >> 10) * 2 * kChunkBytes + unit_offset(u & 1023))
                                      : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int b = 0; b < kBatch; ++b)
              if (at_y[b] >= 0) __stcs(reinterpret_cast<uint4*>(o.y + at_y[b]), yv[b]);
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              uint32_t ys[4] = {yv[b].x, yv[b].y, yv[b].z, yv[b].w};
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float2 v = unpack_bf16(ys[i]);
                ys[i] = pack_bf16(v.x * cuda::sigmoid(v.x), v.y * cuda::sigmoid(v.y));
              }
              yv[b] = make_uint4(ys[0], ys[1], ys[2], ys[3]);
            }
#pragma unroll
            for (int b = 0; b < kBatch; ++b)
              if (at_a[b] >= 0) __stcs(reinterpret_cast<uint4*>(o.a + at_a[b]), yv[b]);
          }
          hs.release(w, nt);
        }
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1;
    math_k_major<kBN, kBK>(pipe, grid, nk, C::kABytes, hs, w);
  }
  if (kCluster > 1) cluster_sync();  // no CTA leaves while another may still arrive on its barriers
}

template <int kCluster>
void launch_in_clusters(const Ctx& ctx, const Tensor& x, const Tensor& w, const Out& o) {
  using C = Cfg;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  const CUtensorMap tm_x = matrix_map(x.ptr, o.n, o.d, o.d, 1, 0, kBM, kBK);
  const CUtensorMap tm_w = matrix_map(w.ptr, o.m, o.d, o.d, 1, 0, kBN / 2, kBK);
  const int tiles = cdiv(cdiv(o.n, kBM), kCluster) * cdiv(o.m, kBN);
  launch_clusters<kCluster>(silu_linear_fwd_kernel<kCluster>, tiles, C::kSmem, cuda::stream_of(ctx), tm_x, tm_w, o);
}

void launch(const Ctx& ctx, const Tensor& x, const Tensor& w, const Out& o) {
  if (::linac::swiglu_linear_cluster() == 2)
    launch_in_clusters<2>(ctx, x, w, o);
  else
    launch_in_clusters<1>(ctx, x, w, o);
}

}  // namespace
}  // namespace silu_sm90

void silu_linear_fwd_sm90(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a,
                          int64_t c0) {
  LINAC_CHECK(x.size(0) < (int64_t{1} << 31) - gemm_sm90::kBM, "silu_linear_fwd: too many rows for one call");
  silu_sm90::launch(ctx, x, w,
                    {y.data<__nv_bfloat16>(), a.data<__nv_bfloat16>(), static_cast<int>(x.size(0)),
                     static_cast<int>(w.size(0)), static_cast<int>(c0), static_cast<int>(x.size(1))});
}

}  // namespace linac
