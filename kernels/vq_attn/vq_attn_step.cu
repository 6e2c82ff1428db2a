// CUDA VQ-attention decode step (docs/transformer_vq.md §5; math and state layout in vq_attn.h): one CTA per
// (batch, head). Token pos scores its window (ring slots of positions pos-Lb..pos-1 that exist,
// and itself; distance d uses rho_d) and the S cache entries ((q+u).C_s + log N_s, -inf where
// empty); a fixed-order block softmax; threads own output dims and walk the entries in order.
// Then the token at pos-Lb leaves the window for the cache (N[z] += 1, Ubar[z] += (v - Ubar[z]) / N[z])
// and the new token (its rounded khat and v, in f32) takes its ring slot. State f32. Ring slots
// with z = -1 (emptied by a document start) score -inf and never enter the cache.
#include "common/cuda_common.cuh"
#include "vq_attn/vq_attn.h"

namespace linac {
namespace {

using cuda::from_float;
using cuda::to_float;

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads) vq_attn_step_kernel(
    VqStepLayout L, const T* __restrict__ q, const T* __restrict__ khat, const int32_t* __restrict__ z,
    const T* __restrict__ v, const float* __restrict__ codebook, const float* __restrict__ u,
    const float* __restrict__ vr, const float* __restrict__ rho, float* __restrict__ ring_khat,
    float* __restrict__ ring_v, int32_t* __restrict__ ring_z, float* __restrict__ counts, float* __restrict__ means,
    int64_t pos, T* __restrict__ o) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int64_t bh = blockIdx.x, b = bh / L.H, h = bh % L.H, Lb = L.Lb;
  const int64_t n_ring = pos < Lb ? pos : Lb, E = n_ring + 1 + L.S;
  float* scores = smem;           // [Lb + 1 + S]
  float* qu = scores + Lb + 1 + L.S;  // [Dk]
  float* qr = qu + L.Dk;              // [Dk]
  const T* kt = khat + b * L.khat + h * L.Dk;
  const T* vt = v + b * L.v + h * L.Dv;
  const float* kh_rows = ring_khat + bh * Lb * L.Dk;
  float* v_rows = ring_v + bh * Lb * L.Dv;
  float* N = counts + bh * L.S;
  float* U = means + bh * L.S * L.Dv;
  for (int64_t i = threadIdx.x; i < L.Dk; i += kThreads) {
    const float qv = to_float(q[b * L.q + h * L.Dk + i]);
    qu[i] = qv + u[h * L.Dk + i];
    qr[i] = qv + vr[h * L.Dk + i];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t e = threadIdx.x; e < E; e += kThreads) {
    float sc = -INFINITY;
    if (e <= n_ring) {
      const float* rd = rho + (h * (Lb + 1) + e) * L.Dk;
      sc = 0;
      if (e == 0) {
        for (int64_t i = 0; i < L.Dk; ++i) sc += qu[i] * to_float(kt[i]) + qr[i] * rd[i];
      } else if (ring_z[bh * Lb + (pos - e) % Lb] >= 0) {
        const float* kr = kh_rows + ((pos - e) % Lb) * L.Dk;
        for (int64_t i = 0; i < L.Dk; ++i) sc += qu[i] * kr[i] + qr[i] * rd[i];
      } else {
        sc = -INFINITY;
      }
    } else {
      const int64_t c = e - n_ring - 1;
      if (N[c] > 0) {
        const float* cc = codebook + (h * L.S + c) * L.Dk;
        sc = 0;
        for (int64_t i = 0; i < L.Dk; ++i) sc += qu[i] * cc[i];
        sc += logf(N[c]);
      }
    }
    scores[e] = sc;
    m = fmaxf(m, sc);
  }
  m = cuda::block_max(m, scratch);
  float den = 0;
  for (int64_t e = threadIdx.x; e < E; e += kThreads) {
    const float p = scores[e] == -INFINITY ? 0.f : expf(scores[e] - m);
    scores[e] = p;
    den += p;
  }
  den = cuda::block_sum(den, scratch);  // ends after a barrier: every score is in place
  const int64_t slot = pos % Lb;
  const int32_t z_out = pos >= Lb ? ring_z[bh * Lb + slot] : -1;
  const float n_out = z_out >= 0 ? N[z_out] + 1 : 0.f;
  for (int64_t d = threadIdx.x; d < L.Dv; d += kThreads) {
    float acc = scores[0] * to_float(vt[d]);
    for (int64_t e = 1; e <= n_ring; ++e) acc += scores[e] * v_rows[((pos - e) % Lb) * L.Dv + d];
    for (int64_t c = 0; c < L.S; ++c)
      if (scores[n_ring + 1 + c] != 0.f) acc += scores[n_ring + 1 + c] * U[c * L.Dv + d];
    o[b * L.o + h * L.Dv + d] = from_float<T>(acc / den);
  }
  __syncthreads();  // every thread has read the state before it changes
  for (int64_t d = threadIdx.x; d < L.Dv; d += kThreads) {
    float* vs = v_rows + slot * L.Dv + d;
    if (z_out >= 0) U[z_out * L.Dv + d] += (*vs - U[z_out * L.Dv + d]) / n_out;
    *vs = to_float(vt[d]);
  }
  for (int64_t i = threadIdx.x; i < L.Dk; i += kThreads) ring_khat[(bh * Lb + slot) * L.Dk + i] = to_float(kt[i]);
  if (threadIdx.x == 0) {
    if (z_out >= 0) N[z_out] = n_out;
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
                       const VqAttnState& state, int64_t pos, const Tensor& o) {
  if (L.B * L.H == 0) return;
  const size_t smem = static_cast<size_t>(L.Lb + 1 + L.S + 2 * L.Dk) * sizeof(float);
  LINAC_CHECK(smem <= 200 * 1024, "vq_attn_step: block length and codebook too large for shared memory");
  LINAC_GPU_DISPATCH(q.dtype, T, {
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(vq_attn_step_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    vq_attn_step_kernel<T><<<static_cast<unsigned>(L.B * L.H), kThreads, smem, cuda::stream_of(ctx)>>>(
        L, q.data<T>(), khat.data<T>(), z.data<int32_t>(), v.data<T>(), codebook.data<float>(), u.data<float>(),
        vr.data<float>(), rho.data<float>(), state.khat.data<float>(), state.v.data<float>(),
        state.z.data<int32_t>(), state.counts.data<float>(), state.means.data<float>(), pos, o.data<T>());
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
