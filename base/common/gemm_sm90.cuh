// Persistent Hopper GEMMs with a warp-specialised epilogue (TMA + wgmma), shared by the kernels
// that apply an elementwise function to their products before storing them (the channel mixer's
// swiglu_linear_*_sm90.cu, Transformer-VQ's silu_linear_fwd_sm90.cu, the attention projection's
// rope_linear_sm90.cu, Transformer-VQ's vq_score_grads_sm90.cu): the CTA's roles, the tile order,
// the shared-memory layout, the operand pipeline with its loading thread's walk, and the staging
// of 64 x 64 bf16 output chunks.
//
// A CTA is one persistent worker (one per SM) over output tiles of kBM = 128 rows. Warpgroups 1
// and 2 do the matmuls on rows 0-63 and 64-127 of the tile; warpgroup 0 moves data and runs the
// epilogue: its thread 0 issues the TMA loads of the operand stages, and its warps 1-3 (the
// "epilogue warps") take each finished tile from shared memory, apply the function, and store the
// results straight from registers (TMA stores would read the tile back out of shared memory, whose
// bandwidth the wgmmas and operand copies nearly use up: swiglu_linear_fwd_sm90.cu). So the
// math warpgroups only dump their accumulators, rounded to bf16, into a staging area and go on with
// the next tile's matmuls while the epilogue warps work on the last one. A kernel whose epilogue
// outweighs its matmuls runs "wide": warpgroup 3 adds four more epilogue warps (12-15), and the
// whole kernel must then compile within 128 registers per thread (ptxas holds every instruction to
// the launch bound, whatever setmaxnreg hands the math warps later), so its accumulators are at
// most 64 x 128. Stages of the A and B tiles rotate through mbarriers "full" (the copies landed)
// and "empty" (one arrival per math warp); the staging blocks through "staged" (the math warpgroup
// wrote it) and "freed" (one arrival per epilogue warp, as soon as it has what it needs of the
// block: no epilogue warp waits for another, as a named barrier over all of them made it; Nsight
// Compute's samples put 16% of the SwiGLU backward's epilogue time at that barrier).
//
// CTAs run in clusters of kCluster (1 or 2). The CTAs of a cluster take the same column block and
// adjacent row blocks, so they need the same weight tiles: each loads its share of every weight
// stage and multicasts it to all of them, cutting the weight's L2 -> SM traffic by the cluster
// size. A stage may then be refilled only when the math warps of every CTA of the cluster are
// done with it, so each math warp arrives on the "empty" barrier of every CTA.
#pragma once

#include <algorithm>

#include "common/cuda_common.cuh"
#include "common/sm90.cuh"
#include "common/tensor_map.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/gpu.h"

