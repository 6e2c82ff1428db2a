// Shared by the Taylor attention CUDA kernels (math in taylor_attn.h): constants, the kernel
// argument block, the workspace carve, the padded feature map, and the launchers the forward and
// the backward both run. Matmuls use the sm_80 tensor-core toolkit (common/mma_sm80.cuh:
// cp.async tile loads, warp_mma over shared-memory tiles, bf16 mma.sync or exact f32 SIMT).
//
// GPU feature order: the 273 rows of phi padded to kRows = 288 = 18 blocks of 16 (zero rows
// 273..287), so every block is one mma k-step: block b < 16 holds x_b x_j / sqrt 2, block 16 x_j,
// block 17 [1, 0, ...]. Rows 0..272 are exactly the exported state layout (taylor_attn.h).
// Values are padded to DvP = Dv + 16 columns: v~ = [v, 1, 0...] and g~ = [dout/den, c, 0...], so
// the normaliser rides along as column Dv of every matmul. Rows past T are zero in every
// chunk-major buffer (also the "1" column), so a ragged last chunk adds nothing to a state.
// Documents (Args::doc_start, the [B, T] starts; taylor_attn.h has the math): the scans zero their
// accumulators at a chunk in which a document starts and leave out the rows of the chunk the next
// state must not hold; the carries restart at a segment in which a document starts, and a chunk
// adds its segment's carry only when no document started in between; the chunk kernel masks the
// intra-chunk pairs by document and the inter-chunk term per row. Every kernel has a kDocs = false
// instance that is the stream code unchanged.
#pragma once

#include <cstdint>
#include <functional>

#include "common/mma_sm80.cuh"
#include "taylor_attn/taylor_attn.h"

namespace linac::taylor_cuda {

using sm80::bf16_t;
using sm80::cdiv;
using sm80::cp_async16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::Frag;
using sm80::ld_of;
using sm80::store2;
using sm80::warp_mma;

constexpr int kF = 16;                 // feature dim the kernels are built for
constexpr int kC = 64;                 // chunk length
constexpr int kRows = kF * kF + 2 * kF;  // padded feature rows (288)
constexpr int kBlocks = kRows / 16;    // 18 feature blocks of 16
constexpr int kMaxDvP = 144;           // Dv <= 128
// Value n-tiles (of 8 columns) the accumulators are sized for: Dv <= 64 runs a 10-tile build, so
// the common head size does not pay registers for the widest one.
constexpr int kNTSmall = 10, kNTLarge = kMaxDvP / 8;
constexpr float kRsqrt2 = 0.70710678118654752f;

// Chunks per scan segment. 32 makes the scan grid of the common shapes (2^15 tokens per call over
// 16 heads, two groups in the default workspace) about one wave of the 132 SMs at three CTAs each,
// and leaves T <= 2048 a single segment: no carries (NOTES.md has the measurements).
constexpr int kSegChunks = 32;

struct Args {
  int T, H, Dv, DvP, N;  // N = chunks per sequence
  int nseg;              // scan segments of kSegChunks chunks
  int p0;                // first (batch, head) pair of the group
  float eps;
  const int32_t* doc_start;  // [B, T] document starts, or null
  TaylorAttnLayout::Strides q, k, v, o, dout, dq, dk, dv;
};

// Workspace of one group of P pairs (chunk-major, Tp = N * kC rows per pair).
template <class T>
struct Workspace {
  T* xq = nullptr;  // q^ [P, Tp, kF]
  T* xk = nullptr;  // k^ [P, Tp, kF]
  T* vt = nullptr;  // v~ [P, Tp, DvP]
  T* gt = nullptr;  // g~ [P, Tp, DvP] (backward)
  T* S = nullptr;   // segment-local exclusive states [P, N, kRows, DvP]: S_n (forward) or R_n (reverse)
  float* carry = nullptr;  // [P, nseg, kRows, DvP]: segment totals, then the sum over the segments before
                           // (forward) or after (reverse) each one, which completes S_n / R_n
};

// Whether a document starts in chunk n of a row (token range [t0, t1]): start[t1] >= t0. The
// state carried past such a chunk restarts there, in both directions.
__device__ __forceinline__ bool chunk_restarts(const int32_t* start, int64_t t0, int64_t t1) { return start[t1] >= t0; }

// Feature jj of block fb of the prescaled row x (f32 arithmetic on the stored values).
template <class T>
__device__ __forceinline__ float feature(const T* x, int fb, int jj) {
  using linac::cuda::to_float;
  if (fb < kF) return to_float(x[fb]) * to_float(x[jj]) * kRsqrt2;
  if (fb == kF) return to_float(x[jj]);
  return fb == kF + 1 && jj == 0 ? 1.f : 0.f;
}

// den of this lane's rows g, g + 8 of the 16-row strip at m0 of o~ (acc): o~[Dv] + eps. Column Dv is
// element 0 (row g) / 2 (row g + 8) of n-tile Dv / 8 in lane q = 0, shared with the row's lanes;
// lane q = 0 writes den [pairs, T] for rows < rows.
template <int NT>
__device__ __forceinline__ void strip_den(const float (&acc)[NT][4], const Args& a, int pair, int64_t t0, int m0,
                                          int rows, float* den, float (&d)[2]) {
  const Frag f;
  const int ntd = a.Dv / 8, lane = static_cast<int>(threadIdx.x) & 31;
  d[0] = d[1] = 1.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    if (nt == ntd) d[0] = acc[nt][0], d[1] = acc[nt][2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) d[ri] = __shfl_sync(0xffffffffu, d[ri], lane & ~3) + a.eps;
  if (f.q == 0)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int r = m0 + f.g + 8 * ri;
      if (r < rows) den[static_cast<int64_t>(pair) * a.T + t0 + r] = d[ri];
    }
}

