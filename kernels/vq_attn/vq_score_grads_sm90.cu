// Hopper dP GEMMs of the VQ-attention backward with the score gradients in their epilogue (math:
// docs/transformer_vq.md §4.1; vq_attn_bwd.cu's warp-per-row kernel computes the same from f32
// dP matrices in global memory). For the chunk of blocks [i0, i0 + c) of the packed layout
// (vq_packed.h), query row l of block i, window entry e (key (i-1) Lb + e) and cache entry s:
//   dpwin[l, e]   = dout_i[l] . v[(i-1) Lb + e]       dpcache[l, s] = dout_i[l] . ubar_i[s]
//   gs            = p (dp - delta_l), 0 where p is 0  (p: the forward's saved weights)
// written as the backward's later GEMMs read them: gswin [rows, ldw] and gscache [rows, lds]
// query-major, gpos[l, hi - e] = gswin[l, e] for l <= e <= hi = Lb + l (zero past Lb), and the
// window weights again, key-major (Ws::pwin) for the dv GEMM.
// Layout: dout rows at stride ldo, v [P Tp, Dv], ubar [NB S, Dv], bf16; Lb and Dv multiples of 8.
//
// Output tiles of 128 query rows of one block (a block is ceil(Lb / 128) row tiles, rows past Lb
// not stored) by 256 entries, the window's column tiles then the cache's; roles, operand pipeline
// and staging of common/gemm_sm90.cuh, k = Dv in steps of 32. B is the tile's 256 rows of v (from
// row (i-1) Lb + e0: at block 0 the TMA reads the rows before the matrix as zeros, and at any
// pair's first block p is 0 there) or of ubar (from i S + s0). Where a block has an even number of
// row tiles, clusters of 2 take adjacent row tiles of one block and multicast B. Tiles where p is 0
// for all the cluster's rows (window tiles of future keys only, and of the previous block at a
// pair's first block: a sixth of all tiles at Lb = 512 and 4 blocks a pair; the cache's tiles in a
// pair's first two blocks, whose caches are empty: another sixth there) are not computed: the
// epilogue warps store their zeros (the tiles' order: vq_score_grads_tiles.h).
// The tile's p [128, 256] comes by TMA into a buffer laid out as the staging blocks (64 x 64
// chunks, 128-byte swizzle; entries past S read as zero), issued by an epilogue thread as soon as
// the epilogue is done with the previous tile's (the math warps read theirs before staging), so
// it never holds up the operand loads. The math warpgroups form gs = p (acc - delta) from their
// f32 accumulators, as the rows kernel does from f32 dP, and stage it in bf16; the epilogue warps
// store it (and by distance) and p key-major. Loading p from global memory in the
// epilogue warps instead (two 16-byte loads in flight per thread) left the kernel at 418 us for
// the 190M model's layer, slower than the GEMMs and the rows kernel (H200, 2026-12-03).
#include "common/gemm_sm90.cuh"
#include "vq_attn/vq_common.cuh"
#include "vq_attn/vq_score_grads_tiles.h"