namespace linac::gemm_sm90 {

using namespace linac::sm90;

constexpr int kBM = 128;  // rows per tile
// The CTA's threads and epilogue threads: warps 1-3, and in a wide kernel warps 12-15 as well.
template <bool kWide>
struct Roles {
  static constexpr int kThreads = kWide ? 512 : 384, kEpilogueThreads = kWide ? 224 : 96;
  // Registers per thread after the hand-over. ptxas compiles every warp's code within
  // kCompiledRegs = 65536 / kThreads (168, or 128 wide), the loading and epilogue warps' code after
  // the hand-over within kLoadRegs (at 56 the stores of the 384-thread epilogues spilled), and the
  // math warps' increase comes only out of what the others gave back (asking for more hangs the
  // kernel), so the math warps get no more than they were compiled for.
  static constexpr int kCompiledRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kLoadRegs = kWide ? 120 : 88, kMathRegs = kWide ? 136 : 208;
  static_assert(kLoadRegs * (kWide ? 2 : 1) + 2 * kMathRegs <= kThreads / 128 * kCompiledRegs, "register hand-over");
  static_assert(kMathRegs >= kCompiledRegs, "the math warps' code needs what it was compiled for");
};

// Warpgroups 1 and 2 do the matmuls; 0 and (wide) 3 load and run the epilogue.
__device__ __forceinline__ bool math_warpgroup(int wg) { return wg == 1 || wg == 2; }
// Index 0 .. kEpilogueThreads - 1 of an epilogue thread: warps 1-3, then warps 12-15.
__device__ __forceinline__ int epilogue_thread() {
  const int t = static_cast<int>(threadIdx.x);
  return t >= 384 ? t - 288 : t - 32;
}
constexpr uint32_t kChunkBytes = 64 * 64 * 2;  // a staged chunk: 64 rows x 64 bf16, 128-byte swizzle

using cuda::cdiv;

// Tile t of a grid of row blocks x column blocks, column blocks fastest: the CTAs running at once
// share a few row blocks of the streamed operand (read from DRAM once) and all of the weight. A
// tile index names one tile per CTA of a cluster: rank r takes row block cluster * (t / cols) + r.
// Each cluster walks tiles first(), first() + step(), ... below `count`; row blocks past the
// matrix (an odd count in clusters of 2) read zeros and store nothing.
template <int kCluster>
struct TileGrid {
  int cols, count;  // column blocks; tiles
  uint32_t rank;    // in the cluster
  __device__ TileGrid(int rows, int cols_) : cols(cols_), count(cdiv(cdiv(rows, kBM), kCluster) * cols_) {
    rank = kCluster > 1 ? cluster_ctarank() : 0;
  }
  __device__ int first() const { return blockIdx.x / kCluster; }
  __device__ int step() const { return gridDim.x / kCluster; }
  __device__ int row0(int t) const { return (t / cols * kCluster + static_cast<int>(rank)) * kBM; }
  __device__ int col_block(int t) const { return t % cols; }
  __device__ bool skip(int) const { return false; }  // a tile no role works on (a grid derived from this one)
};

// The operand stages: kStages slots of `stage_bytes` from `stage0`, each with a "full" barrier
// (count 1: the loading thread's expect_tx) and an "empty" one (one arrival per math warp of the
// cluster), full barriers at `full0`, empty ones after them. A Slot walks the ring over all of the
// CTA's k-steps, the same way in the loading thread and in each math warpgroup: the stage and the
// parity of its round, kept as it goes (an index divided by kStages at every k-step took the
// loading thread ~10 dependent instructions).
template <int kStages, int kCluster>
struct StagePipe {
  uint32_t stage0, stage_bytes, full0;

  struct Slot {
    int stage = 0;
    uint32_t round = 0;  // parity
    __device__ void next() {
      if (++stage == kStages) {
        stage = 0;
        round ^= 1;
      }
    }
  };

  __device__ uint32_t full(const Slot& s) const { return full0 + 8 * s.stage; }
  __device__ uint32_t empty(const Slot& s) const { return full0 + 8 * (kStages + s.stage); }
  __device__ uint32_t end() const { return full0 + 16 * kStages; }  // the next free barrier slot

  __device__ void init() const {
    for (Slot s; s.round == 0; s.next()) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 8 * kCluster);
    }
  }
  // Loading thread: waits until the slot's stage is free (in round 0 the wait is for the phase
  // before a fresh barrier's first, which counts as complete), announces `stage_bytes` on full(s)
  // and returns the stage's address; the caller issues the copies, completing on full(s).
  __device__ uint32_t acquire(const Slot& s) const {
    mbar_wait(empty(s), s.round ^ 1);
    mbar_arrive_expect_tx(full(s), stage_bytes);
    return stage0 + s.stage * stage_bytes;
  }
  // A math warpgroup's matmuls of one tile: mma(stage address, accumulate) issues the wgmmas of each
  // of nk k-steps from slot s on (accumulate = 0 on the first); a stage goes back to the loader as
  // soon as its matmuls are done. Returns with every matmul finished and s past the tile's slots.
  template <class Mma>
  __device__ __forceinline__ void matmuls(int nk, Slot& s, Mma&& mma) const {
    const int lane = threadIdx.x & 31;
    Slot prev = s;
    for (int kb = 0; kb < nk; ++kb) {
      mbar_wait(full(s), s.round);
      wgmma_fence();
      mma(stage0 + s.stage * stage_bytes, kb > 0);
      wgmma_commit();
      wgmma_wait<1>();
      if (kb > 0 && lane == 0) release(prev);
      prev = s;
      s.next();
    }
    wgmma_wait<0>();
    if (lane == 0) release(prev);
  }
  // A math warp is done with slot s's stage (in every CTA of the cluster: their loaders multicast
  // into it).
  __device__ __forceinline__ void release(const Slot& s) const {
    if (kCluster == 1) {
      mbar_arrive(empty(s));
    } else {
#pragma unroll
      for (uint32_t r = 0; r < kCluster; ++r) mbar_arrive_cluster(empty(s), r);
    }
  }
};