// The strip's first Dv columns divided by d (per row g, g + 8) into out (row stride ot), rows < rows.
template <class T, int NT>
__device__ __forceinline__ void store_strip(const float (&acc)[NT][4], const float (&d)[2], int m0, int rows, int Dv,
                                            T* out, int64_t ot) {
  const Frag f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
      if (c < Dv && r < rows) store2(out + r * ot + c, acc[nt][2 * hf] / d[hf], acc[nt][2 * hf + 1] / d[hf]);
    }
}

// All NT threads copy `rows` x `cols` (multiple of 16 bytes) from src (row stride `stride`) into
// dst (row length ld).
template <class T, int NT>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, int64_t stride, int rows, int cols) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const int cpr = cols / V;
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * cpr; idx += NT) {
    const int r = idx / cpr, c = (idx % cpr) * V;
    cp_async16(dst + r * ld + c, src + r * stride + c, true);
  }
}

// Pairs per group that fit in ctx.workspace (UserError when not even one does), and the carve.
int group_size(const Ctx& ctx, const TaylorAttnLayout& L, DType act);
// The same for any workspace need: bytes(P) for P pairs, nondecreasing in P.
int balanced_group(const Ctx& ctx, const TaylorAttnLayout& L, const std::function<size_t(int64_t)>& bytes);
template <class T>
Workspace<T> carve(const Ctx& ctx, const Args& a, int P);
Args make_args(const TaylorAttnLayout& L);
void check_rows16(const Tensor& x, const TaylorAttnLayout::Strides& s, const char* name);

// prep: q^, k^, v~ (kPrepQKV) and g~ (kPrepG) of P pairs into the workspace; q, k, v only with
// kPrepQKV, o, dout, den only with kPrepG.
enum PrepParts : int { kPrepQKV = 1, kPrepG = 2 };
template <class T>
void launch_prep(const Ctx& ctx, const Args& a, int P, const T* q, const T* k, const T* v, const T* o,
                 const T* dout, const float* den, const Workspace<T>& w, int parts);
// scan: the sequence is cut into segments of kSegChunks chunks that run in parallel. states[n] =
// sum of phi(X)^T Y over the chunks of n's segment before n (forward) or after n (reverse); x = k^ or
// q^, y = v~ or g~; then the carry of every segment (the state its first chunk starts from) goes
// to w.carry, and the whole sum to s_final (forward only, may be null: the exported layout
// [pairs, 273, Dv + 1] f32). The exclusive state of chunk n is states[n] + carry[segment of n]; with
// one segment and no s_final the carries are not formed (nothing reads them).
template <class T>
void launch_scan(const Ctx& ctx, const Args& a, int P, bool reverse, const T* x, const T* y, const Workspace<T>& w,
                 float* s_final);

// carry: segment totals in `carry` -> each segment's starting state (exclusive prefix over the
// segments in scan order); forward: the whole sum to s_final (may be null; without it the last
// segment's total in scan order is not read).
void launch_carry(const Ctx& ctx, const Args& a, int P, bool reverse, float* carry, float* s_final);

// totals (taylor_attn_totals.cu, for the fused kernels' cases): each segment's sum of phi(X^)^T Y
// into `carry`, x = k and y = v (forward, strided) or x = q and y = g~ (reverse, the group's
// chunk-major workspace); all: also the last segment in scan order, which only the final state reads.
void launch_totals(const Ctx& ctx, const Args& a, int P, bool reverse, const bf16_t* x, const bf16_t* y, float* carry,
                   bool all);

// The fused kernels (taylor_attn_fused.cuh): scan and per-chunk products in one pass, for bf16 and
// Dv <= 64, documents or not (fused_applies; not under LINAC_TAYLOR_KERNELS=chunk). The forward is one pass, the backward a g~ prep and two
// (dq; dk and dv); both group pairs by their own workspace (the carries, and g~ for the backward).
bool fused_applies(const Args& a, DType act);
void fwd_fused(const Ctx& ctx, const TaylorAttnLayout& L, Args a, const bf16_t* q, const bf16_t* k, const bf16_t* v,
               bf16_t* o, float* den, float* s_final);
void bwd_fused(const Ctx& ctx, const TaylorAttnLayout& L, Args a, const bf16_t* q, const bf16_t* k, const bf16_t* v,
               const bf16_t* o, const float* den, const bf16_t* dout, bf16_t* dq, bf16_t* dk, bf16_t* dv);

// The per-chunk kernel's modes (taylor_attn_chunk.cuh), with states = the exclusive states:
//   kOut    out = o (= o~ / den, den = o~[Dv] + eps written to den [pairs, T]),
//           o~ = phi(X) S + tril(kappa(X Xo^T)) Z;                 X = q^, Xo = k^, Z = v~
//   kGradQ  dx = dq from Y S^T through the feature map + (tril(Y Z^T) * (1 + X Xo^T)) Xo;
//                                                                   X = q^, Xo = k^, Y = g~, Z = v~
//   kGradK  dx = dk as kGradQ with the transposed (upper) mask, and out = dv = phi(X) R +
//           triu(kappa(X Xo^T)) Z;                                  X = k^, Xo = q^, Y = v~, Z = g~
enum Mode : int { kOut = 0, kGradQ = 1, kGradK = 2 };
template <Mode kMode, class T>
void launch_chunk(const Ctx& ctx, const Args& a, int P, const T* x, const T* xo, const T* y, const T* z,
                  const T* states, const float* carry, T* out, TaylorAttnLayout::Strides os, float* den, T* dx,
                  TaylorAttnLayout::Strides dxs);

}  // namespace linac::taylor_cuda
