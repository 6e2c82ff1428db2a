// CUDA VQ-attention decode step (docs/transformer_vq.md §5; math and state layout in vq_attn.h), in
// two launches, so that a sequence's ring and cache (2 Lb Dv floats per head: 6 MB at the 190M
// model's shape) are read by many SMs at once rather than by one CTA:
//   scores  grid (B H, groups of 64 entries), a warp per entry, lanes over Dk and a butterfly sum:
//           row b's token at position p = pos[b] (read on the device) scores its window (ring
//           slots of positions p-Lb..p-1 that exist, and itself; distance d uses rho_d) and the S
//           cache entries ((q+u).C_s + log N_s), -inf for empty codes and for ring slots with
//           z = -1 (emptied by a document start); into ctx.workspace [B H, Lb + 1 + S]. The first
//           CTA of a (b, h) also notes the code z_out of the token at p-Lb (-1 if none), which
//           leaves the window for the cache, and that code's new count.
//   output  grid (B H, 32 value dims), 16 warps: each CTA takes the max and the sum of the
//           exponentials over all scores (in the same fixed order in every CTA); warp w sums
//           weight x value over the entries w, w + 16, ... with a lane per value dim (entries of
//           weight 0 skipped), and the warps' sums are added in a fixed order. Then, once its
//           reads are done, each CTA moves its value dims of the token at p-Lb into the cache
//           (Ubar[z] += (v - Ubar[z]) / N[z]) and of the new token into its ring slot; the
//           first CTA also the key, the code and the count, which no CTA of this launch reads.
// State f32. No launch argument depends on the positions: a CUDA graph replays the step.
#include <string>

#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;

constexpr int kScoreWarps = 8;
constexpr int kEntriesPerCta = 64;
constexpr int kOutWarps = 16;
constexpr int kOutDims = 32;  // a lane per value dim

// Where the token at p - Lb goes: its code (-1: none leaves) and that code's count after it.
struct Eviction {
  int32_t z;
  float n;
};

__host__ __device__ int64_t entries(const VqStepLayout& L) { return L.Lb + 1 + L.S; }

template <class T>
__global__ void __launch_bounds__(kScoreWarps * 32)
    vq_step_scores_kernel(VqStepLayout L, const T* __restrict__ q, const T* __restrict__ khat,
                          const float* __restrict__ codebook, const float* __restrict__ u, const float* __restrict__ vr,
                          const float* __restrict__ rho, const float* __restrict__ ring_khat,
                          const int32_t* __restrict__ ring_z, const float* __restrict__ counts,
                          const int32_t* __restrict__ pos, float* __restrict__ scores, Eviction* __restrict__ evict) {
  extern __shared__ float smem[];
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H, Lb = L.Lb, Dk = L.Dk, p = pos[b];
  const int64_t n_ring = p < Lb ? p : Lb, E = n_ring + 1 + L.S;
  float* qu = smem;     // [Dk]
  float* qr = qu + Dk;  // [Dk]
  for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
    const float qv = to_float(q[b * L.q + h * Dk + i]);
    qu[i] = qv + u[h * Dk + i];
    qr[i] = qv + vr[h * Dk + i];
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const T* kt = khat + b * L.khat + h * Dk;
  const float* N = counts + bh * L.S;
  const int64_t e_end = min(E, (blockIdx.y + 1) * int64_t{kEntriesPerCta});
  for (int64_t e = blockIdx.y * int64_t{kEntriesPerCta} + warp; e < e_end; e += kScoreWarps) {
    // e = 0: the token itself; 1..n_ring: the ring entry at distance e; then the codes.
    float part = 0.f, add = 0.f;
    bool present = true;
    if (e <= n_ring) {
      const float* rd = rho + (h * (Lb + 1) + e) * Dk;
      const int64_t slot = (p - e) % Lb;
      if (e == 0) {
        for (int64_t i = lane; i < Dk; i += 32) part += qu[i] * to_float(kt[i]) + qr[i] * rd[i];
      } else if (ring_z[bh * Lb + slot] >= 0) {
        const float* kr = ring_khat + (bh * Lb + slot) * Dk;
        for (int64_t i = lane; i < Dk; i += 32) part += qu[i] * kr[i] + qr[i] * rd[i];
      } else {
        present = false;
      }
    } else {
      const int64_t c = e - n_ring - 1;
      if (N[c] > 0) {
        const float* cc = codebook + (h * L.S + c) * Dk;
        for (int64_t i = lane; i < Dk; i += 32) part += qu[i] * cc[i];
        add = logf(N[c]);
      } else {
        present = false;
      }
    }
    part = cuda::warp_sum(part);
    if (lane == 0) scores[bh * entries(L) + e] = present ? part + add : -INFINITY;
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    const int32_t z_out = p >= Lb ? ring_z[bh * Lb + p % Lb] : -1;
    evict[bh] = {z_out, z_out >= 0 ? N[z_out] + 1 : 0.f};
  }
}