// The staging blocks and their hand-over between math warpgroup w (0 or 1) and the epilogue
// warps. Each w has kBuffers blocks of `block_bytes` from `st0` (w's first, then its second), tile
// nt going to block nt % kBuffers, and two barriers per block from `bar0`: staged, which every
// thread of the math warpgroup arrives on once its dump is written, and freed, which each epilogue
// warp arrives on once it has taken what it needs of the block. With two blocks the math
// warpgroup dumps a tile while the epilogue still works on the one before.
template <bool kWide, int kBuffers = 1>
struct Staging {
  uint32_t bar0, st0, block_bytes;

  __device__ int index(int w, int nt) const { return w * kBuffers + nt % kBuffers; }
  __device__ uint32_t block(int w, int nt) const { return st0 + index(w, nt) * block_bytes; }
  __device__ uint32_t staged(int w, int nt) const { return bar0 + 8 * index(w, nt); }
  __device__ uint32_t freed(int w, int nt) const { return bar0 + 8 * (2 * kBuffers + index(w, nt)); }
  __device__ uint32_t end() const { return bar0 + 32 * kBuffers; }  // the next free barrier slot

  __device__ void init() const {
    for (int w = 0; w < 2; ++w)
      for (int b = 0; b < kBuffers; ++b) {
        mbar_init(staged(w, b), 128);
        mbar_init(freed(w, b), Roles<kWide>::kEpilogueThreads / 32);
      }
  }
  // Math warpgroup: before dumping tile nt, the epilogue is done with the tile that used its
  // block last.
  __device__ __forceinline__ void wait_free(int w, int nt) const {
    if (nt >= kBuffers) mbar_wait(freed(w, nt), (nt / kBuffers - 1) & 1);
  }
  __device__ __forceinline__ void announce(int w, int nt) const { mbar_arrive(staged(w, nt)); }
  // Epilogue warp: tile nt's block w is staged; the warp is done with it (its lanes' shared-memory
  // reads happen before the arrival, which releases them).
  __device__ __forceinline__ void wait_staged(int w, int nt) const {
    mbar_wait(staged(w, nt), (nt / kBuffers) & 1);
  }
  __device__ __forceinline__ void release(int w, int nt) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(freed(w, nt));
  }
};

// Thread 0 has initialised the barriers (and fenced them): every thread of the cluster sees them
// before anything is multicast into them or waited on.
template <int kCluster>
__device__ __forceinline__ void barriers_ready() {
  if (kCluster > 1)
    cluster_sync();
  else
    __syncthreads();
}

// A fused GEMM's shared memory as its configuration C lays it out (kStageBytes, kStagingBytes,
// kBarOffset): from the 1024-byte aligned base the operand stages, then the staging blocks, and at
// kBarOffset the stages' barriers, then the staging blocks'. The base is pipe.stage0; a kernel's
// own barriers follow from hs.end().
template <class C, int kStages, int kCluster, bool kWide = false, int kBuffers = 1>
struct FusedSmem {
  StagePipe<kStages, kCluster> pipe;
  Staging<kWide, kBuffers> hs;

  __device__ explicit FusedSmem(const void* smem) : FusedSmem(smem_base_1024(smem)) {}
  __device__ explicit FusedSmem(uint32_t stage0)
      : pipe{stage0, C::kStageBytes, stage0 + C::kBarOffset},
        hs{pipe.end(), stage0 + kStages * C::kStageBytes, C::kStagingBytes} {}

