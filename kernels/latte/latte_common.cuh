// Shared by the Latte CUDA kernels (math in latte.h): the kernel argument block, the chunk
// length, the workspace carve and the chunk loads into f32 shared memory.
//
// The GPU runs the chunked form with C = 64. Per (sequence, head) it keeps f32 per-chunk arrays in
// ctx.workspace, [B*H, N, L, Wd] with Wd = Dv + 1 (the extra column carries the backward's scalar
// state r): the chunk terms U and the chunk states S; plus the lse carries [B*H, N, L] and the
// backward's gP [B*H, T, La]. Every kernel is SIMT f32: a CTA per (chunk, sequence*head), a fixed
// loop order in every sum (deterministic).
#pragma once

#include <algorithm>
#include <string>

#include "common/cuda_common.cuh"
#include "latte/latte.h"

namespace linac::latte_cuda {

constexpr int kC = 64;      // tokens per chunk
constexpr int kMaxL = 64;   // latents per head
constexpr int kMaxDv = 128; // value width

struct Args {
  int T, H, L, La, Dv, Wd, N;
  int off;  // 1 with a local state (column 0 of a), else 0
};

inline Args make_args(const LatteLayout& L) {
  LINAC_CHECK(L.L <= kMaxL, "latte (GPU): at most 64 latents per head, got " + std::to_string(L.L));
  LINAC_CHECK(L.Dv <= kMaxDv && L.Dv % 4 == 0, "latte (GPU): Dv must be a multiple of 4 up to 128, got " +
                                                   std::to_string(L.Dv));
  LINAC_CHECK(L.T < (int64_t{1} << 30), "latte (GPU): T too large");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.L = static_cast<int>(L.L);
  a.La = static_cast<int>(L.La()), a.Dv = static_cast<int>(L.Dv), a.Wd = a.Dv + 1;
  a.N = (a.T + kC - 1) / kC, a.off = L.local ? 1 : 0;
  return a;
}

struct Workspace {
  float* U;      // [B*H, N, L, Wd] chunk terms
  float* S;      // [B*H, N, L, Wd] chunk states
  float* carry;  // [B*H, N, L] lse carries (forward), the backward's r terms
  float* gP;     // [B*H, T, La] (backward)
};

// Sequences per group that fit in ctx.workspace.
inline int group_size(const Ctx& ctx, const LatteLayout& L) {
  const size_t per = latte_workspace_bytes_per_seq(L.T, L.H, L.L, L.Dv, DType::F32);
  if (per > ctx.workspace_bytes)
    throw UserError("latte: one sequence of " + std::to_string(L.T) + " tokens needs " +
                    std::to_string((per >> 20) + 1) + " MiB of GPU workspace, more than the " +
                    std::to_string(ctx.workspace_bytes >> 20) + " MiB there are; set LINAC_WORKSPACE_MB");
  return static_cast<int>(std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per)));
}

inline Workspace carve(const Ctx& ctx, const Args& a, int B) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t bh = static_cast<size_t>(B) * a.H;
  const size_t st = align(bh * a.N * a.L * a.Wd * 4), cr = align(bh * a.N * a.L * 4), gp = align(bh * a.T * a.La * 4);
  LINAC_CHECK(2 * st + cr + gp <= ctx.workspace_bytes, "latte (GPU): workspace carve overflow");
  char* p = static_cast<char*>(ctx.workspace);
  return {reinterpret_cast<float*>(p), reinterpret_cast<float*>(p + st), reinterpret_cast<float*>(p + 2 * st),
          reinterpret_cast<float*>(p + 2 * st + cr)};
}

template <class P>
P* at_batch(P* p, int64_t b0, int64_t stride) {
  return p + b0 * stride;
}

// Rows f..f+rows-1 of head h of sequence b (X columns, free token stride) into dst[rows][X] f32.
template <class T>
__device__ __forceinline__ void load_rows(float* dst, const T* src, LatteLayout::Strides s, int b, int h, int f,
                                          int rows, int X) {
  for (int i = threadIdx.x; i < rows * X; i += blockDim.x) {
    const int r = i / X, c = i % X;
    dst[i] = cuda::to_float(src[b * s.b + static_cast<int64_t>(f + r) * s.t + static_cast<int64_t>(h) * X + c]);
  }
}

// lse rows f..f+rows-1 of (b, h) (contiguous [B, T, H, L]) into dst[rows][L].
__device__ __forceinline__ void load_lse(float* dst, const float* lse, const Args& a, int b, int h, int f, int rows) {
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
    const int r = i / a.L, l = i % a.L;
    dst[i] = lse[((static_cast<int64_t>(b) * a.T + f + r) * a.H + h) * a.L + l];
  }
}

// pi[rows][La] = softmax of each row of logits[rows][La], in place; one thread per row.
__device__ __forceinline__ void softmax_rows(float* pi, int rows, int La) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float* p = pi + r * La;
    float m = p[0];
    for (int j = 1; j < La; ++j) m = fmaxf(m, p[j]);
    float sum = 0.f;
    for (int j = 0; j < La; ++j) sum += p[j] = expf(p[j] - m);
    const float inv = 1.f / sum;
    for (int j = 0; j < La; ++j) p[j] *= inv;
  }
}

// -inf-safe log(exp(x) + exp(y)) (spec §9.4).
__device__ __forceinline__ float logaddexpf(float x, float y) {
  const float m = fmaxf(x, y);
  if (m == -INFINITY) return m;
  return m + logf(expf(x - m) + expf(y - m));
}

// Launchers of latte_scan.cu (B = sequences in the group; pointers at the group's first one).
// lse of b: chunk-local logcumsumexp, carries across chunks, then (with the chunk terms) the final lse.
template <class T>
void launch_lse_scan(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, float* lse,
                     float* carry);
// U[n][l][0..Dv) = sum_{s in n} exp(b_s - lse_e) v_s (lse_e: the chunk's last row). With carry
// (forward), first finalises the chunk's lse = logaddexp(carry, local lse).
template <class T>
void launch_chunk_terms(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, const T* v,
                        LatteLayout::Strides vs, float* lse, const float* carry, float* U);
// Forward (reverse = false): S[n] = mu at the start of chunk n, mu = exp(lse_{f-1} - lse_e) mu + U[n]
// over `width` columns, mu after the last chunk to mu_final (may be null).
// Reverse: S[n] = state at the end of chunk n, R = exp(lse_{f-1} - lse_e) R + U[n] going down.
void launch_state_scan(const Ctx& ctx, const Args& a, int B, bool reverse, int width, const float* lse,
                       const float* U, float* S, float* mu_final);

}  // namespace linac::latte_cuda
