// The VQ-attention prefill handover on the GPU (docs/transformer_vq.md §5; math and layouts in
// vq_attn.h): the decode state that T steps of vq_attn_step leave, from the prompt at once.
// Per (row b, head h), with a the start of the row's last document (0 without bounds):
//   cache   N[s] = #{t in [a, T - Lb) : z_t = s}, and Ubar[s] the running mean the step keeps,
//           Ubar <- Ubar + (v_t - Ubar) / k for the k-th such token in token order (f32);
//   ring    slot (t - a) % Lb holds khat_t, v_t, z_t for t in [max(a, T - Lb), T) (by position in
//           the document, as the steps from there place them); other slots z = -1.
// Three launches: each token's segment (0: it enters the cache; 1: it does not), the tokens' lists
// by (head, row, segment, code) in token order (code_lists, vq_code_lists.cu: a stable radix sort),
// then the cache kernel: grid (row x head, 64 value dims, groups of codes), a warp per code and a
// lane per two value dims, walking the code's list with the step's own update in registers. Each
// mean sees the same operations in the same order as stepping, so the state has the same bits.
// The ring is copied by the code group 0 CTAs (values: their 64 dims; keys and codes: dims group
// 0). Workspace (vq_attn_state_prefill_workspace_bytes): the segments [B T] int32, then the lists.
#include <algorithm>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace {

using cuda::to_float;

constexpr int kWarps = 8;
constexpr int kDimsPerCta = 64;  // two per lane

__device__ __forceinline__ int64_t last_doc_start(const int32_t* doc_start, int64_t b, int64_t T) {
  return doc_start ? doc_start[b * T + T - 1] : 0;
}

// The position in its document of the token that holds ring slot i after the document's first n
// tokens (the latest r < n with r % Lb == i), or -1.
__device__ __forceinline__ int64_t ring_position(int64_t i, int64_t n, int64_t Lb) {
  return i < n ? i + (n - 1 - i) / Lb * Lb : -1;
}

// Thread per (b, t): segment 0 for the tokens that enter the cache, 1 for the rest.
__global__ void prefill_segments_kernel(const int32_t* __restrict__ doc_start, int64_t B, int64_t T, int64_t Lb,
                                        int32_t* __restrict__ seg) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= B * T) return;
  const int64_t b = i / T, t = i % T;
  seg[i] = t >= last_doc_start(doc_start, b, T) && t < T - Lb ? 0 : 1;
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    prefill_cache_kernel(VqAttnLayout L, const T* __restrict__ khat, const int32_t* __restrict__ z,
                         const T* __restrict__ v, vq_cuda::CodeLists lists, float* __restrict__ ring_khat,
                         float* __restrict__ ring_v, int32_t* __restrict__ ring_z, float* __restrict__ counts,
                         float* __restrict__ means) {
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H, S = L.S, Dv = L.Dv, Lb = L.Lb;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t d0 = blockIdx.y * int64_t{kDimsPerCta} + 2 * lane, d1 = d0 + 1;
  const T* vb = v + b * L.v.b + h * Dv;
  // Segment 0 of (h, b): key (h B + b) 2 S + s.
  const int32_t* start = lists.start + (h * L.B + b) * 2 * S;
  for (int64_t s = blockIdx.z * int64_t{kWarps} + warp; s < S; s += int64_t{gridDim.z} * kWarps) {
    const int32_t j0 = start[s], j1 = start[s + 1];
    float u0 = 0.f, u1 = 0.f;
#pragma unroll 4
    for (int32_t j = j0; j < j1; ++j) {
      const T* vt = vb + int64_t{lists.tok[j]} * L.v.t;
      const float k = static_cast<float>(j - j0 + 1);
      if (d0 < Dv) u0 += (to_float(vt[d0]) - u0) / k;
      if (d1 < Dv) u1 += (to_float(vt[d1]) - u1) / k;
    }
    float* U = means + (bh * S + s) * Dv;
    if (d0 < Dv) U[d0] = u0;
    if (d1 < Dv) U[d1] = u1;
    if (blockIdx.y == 0 && lane == 0) counts[bh * S + s] = static_cast<float>(j1 - j0);
  }
  if (blockIdx.z != 0) return;
  const int64_t a = last_doc_start(L.docs.start, b, L.T);
  for (int64_t i = warp; i < Lb; i += kWarps) {
    const int64_t r = ring_position(i, L.T - a, Lb), t = a + r;
    if (r < 0) {
      if (blockIdx.y == 0 && lane == 0) ring_z[bh * Lb + i] = -1;
      continue;
    }
    const T* vt = vb + t * L.v.t;
    float* rv = ring_v + (bh * Lb + i) * Dv;
    if (d0 < Dv) rv[d0] = to_float(vt[d0]);
    if (d1 < Dv) rv[d1] = to_float(vt[d1]);
    if (blockIdx.y != 0) continue;
    const T* kt = khat + b * L.khat.b + t * L.khat.t + h * L.Dk;
    for (int64_t e = lane; e < L.Dk; e += 32) ring_khat[(bh * Lb + i) * L.Dk + e] = to_float(kt[e]);
    if (lane == 0) ring_z[bh * Lb + i] = z[(b * L.T + t) * L.H + h];
  }
}

}  // namespace

void vq_attn_state_prefill_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& khat, const Tensor& z,
                                const Tensor& v, const VqAttnState& state) {
  if (L.B * L.H == 0) return;
  cudaStream_t st = cuda::stream_of(ctx);
  const size_t seg_bytes = (static_cast<size_t>(L.B * L.T) * sizeof(int32_t) + 255) / 256 * 256;
  auto* seg = static_cast<int32_t*>(ctx.workspace);
  prefill_segments_kernel<<<cuda::grid_1d(L.B * L.T, 256), 256, 0, st>>>(L.docs.start, L.B, L.T, L.Lb, seg);
  LINAC_CUDA_LAUNCH_CHECK();
  const vq_cuda::CodeLists lists = vq_cuda::code_lists(ctx, z.data<int32_t>(), seg, L.B, L.T, L.H, L.S, 1, 2,
                                                       static_cast<char*>(ctx.workspace) + seg_bytes,
                                                       ctx.workspace_bytes - seg_bytes, "vq_attn_state_prefill");
  // Groups of codes so that the grid has about two CTAs per SM (each code one warp's walk).
  const int64_t dim_groups = (L.Dv + kDimsPerCta - 1) / kDimsPerCta, pairs = L.B * L.H * dim_groups;
  const int64_t code_groups =
      std::clamp<int64_t>((2 * gpu_sm_count() + pairs - 1) / pairs, 1, (L.S + kWarps - 1) / kWarps);
  const dim3 grid(static_cast<unsigned>(L.B * L.H), static_cast<unsigned>(dim_groups),
                  static_cast<unsigned>(code_groups));
  LINAC_GPU_DISPATCH(khat.dtype, T, {
    prefill_cache_kernel<T><<<grid, kWarps * 32, 0, st>>>(
        L, khat.data<T>(), z.data<int32_t>(), v.data<T>(), lists, state.khat.data<float>(), state.v.data<float>(),
        state.z.data<int32_t>(), state.counts.data<float>(), state.means.data<float>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