  // Thread 0 initialises the stages' and staging blocks' barriers and `extra` more of count 1
  // from hs.end(); every thread of the cluster then waits until they are visible.
  __device__ void init_barriers(int extra = 0) const {
    if (threadIdx.x == 0) {
      pipe.init();
      hs.init();
      for (int i = 0; i < extra; ++i) mbar_init(hs.end() + 8 * i, 1);
      mbar_init_fence();
    }
    barriers_ready<kCluster>();
  }
};

// The loading thread's walk over the CTA's tiles (those the grid does not skip) and their nk
// k-steps, in the order the math warpgroups take them: each stage acquired, then filled by
// load(stage, full barrier, k-step), where load = tile_loads(t) is tile t's loader (what the
// tile's copies share is worked out once per tile).
template <int kStages, int kCluster, class Grid, class TileLoads>
__device__ __forceinline__ void load_stages(const StagePipe<kStages, kCluster>& pipe, const Grid& grid, int nk,
                                            TileLoads&& tile_loads) {
  typename StagePipe<kStages, kCluster>::Slot slot;
  for (int t = grid.first(); t < grid.count; t += grid.step()) {
    if (grid.skip(t)) continue;
    const auto load = tile_loads(t);
    for (int kb = 0; kb < nk; ++kb, slot.next()) {
      const uint32_t stage = pipe.acquire(slot);
      load(stage, pipe.full(slot), kb);
    }
  }
}

// A stage's weight tile as two halves of `half_bytes` from b, half h's box at the tensor map
// coordinates at(h) (an int4): a CTA alone loads both; in a cluster of two, rank r loads half r and
// multicasts it to both CTAs.
template <int kCluster, class At>
__device__ __forceinline__ void load_weight_halves(uint32_t b, const CUtensorMap* tm, uint32_t bar, uint32_t half_bytes,
                                                   uint32_t rank, At&& at) {
  static_assert(kCluster == 1 || kCluster == 2, "weight halves are shared by at most two CTAs");
  if (kCluster == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int4 c = at(h);
      tma_load_4d(b + h * half_bytes, tm, bar, c.x, c.y, c.z, c.w);
    }
  } else {
    const int h = static_cast<int>(rank);
    const int4 c = at(h);
    tma_load_4d_multicast(b + h * half_bytes, tm, bar, 3, c.x, c.y, c.z, c.w);
  }
}

// A persistent launch in clusters of kCluster CTAs along x: as many clusters as fit on the GPU at
// once (asked of the occupancy calculator once per kernel), at most `work` of them.
template <int kCluster, bool kWide = false, class... Params, class... Args>
void launch_clusters(void (*kernel)(Params...), int work, size_t smem, cudaStream_t stream, Args... args) {
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(gpu_sm_count() / kCluster * kCluster));
  cfg.blockDim = dim3(Roles<kWide>::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  static const int fit = [&] {
    int clusters = 0;
    LINAC_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    LINAC_CHECK(clusters > 0, "no cluster of this kernel fits on the GPU");
    return clusters;
  }();
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(fit, work) * kCluster));
  LINAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// (__bfloat1622float2 took three instructions per pair where unpack_bf16 takes one per value.)
using cuda::pack_bf16;
using cuda::unpack_bf16;

// Byte offset of columns (2q, 2q + 1) + 8 * group of row `row` (0..63) inside a staged chunk: the
// 16-byte unit `group` (0..7) of a 128-byte row moves to group ^ (row % 8), the TMA's 128-byte
// swizzle, which also keeps a warp's writes (8 rows x 4 threads) on 32 different banks.
__device__ __forceinline__ uint32_t chunk_offset(int row, int group, int q) {
  return row * 128 + ((group ^ (row & 7)) << 4) + 4 * q;
}