namespace linac {
namespace vq_score_grads_sm90 {
using namespace gemm_sm90;
namespace {

constexpr int kBN = kTileEntries;  // entries per tile
static_assert(kTileRows == kBM, "vq_score_grads_tiles.h counts the GEMM's row tiles");
using Cta = Roles<false>;
constexpr int kBK = 32, kStages = 4;     // four stages: the p buffer takes the other two's room
constexpr int kBlockUnits = 2 * kUnits;  // a staging block: 64 rows x 256 entries, 8 a unit
constexpr int kBatch = 4;                // units per epilogue thread in flight together

struct Cfg {
  static constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kStagingBytes = 4 * kChunkBytes;  // per math warpgroup: its 64 x 256 outputs
  static constexpr uint32_t kPOffset = kStages * kStageBytes + 2 * kStagingBytes;  // p: two blocks as staged
  static constexpr uint32_t kBarOffset = kPOffset + 2 * kStagingBytes;
  // full and empty per stage, staged and freed per math warpgroup, p loaded
  static constexpr size_t kSmem = 1024 + kBarOffset + 8 * (2 * kStages + 4 + 1);
};

struct Args : TileOrder {
  int S, nk;  // cache entries; k-steps
  int ldw, lds, ldp, ldkey;
  const float* delta;                            // [P Tp], at the packed rows
  __nv_bfloat16 *gswin, *gscache, *gpos, *pwin;  // the chunk's (rows from its first block's)
};

// Tile t: global block, first row in it, window or cache, first entry.
struct Tile {
  int64_t ib;
  int l0, e0;
  bool window;
};

// The tiles in the order of vq_score_grads_tiles.h: the computed ones first.
template <int kCluster>
struct Grid : TileGrid<kCluster> {
  const Args& a;
  __device__ explicit Grid(const Args& a_) : TileGrid<kCluster>(a_.c * a_.tpb * kBM, a_.cols), a(a_) {}
  __device__ Tile tile(int t) const {
    const TileAt at = tile_at(a, t, kCluster);
    const int rb = at.group * kCluster + static_cast<int>(this->rank);
    Tile x;
    x.ib = a.i0 + rb / a.tpb;
    x.l0 = rb % a.tpb * kBM;
    x.window = at.col < a.cw;
    x.e0 = (x.window ? at.col : at.col - a.cw) * kBN;
    return x;
  }
  __device__ bool skip(int t) const { return t >= a.computed; }
  // The first tile from t on that is computed (count if none).
  __device__ int next(int t) const { return t < a.computed ? t : this->count; }
};

__device__ __forceinline__ void st16(__nv_bfloat16* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

template <int kCluster>
__global__ void __launch_bounds__(Cta::kThreads, 1)
    vq_score_grads_kernel(const __grid_constant__ CUtensorMap tm_dout, const __grid_constant__ CUtensorMap tm_v,
                          const __grid_constant__ CUtensorMap tm_ubar, const __grid_constant__ CUtensorMap tm_pwin,
                          const __grid_constant__ CUtensorMap tm_pcache, const __grid_constant__ Args a) {
  using C = Cfg;
  extern __shared__ unsigned char smem[];
  const FusedSmem<C, kStages, kCluster> sm(smem);
  const auto& [pipe, hs] = sm;
  const uint32_t p0 = pipe.stage0 + C::kPOffset;
  const uint32_t p_full = hs.end();
  const int W = 2 * a.Lb;
  const Grid<kCluster> grid(a);
  const int wg = warpgroup_index();
  sm.init_barriers(1);  // p_full

  if (!math_warpgroup(wg)) {
    regs_dealloc<Cta::kLoadRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&tm_dout);
      prefetch_tensor_map(&tm_v);
      prefetch_tensor_map(&tm_ubar);
      prefetch_tensor_map(&tm_pwin);
      prefetch_tensor_map(&tm_pcache);
      load_stages(pipe, grid, a.nk, [&](int t) {
        const Tile x = grid.tile(t);
        const int arow = static_cast<int>(x.ib * a.Lb + x.l0);
        const int brow = static_cast<int>(x.window ? (x.ib - 1) * a.Lb + x.e0 : x.ib * a.S + x.e0);
        const CUtensorMap* tm_b = x.window ? &tm_v : &tm_ubar;
        return [&, arow, brow, tm_b](uint32_t stage, uint32_t bar, int kb) {
          tma_load_4d(stage, &tm_dout, bar, kb * kBK, arow, 0, 0);
          load_weight_halves<kCluster>(stage + C::kABytes, tm_b, bar, C::kBBytes / 2, grid.rank,
                                       [&](int half) { return make_int4(kb * kBK, brow + half * (kBN / 2), 0, 0); });
        };
      });
    } else if (threadIdx.x >= 32) {
      // Epilogue warps: thread e takes units e, e + 96, ... of each math warpgroup's block.
      const int e = epilogue_thread();
      const int64_t ks = 2 * int64_t{a.Lb} * a.ldkey;  // vq_cuda::key_slot_elems
      // p of tile t (not skipped) into the buffer, by the epilogue's first thread.
      auto load_p = [&](int t) {
        if (e != 0 || t >= grid.count) return;
        const Tile x = grid.tile(t);
        const int row = static_cast<int>(x.ib * a.Lb + x.l0);
        mbar_arrive_expect_tx(p_full, 2 * C::kStagingBytes);
        for (int w = 0; w < 2; ++w)
          for (int ch = 0; ch < 4; ++ch)
            tma_load_4d(p0 + w * C::kStagingBytes + ch * kChunkBytes, x.window ? &tm_pwin : &tm_pcache, p_full,
                        x.e0 + 64 * ch, row + 64 * w, 0, 0);
      };
      load_p(grid.next(grid.first()));
      int nt = 0;
      for (int t = grid.first(); t < grid.count; t += grid.step()) {
        const Tile x = grid.tile(t);
        const bool skip = grid.skip(t);
        const int n_entries = x.window ? W : a.S;
        if (!skip && x.window) mbar_wait(p_full, nt & 1);  // the TMA's p seen here, not only by the math warps
        for (int w = 0; w < 2; ++w) {
          const uint32_t st = hs.block(w, nt), pb = p0 + w * C::kStagingBytes;
          if (!skip) hs.wait_staged(w, nt);
          for (int base = e; base < kBlockUnits; base += kBatch * Cta::kEpilogueThreads) {
            // A batch in phases: the staged gs and p, then the stores.
            uint4 gv[kBatch], pv[kBatch];
            int row[kBatch], col[kBatch];  // row in the block, entry; row -1: nothing to store
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              const int u = base + b * Cta::kEpilogueThreads;
              row[b] = x.l0 + 64 * w + ((u & 1023) >> 4);
              col[b] = x.e0 + 128 * (u >> 10) + 8 * (u & 15);
              if (u >= kBlockUnits || row[b] >= a.Lb || col[b] >= n_entries) row[b] = -1;
              const uint32_t off = (u >> 10) * 2 * kChunkBytes + unit_offset(u & 1023);
              gv[b] = u < kBlockUnits && !skip ? ld_shared_v4(st + off) : make_uint4(0, 0, 0, 0);
              pv[b] = u < kBlockUnits && !skip && x.window ? ld_shared_v4(pb + off) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              if (row[b] < 0) continue;
              const int l = row[b], c0 = col[b];
              const int64_t r = (x.ib - a.i0) * a.Lb + l;  // the chunk's row
              if (!x.window) {
                st16(a.gscache + r * a.lds + c0, gv[b]);
                continue;
              }
              st16(a.gswin + r * a.ldw + c0, gv[b]);
              // Key-major: entry e >= Lb to this block's slot (row l, column e - Lb), e < Lb to the
              // previous block's (row Lb + l, column e).
              const bool present = c0 >= a.Lb;
              st16(a.pwin + (x.ib - a.i0 + present) * ks + int64_t{present ? l : a.Lb + l} * a.ldkey +
                       (present ? c0 - a.Lb : c0),
                   pv[b]);
              // By distance hi - e for l <= e <= hi: every distance 0..Lb once; zero past Lb.
              __nv_bfloat16* gpos = a.gpos + r * a.ldp;
              const int hi = a.Lb + l;
              const __nv_bfloat16* g8 = reinterpret_cast<const __nv_bfloat16*>(&gv[b]);
#pragma unroll
              for (int k = 0; k < 8; ++k)
                if (c0 + k >= l && c0 + k <= hi) gpos[hi - c0 - k] = g8[k];
              if (c0 == 0)
                for (int d = a.Lb + 1; d < a.ldp; ++d) gpos[d] = __float2bfloat16_rn(0.f);
            }
          }
          if (!skip) hs.release(w, nt);
        }
        if (skip) continue;
        // Every epilogue thread has read the tile's p (the math warps did before staging).
        named_barrier_sync(1, Cta::kEpilogueThreads);
        load_p(grid.next(t + grid.step()));
        ++nt;
      }
    }
  } else {
    regs_alloc<Cta::kMathRegs>();
    const int w = wg - 1;
    const int warp = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
    const uint32_t pb = p0 + w * C::kStagingBytes;
    int nt = 0;
    // gs = p (acc - delta) where p is not 0: delta of the fragment's two rows loaded as the tile's
    // matmuls begin, p read from the buffer at the fragment's entries (dump_acc's addresses).
    auto score_grads = [&](int t) {
      const Tile x = grid.tile(t);
      float d[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int l = x.l0 + 64 * w + 16 * warp + g + 8 * r;
        d[r] = l < a.Lb ? a.delta[x.ib * a.Lb + l] : 0.f;
      }
      const uint32_t parity = nt++ & 1;
      return [=](float(&acc)[kBN / 2]) {
        mbar_wait(p_full, parity);
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 p =
                unpack_bf16(ld_shared_u32(pb + (j >> 3) * kChunkBytes + chunk_offset(16 * warp + g + 8 * r, j & 7, q)));
            float& s0 = acc[4 * j + 2 * r];
            float& s1 = acc[4 * j + 2 * r + 1];
            s0 = p.x != 0.f ? p.x * (s0 - d[r]) : 0.f;
            s1 = p.y != 0.f ? p.y * (s1 - d[r]) : 0.f;
          }
      };
    };
    math_k_major<kBN, kBK>(pipe, grid, a.nk, C::kABytes, hs, w, score_grads);
  }
  if (kCluster > 1) cluster_sync();  // no CTA leaves while another may still arrive on its barriers
}

}  // namespace
}  // namespace vq_score_grads_sm90

