// Shared by the Lightning Attention CUDA kernels (math in lightning.h): the kernel argument
// block and the two launchers the forward and backward are built from. Tile loads and the warp
// matmul are the sm_80 toolkit's (common/mma_sm80.cuh).
#pragma once

#include "common/mma_sm80.cuh"
#include "lightning/lightning.h"

namespace linac::lightning_cuda {

using sm80::bf16_t;
using sm80::cdiv;
constexpr int kC = 64;  // tokens per block
constexpr int kW = 64;  // width of the head-dim slices a CTA works on

// The scan walks the blocks in one kernel (a CTA per 64x64 state tile, the state in registers)
// when the whole batch has at least this many tiles, about two per SM of an H100/H200: then the
// CTAs fill the GPU and the per-block terms never go through memory. Fewer tiles (one long
// sequence, few heads) take the two-launch scan, which is parallel over the blocks. A constant,
// and decided for the whole batch rather than per group of sequences, so the path and hence the
// bits depend on the shapes alone.
constexpr int64_t kWalkMinTiles = 256;

struct Args {
  int T, H, Dk, Dv, N;   // N = blocks per sequence
  bool walk;             // the scan in one kernel (kWalkMinTiles)
  const float* decay;    // [H] rates s_h >= 0
  // Document bounds of the launch's first sequence ([B, T] int32, sequence b at b * T), or null
  // (no documents): the kernels then run the stream path, instantiated apart (kDocs = false).
  const int32_t* doc_start;
  const int32_t* doc_end;
};

// Scan over the blocks of each sequence (f32 state; lightning_scan.cu; a.walk picks the kernels):
//   forward (rev = false): x = k, y = v;  states[n] = S before block n;  S = g S + (c * x)^T y
//   reverse (rev = true):  x = q, y = do; states[n] = R after block n;   R = g R + (a * x)^T y
// With documents (lightning.h) g is 0 in blocks where a document starts, and the rows of x outside
// the term's document (forward: not reaching the block's end; reverse: not continuing the carried
// state) are left out.
// init ([B*H, Dk, Dv] f32, may be null) starts the scan; final_out (f32, may be null) receives
// the last state. U: [B*H, N, Dk, Dv] f32 scratch (the per-block terms; unused when a.walk); states:
// the same shape in T.
template <class T>
void launch_scan(const Ctx& ctx, const Args& a, int B, bool rev, const T* x, LightningLayout::Strides xs, const T* y,
                 LightningLayout::Strides ys, const float* init, float* U, T* states, float* final_out);

// Per block n, independently: out[i] = sum_j M(i,j) (X_i . Y_j) Z_j + r[i] (X_i St_n), with X, Y
// of width Dx and Z, out of width Dz; M(i,j) = exp(-s|i-j|) for j <= i (upper = false, r = a) or
// j >= i (upper = true, r = c), else 0. St_n = states[n] read [Dx][Dz] or, when state_t, [Dz][Dx].
// With documents M(i,j) is also 0 for pairs of two documents, and r[i] for rows outside the
// state's document (lightning.h). pre (null, or [B, T, H, Dz] with strides ps): out is stored as
// rounded(out) * silu'(pre), the gradient through a SiLU feature map (LightningOpts::q_pre).
template <class T>
void launch_pass(const Ctx& ctx, const Args& a, int B, bool upper, bool state_t, int Dx, int Dz, const T* x,
                 LightningLayout::Strides xs, const T* y, LightningLayout::Strides ys, const T* z,
                 LightningLayout::Strides zs, const T* states, T* out, LightningLayout::Strides os,
                 const T* pre = nullptr, LightningLayout::Strides ps = {});

}  // namespace linac::lightning_cuda