// A staged 64-row block of two 64 x 64 chunks as 1024 16-byte units (8 bf16 of one row): unit u
// is row u / 16, 8-column group u % 16; its byte offset in the block.
__device__ __forceinline__ uint32_t unit_offset(int u) {
  const int row = u >> 4, group = u & 15;
  return (group >> 3) * kChunkBytes + chunk_offset(row, group & 7, 0);
}
constexpr int kUnits = 1024;

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// The math warpgroup's 64 x N accumulator columns [64c, 64c + 64) rounded to bf16 into chunk c of a
// staged block (N / 64 chunks), at the fragment's rows and columns.
template <int N>
__device__ __forceinline__ void dump_acc(uint32_t block, const float (&acc)[N / 2]) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      st_shared_u32(block + (j >> 3) * kChunkBytes + chunk_offset(16 * warp + g + 8 * r, j & 7, q),
                    pack_bf16(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]));
}

// The accumulators as they come: a math_tiles `fix` that changes nothing.
struct NoFix {
  struct Apply {
    template <class Acc>
    __device__ void operator()(Acc&) const {}
  };
  __device__ Apply operator()(int) const { return {}; }
};

// Math warpgroup w (0 or 1): for each of the CTA's tiles the 64 x N product that mma(acc, stage
// address, accumulate) accumulates over nk k-steps, dumped in bf16 into its staging block as soon
// as the epilogue has freed it, then announced; tiles grid.skip(t) are passed over. fix(t), called
// as tile t's matmuls begin (so that loads it issues land during them), returns what is applied to
// the f32 accumulators before they are rounded.
template <int N, int kStages, int kCluster, bool kWide, int kBuffers, class Grid, class Mma, class Fix = NoFix>
__device__ __forceinline__ void math_tiles(const StagePipe<kStages, kCluster>& pipe, const Grid& grid, int nk,
                                           const Staging<kWide, kBuffers>& hs, int w, Mma&& mma, Fix&& fix = Fix{}) {
  float acc[N / 2];
  typename StagePipe<kStages, kCluster>::Slot slot;
  int nt = 0;
  for (int t = grid.first(); t < grid.count; t += grid.step()) {
    if (grid.skip(t)) continue;
    const auto apply = fix(t);
    pipe.matmuls(nk, slot, [&](uint32_t stage, int accumulate) { mma(acc, stage, accumulate); });
    fence_regs(acc);
    apply(acc);
    hs.wait_free(w, nt);
    dump_acc<N>(hs.block(w, nt), acc);
    hs.announce(w, nt++);
  }
}

// math_tiles for stages that hold A [128, kBK] then B [N, kBK] (a_bytes in), both K-major with
// 64-byte rows (64-byte swizzle): 64 x N products of A's rows 64w .. 64w + 63 and B.
template <int N, int kBK, int kStages, int kCluster, class Grid, class Fix = NoFix>
__device__ __forceinline__ void math_k_major(const StagePipe<kStages, kCluster>& pipe, const Grid& grid, int nk,
                                             uint32_t a_bytes, const Staging<false>& hs, int w, Fix&& fix = Fix{}) {
  static_assert(kBK == 32, "64-byte rows");
  math_tiles<N>(
      pipe, grid, nk, hs, w,
      [&](float(&acc)[N / 2], uint32_t a, int accumulate) {
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          Wgmma<N>::template ss<0, 0>(acc, desc_k_major_sw64(a, 64 * w, kk), desc_k_major_sw64(a + a_bytes, 0, kk),
                                      accumulate || kk > 0);
      },
      fix);
}

// TMA map of a bf16 matrix [rows, cols] (row stride `ld` elements) seen as `halves` side-by-side
// blocks of `cols` columns each `half_stride` elements apart (e.g. gate and value of SwiGLU's h), in
// boxes of box_rows x box_cols.
inline CUtensorMap matrix_map(const void* base, int64_t rows, int64_t cols, int64_t ld, int64_t halves,
                              int64_t half_stride, int box_rows, int box_cols) {
  const int64_t hs = halves > 1 ? half_stride : ld * rows;
  return bf16_tensor_map(base, {cols, rows, halves, 1}, {ld, hs, hs}, {box_cols, box_rows, 1, 1}, box_cols * 2);
}

}  // namespace linac::gemm_sm90
