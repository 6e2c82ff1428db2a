// Shared by the GLA CUDA kernels (math in gla.h): the kernel argument block, chunk constants, the
// gate exponential and the off-diagonal sub-chunk operands. Tile loads and the warp-level matmul
// are the sm_80 toolkit's (common/mma_sm80.cuh).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/cuda_common.cuh"
#include "common/mma_sm80.cuh"
#include "gla/gla.h"

namespace linac::gla_cuda {

using bf16_t = __nv_bfloat16;

constexpr int kC = 64;    // chunk length
constexpr int kSub = 16;  // sub-chunk length (one mma tile)
constexpr int kW = 64;    // width of the Dk / Dv slices a CTA works on

struct Args {
  int T, H, Dk, Dv, N;  // N = chunks per sequence
  float scale;
  GlaLayout::Strides q, k, v, g, o, dout, dq, dk, dv, dg;
};

using cuda::cdiv;

template <class T>
__device__ __forceinline__ float gexp(float x) {
  if constexpr (sizeof(T) == 2)
    return __expf(x);  // bf16 path: the operands are rounded to bf16 anyway
  else
    return expf(x);
}

// The tensor-core toolkit (common/mma_sm80.cuh) under this namespace's names.
using sm80::cp_async16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::Frag;
using sm80::ld_of;
using sm80::ldsm_x4;
using sm80::ldsm_x4_trans;
using sm80::load2f;
using sm80::load_tile;
using sm80::mma_bf16;
using sm80::smem_u32;
using sm80::store2;
using sm80::store_strip;
using sm80::tile_bytes;
using sm80::warp_mma;

// ---- off-diagonal sub-chunk operands (intra and dqk kernels) -------------------------------
// A chunk's off-diagonal blocks (query sub-chunk I > key sub-chunk J) are matmuls of operands
// scaled by exp(B[row] - B[anchor]) with every factor <= 1. They are built by NT threads, a
// thread per column pair (c) and every (NT/32)-th row (p), with the rows unrolled: a source row's
// values and cumsums are read once for every block that uses it, and each row's sub-chunk (and
// so its blocks) is known at compile time.

// Key rows K_{<I} scaled for query sub-chunk I start at this row of the key operand buffer.
__host__ __device__ constexpr int ks_off(int I) { return 16 * I * (I - 1) / 2; }

// Calls fn(row, sub-chunk) for the rows R0 + p + G j (G = NT/32 row groups, p < G) of the ROWS
// rows from R0 (a multiple of 16); rows R0 + G j .. R0 + G j + G - 1 share a sub-chunk, a
// compile-time constant (G divides 16).
template <int NT, int R0, int ROWS, class Fn>
__device__ __forceinline__ void for_rows(int p, Fn&& fn) {
  constexpr int G = NT / 32;
  static_assert(16 % G == 0 && R0 % 16 == 0 && ROWS % G == 0, "row groups must tile the sub-chunks");
  [&]<int... J>(std::integer_sequence<int, J...>) {
    (fn(R0 + p + G * J, std::integral_constant<int, (R0 + G * J) / 16>{}), ...);
  }(std::make_integer_sequence<int, ROWS / G>{});
}

// Ks rows ks_off(I) + s = k[s] * exp(B[16 I] - B[s]) for I = 1..3 and keys s < 16 I (96 rows);
// bI[I - 1] holds columns c, c + 1 of B[16 I].
template <class T, int NT>
__device__ __forceinline__ void key_block_operands(T* Ks, const T* K, const float* Bc, int ld, int ldb, int c, int p,
                                                   const float2 (&bI)[3]) {
  for_rows<NT, 0, 48>(p, [&](int s, auto sb) {
    const float2 kv = load2f(K + s * ld + c), bs = load2f(Bc + s * ldb + c);
#pragma unroll
    for (int I = decltype(sb)::value + 1; I <= 3; ++I)
      store2(Ks + (ks_off(I) + s) * ld + c, kv.x * gexp<T>(bI[I - 1].x - bs.x), kv.y * gexp<T>(bI[I - 1].y - bs.y));
  });
}

// ---- launchers shared by the forward and the backward (gla_fwd.cu) --------------------------
// Per-chunk buffers are chunk-major: [B*H, N*kC, Dk] (rows past T hold zeros, or the last cumsum).

// Chunk-local inclusive cumsums bc = B (f32; rows past T repeat the last sum), the decayed
// operands qd = scale q*exp(B) and kd = k*exp(bn - B) (activation dtype, every factor <= 1) and
// the chunk totals bn [B*H, N, Dk] (f32).
template <class T>
void launch_prep(const Ctx& ctx, const Args& a, int B, const T* q, const T* k, const float* g, float* bc, T* qd,
                 T* kd, float* bn);
// Forward (rev = false): states[n] = S_n (state before chunk n) for n = 0..N, S_n+1 = exp(bn) S_n +
// kd^T v, S_0 = init (or 0), final_out = S_N. Reverse: states[n] = dS_n+1 (gradient of the state
// after chunk n) for n < N, dS_n = exp(bn) dS_n+1 + qd^T do, dS_N = init (or 0), final_out = dS_0.
// x = kd or qd; states [B*H, N+1 (forward) or N, Dk, Dv] in T; init/final_out [B*H, Dk, Dv] f32,
// either may be null.
template <class T>
void launch_state(const Ctx& ctx, const Args& a, int B, bool rev, const T* x, const T* y, GlaLayout::Strides ys,
                  const float* bn, const float* init, T* states, float* final_out);
// P of every chunk (scale included, zero above the diagonal): [B*H, N, kC, kC] in T.
template <class T>
void launch_intra(const Ctx& ctx, const Args& a, int B, const T* q, const T* k, const float* bc, T* P);
// Forward (dv = false): o = qd S_n + P v. Backward (dv = true): dv = kd dS_n+1 + P^T do.
// x = qd or kd, states = S (n_states = N+1) or dS (N), y = v or do, out = o or dv.
template <class T>
void launch_out(const Ctx& ctx, const Args& a, int B, bool dv, const T* x, const T* states, int n_states, const T* P,
                const T* y, GlaLayout::Strides ys, T* out, GlaLayout::Strides os);

// The buffers of one group of sequences: the forward's chunk buffers (in ctx.workspace, or in
// the caller's saved intermediates) and the state gradients (backward, in ctx.workspace).
template <class T>
struct Workspace {
  float* bc = nullptr;  // [B*H, N*kC, Dk]
  T* qd = nullptr;      // [B*H, N*kC, Dk]
  T* kd = nullptr;      // [B*H, N*kC, Dk]
  float* bn = nullptr;  // [B*H, N, Dk]
  T* S = nullptr;       // [B*H, N+1, Dk, Dv]
  T* dS = nullptr;      // [B*H, N, Dk, Dv] (backward)
  T* P = nullptr;       // [B*H, N, kC, kC]
};

// Sequences per group that fit in ctx.workspace (UserError when not even one does).
int group_size(const Ctx& ctx, const GlaLayout& L, DType act, bool saved);
// The buffers of sequences [b0, b0 + B) of a batch of `batch`: with `saved` (the whole batch's
// chunk buffers, gla_saved_bytes) their part of it, else the group's own in ctx.workspace; dS
// (backward only) after them in ctx.workspace.
template <class T>
Workspace<T> group_buffers(const Ctx& ctx, const Args& a, int64_t batch, int64_t b0, int B, void* saved,
                           bool backward);

Args make_args(const GlaLayout& L);
void check_rows16(const Tensor& x, const GlaLayout::Strides& s, const char* name);

}  // namespace linac::gla_cuda