void vq_cuda::score_grads_sm90(const Ctx& ctx, const Geo& g, const Ws& w, int64_t i0, int64_t c, const void* dop,
                               int64_t ldo, const void* sp_win, const void* sp_cache) {
  using namespace vq_score_grads_sm90;
  using C = Cfg;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  Args a{};
  static_cast<TileOrder&>(a) = tile_order(i0, c, g.R, g.Lb, g.S);
  const int cluster = a.cluster;
  a.S = static_cast<int>(g.S);
  a.nk = static_cast<int>(cdiv(g.Dv, int64_t{kBK}));
  a.ldw = static_cast<int>(g.ldw);
  a.lds = static_cast<int>(g.lds);
  a.ldp = static_cast<int>(g.ldp);
  a.ldkey = static_cast<int>(g.ldkey);
  a.delta = w.delta;
  a.gswin = static_cast<__nv_bfloat16*>(w.gswin);
  a.gscache = static_cast<__nv_bfloat16*>(w.gscache);
  a.gpos = static_cast<__nv_bfloat16*>(w.gpos);
  a.pwin = static_cast<__nv_bfloat16*>(w.pwin);
  const int64_t rows = g.P * g.Tp;
  const CUtensorMap tm_dout = matrix_map(dop, rows, g.Dv, ldo, 1, 0, kBM, kBK);
  const CUtensorMap tm_v = matrix_map(w.vp, rows, g.Dv, g.Dv, 1, 0, kBN / 2, kBK);
  const CUtensorMap tm_ubar = matrix_map(w.ubar, g.NB * g.S, g.Dv, g.Dv, 1, 0, kBN / 2, kBK);
  const CUtensorMap tm_pwin = matrix_map(sp_win, rows, 2 * g.Lb, g.ldw, 1, 0, 64, 64);
  const CUtensorMap tm_pcache = matrix_map(sp_cache, rows, g.S, g.lds, 1, 0, 64, 64);
  const int tiles = a.c * a.gpb * a.cols;
  if (cluster == 2)
    launch_clusters<2>(vq_score_grads_kernel<2>, tiles, C::kSmem, cuda::stream_of(ctx), tm_dout, tm_v, tm_ubar, tm_pwin,
                       tm_pcache, a);
  else
    launch_clusters<1>(vq_score_grads_kernel<1>, tiles, C::kSmem, cuda::stream_of(ctx), tm_dout, tm_v, tm_ubar, tm_pwin,
                       tm_pcache, a);
}

}  // namespace linac