template <class T>
__global__ void __launch_bounds__(kOutWarps * 32)
    vq_step_out_kernel(VqStepLayout L, const T* __restrict__ khat, const int32_t* __restrict__ z,
                       const T* __restrict__ v, const float* __restrict__ scores, const Eviction* __restrict__ evict,
                       float* __restrict__ ring_khat, float* __restrict__ ring_v, int32_t* __restrict__ ring_z,
                       float* __restrict__ counts, float* __restrict__ means, const int32_t* __restrict__ pos,
                       T* __restrict__ o) {
  extern __shared__ float w[];  // [E]: the scores, then their exponentials
  __shared__ float scratch[32];
  __shared__ float sums[kOutWarps][kOutDims];
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H, Lb = L.Lb, Dv = L.Dv, at = pos[b];
  const int64_t n_ring = at < Lb ? at : Lb, E = n_ring + 1 + L.S;
  const float* sc = scores + bh * entries(L);
  float m = -INFINITY;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    w[e] = sc[e];
    m = fmaxf(m, w[e]);
  }
  m = cuda::block_max(m, scratch);
  float den = 0.f;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const float p = w[e] == -INFINITY ? 0.f : expf(w[e] - m);
    w[e] = p;
    den += p;
  }
  den = cuda::block_sum(den, scratch);  // ends after a barrier: every weight is in place
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t d = blockIdx.y * int64_t{kOutDims} + lane;
  const bool mine = d < Dv;
  const T* vt = v + b * L.v + h * Dv;
  float* v_rows = ring_v + bh * Lb * Dv;
  float* U = means + bh * L.S * Dv;
  float acc = 0.f;
  if (mine) {
#pragma unroll 4
    for (int64_t e = warp; e < E; e += kOutWarps) {
      const float p = w[e];
      if (p == 0.f) continue;
      const float x = e == 0        ? to_float(vt[d])
                      : e <= n_ring ? v_rows[((at - e) % Lb) * Dv + d]
                                    : U[(e - n_ring - 1) * Dv + d];
      acc += p * x;
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();  // the sums are in, and every read of the ring and the cache is done
  const int64_t slot = at % Lb;
  const Eviction ev = evict[bh];
  if (warp == 0 && mine) {
    float total = 0.f;
    for (int i = 0; i < kOutWarps; ++i) total += sums[i][lane];
    o[b * L.o + h * Dv + d] = from_float<T>(total / den);
    float* vs = v_rows + slot * Dv + d;
    if (ev.z >= 0) U[ev.z * Dv + d] += (*vs - U[ev.z * Dv + d]) / ev.n;
    *vs = to_float(vt[d]);
  }
  if (blockIdx.y != 0) return;
  const T* kt = khat + b * L.khat + h * L.Dk;
  for (int64_t i = threadIdx.x; i < L.Dk; i += blockDim.x) ring_khat[(bh * Lb + slot) * L.Dk + i] = to_float(kt[i]);
  if (threadIdx.x == 0) {
    if (ev.z >= 0) counts[bh * L.S + ev.z] = ev.n;
    ring_z[bh * Lb + slot] = z[bh];
  }
}

}  // namespace

void vq_attn_state_start_document_cuda(const Ctx& ctx, const VqAttnState& state, int64_t row) {
  cudaStream_t st = cuda::stream_of(ctx);
  // Row `row` of a contiguous [B, ...] tensor set bytewise (0xff: every int32 -1, the slot absent).
  auto set_row = [&](const Tensor& t, int byte) {
    const size_t bytes = t.nbytes() / static_cast<size_t>(t.size(0));
    LINAC_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(t.ptr) + static_cast<size_t>(row) * bytes, byte, bytes, st));
  };
  set_row(state.counts, 0);
  set_row(state.means, 0);
  set_row(state.z, 0xff);
}

void vq_attn_step_cuda(const Ctx& ctx, const VqStepLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                       const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                       const VqAttnState& state, const Tensor& pos, const Tensor& o) {
  if (L.B * L.H == 0) return;
  const int64_t BH = L.B * L.H;
  const size_t score_bytes = static_cast<size_t>(BH * entries(L)) * sizeof(float);
  const size_t need = score_bytes + static_cast<size_t>(BH) * sizeof(Eviction);
  LINAC_CHECK(ctx.workspace_bytes >= need, "vq_attn_step (GPU): ctx.workspace has " +
                                               std::to_string(ctx.workspace_bytes) + " bytes, the scores need " +
                                               std::to_string(need));
  const size_t out_smem = static_cast<size_t>(entries(L)) * sizeof(float);
  const size_t score_smem = static_cast<size_t>(2 * L.Dk) * sizeof(float);
  LINAC_CHECK(out_smem <= 200 * 1024 && score_smem <= 200 * 1024,
              "vq_attn_step: block length, codebook or key width too large for shared memory");
  auto* scores = static_cast<float*>(ctx.workspace);
  auto* evict = reinterpret_cast<Eviction*>(static_cast<char*>(ctx.workspace) + score_bytes);
  cudaStream_t st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(q.dtype, T, {
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_step_scores_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(score_smem)));
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_step_out_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(out_smem)));
    const dim3 score_grid(static_cast<unsigned>(BH),
                          static_cast<unsigned>((entries(L) + kEntriesPerCta - 1) / kEntriesPerCta));
    vq_step_scores_kernel<T><<<score_grid, kScoreWarps * 32, score_smem, st>>>(
        L, q.data<T>(), khat.data<T>(), codebook.data<float>(), u.data<float>(), vr.data<float>(), rho.data<float>(),
        state.khat.data<float>(), state.z.data<int32_t>(), state.counts.data<float>(), pos.data<int32_t>(), scores,
        evict);
    LINAC_CUDA_LAUNCH_CHECK();
    const dim3 out_grid(static_cast<unsigned>(BH), static_cast<unsigned>((L.Dv + kOutDims - 1) / kOutDims));
    vq_step_out_kernel<T><<<out_grid, kOutWarps * 32, out_smem, st>>>(
        L, khat.data<T>(), z.data<int32_t>(), v.data<T>(), scores, evict, state.khat.data<float>(),
        state.v.data<float>(), state.z.data<int32_t>(), state.counts.data<float>(), state.means.data<float>(),
        pos.data<int32_t>(), o.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
