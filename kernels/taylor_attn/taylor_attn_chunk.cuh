// The per-chunk CUDA kernel of the chunked Taylor attention (modes and operands in
// taylor_attn_common.cuh; math in taylor_attn.h), included by one translation unit per mode
// (taylor_attn_chunk_{out,grad_q,grad_k}.cu): its 24 instances took 120 s in one, the build's
// longest compile by 4x. Grid (N, P), four warps, warp w owns the
// chunk's rows 16w..16w+15 (queries for kOut/kGradQ, keys for kGradK):
//   intra  U = X Xo^T on tensor cores (one k-step: F = 16); the masked matrix kappa(U) (out) or
//          (Y Z^T) * (1 + U) (grad) goes through shared memory in the activation dtype into
//          the next matmul with Z or Xo, visiting only the 16-row blocks the mask leaves.
//   inter  the exclusive state streams through in 32-row feature slices (a 4-deep cp.async
//          ring; the segment's carry from the scan added on arrival). out: phi(X) for the slice
//          is formed in shared memory, acc += phi(X) S_slice (f32 accumulators sized by kNT).
//          grad: G = Y S_slice^T (dL/dphi(x) for the slice's features) is contracted with x at once
//          in registers: each G[t, 16b + j] (b < 16) adds x_j G to dx_b and x_b G to dx_j (times
//          1/sqrt 2), G[t, 256 + j] adds G to dx_j. Lane-local partials are summed over the four
//          lanes of a row in a fixed order, so the result is deterministic.
// Documents (kDocs; taylor_attn.h): the chunk's document starts and a per-row 0/1 weight of the
// inter-chunk term go to shared memory first. The masked matrix also drops the pairs of two
// documents; the inter term of a row whose weight is 0 (forward modes: a query whose document
// starts in the chunk; kGradK: a key before the last document start of the chunk) is removed by
// zero Phi rows (out) and by the weight in the epilogue (dx); the segment's carry is added only
// when no document started between the segment's edge and the chunk.
#pragma once

#include <type_traits>

#include "taylor_attn/taylor_attn_common.cuh"

namespace linac {
namespace taylor_cuda {
namespace {

constexpr int kSlice = 32;   // feature rows per streamed state slice
constexpr int kSStages = 4;  // slices in flight
constexpr int kSlices = kRows / kSlice;

struct ChunkSmem {
  int ldx, ldv, ldphi, ldm, ldf;
  int x, xo, y, z, s, phi, m, dx, doc, bytes;  // byte offsets
  template <class T>
  __host__ __device__ static ChunkSmem of(int DvP, int mode, bool docs) {
    ChunkSmem c{};
    const int e = static_cast<int>(sizeof(T));
    c.ldx = ld_of<T>(kF), c.ldv = ld_of<T>(DvP), c.ldphi = ld_of<T>(kSlice), c.ldm = ld_of<T>(kC), c.ldf = kF + 4;
    int off = 0;
    auto take = [&](int bytes) {
      const int r = off;
      off += (bytes + 15) / 16 * 16;
      return r;
    };
    c.x = take(kC * c.ldx * e);
    c.xo = take(kC * c.ldx * e);
    c.y = take(mode == kOut ? 0 : kC * c.ldv * e);
    c.z = take(kC * c.ldv * e);
    c.s = take(kSStages * kSlice * c.ldv * e);
    c.phi = take(mode == kGradQ ? 0 : kC * c.ldphi * e);
    c.m = take(kC * c.ldm * e);
    c.dx = take(mode == kOut ? 0 : kC * c.ldf * 4);
    c.doc = take(docs ? kC * 8 : 0);  // int starts [kC], then float inter weights [kC]
    c.bytes = off;
    return c;
  }
};

// CTAs per SM each build must reach (register caps). bf16, Dv <= 64: 4 is the shared-memory
// limit; the dk/dv mode holds both accumulator sets, and 3 keeps it at <= 168 registers.
template <class T, int kMode, int kNT>
constexpr int kMinCtas = sizeof(T) == 4 ? 2 : (kNT == kNTSmall ? 4 : 3) - (kMode == kGradK ? 1 : 0);

template <class T, int kMode, int kNT, bool kDocs>
__global__ void __launch_bounds__(128, (kMinCtas<T, kMode, kNT>))
    chunk_kernel(Args a, const T* __restrict__ x, const T* __restrict__ xo, const T* __restrict__ y,
                 const T* __restrict__ z, const T* __restrict__ states, const float* __restrict__ carry,
                 T* __restrict__ out, TaylorAttnLayout::Strides os, float* __restrict__ den,
                 T* __restrict__ dx, TaylorAttnLayout::Strides dxs) {
  using linac::cuda::from_float;
  using linac::cuda::to_float;
  constexpr bool kUpper = kMode == kGradK, kHasOut = kMode != kGradQ, kHasGrad = kMode != kOut;
  extern __shared__ __align__(16) unsigned char smem[];
  const ChunkSmem L = ChunkSmem::of<T>(a.DvP, kMode, kDocs);
  T* X = reinterpret_cast<T*>(smem + L.x);
  T* Xo = reinterpret_cast<T*>(smem + L.xo);
  T* Y = reinterpret_cast<T*>(smem + L.y);
  T* Z = reinterpret_cast<T*>(smem + L.z);
  T* Sb = reinterpret_cast<T*>(smem + L.s);
  T* Phi = reinterpret_cast<T*>(smem + L.phi);
  T* M = reinterpret_cast<T*>(smem + L.m);
  float* DX = reinterpret_cast<float*>(smem + L.dx);
  int* Dst = reinterpret_cast<int*>(smem + L.doc);                  // start of each token of the chunk
  float* Dw = reinterpret_cast<float*>(smem + L.doc + kC * 4);      // 1: the row reads the carried state
  const int n = blockIdx.x, pl = blockIdx.y, pair = a.p0 + pl, b = pair / a.H, h = pair % a.H;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, m0 = 16 * warp, DvP = a.DvP;
  const int rows = min(kC, a.T - n * kC), ntv = DvP / 8, ksv = DvP / 16;
  const int64_t r0 = (static_cast<int64_t>(pl) * a.N + n) * kC, t0 = static_cast<int64_t>(n) * kC;
  const T* Sn = states + (static_cast<int64_t>(pl) * a.N + n) * kRows * DvP;
  // The first segment (forward) / last (reverse) starts from zero: no carry to add.
  const int seg = n / kSegChunks;
  bool use_carry = kMode == kGradK ? seg < a.nseg - 1 : seg > 0;
  const int32_t* start = kDocs ? a.doc_start + static_cast<int64_t>(b) * a.T : nullptr;
  if constexpr (kDocs) {
    // Forward: no document start in [segment start, t0); reverse: none in [t0 + kC, segment end].
    const int64_t seg_t0 = static_cast<int64_t>(seg) * kSegChunks * kC;
    const int64_t seg_t1 = min(seg_t0 + kSegChunks * kC, static_cast<int64_t>(a.T)) - 1;
    if (use_carry) use_carry = kMode == kGradK ? start[seg_t1] < t0 + kC : start[t0 - 1] < seg_t0;
  }
  const float* Cn = use_carry ? carry + (static_cast<int64_t>(pl) * a.nseg + seg) * kRows * DvP : nullptr;
  const Frag f;

  load_rows<T, 128>(X, L.ldx, x + r0 * kF, kF, kC, kF);
  load_rows<T, 128>(Xo, L.ldx, xo + r0 * kF, kF, kC, kF);
  if (kHasGrad) load_rows<T, 128>(Y, L.ldv, y + r0 * DvP, DvP, kC, DvP);
  load_rows<T, 128>(Z, L.ldv, z + r0 * DvP, DvP, kC, DvP);
  cp_async_commit();
  // Slice sl goes to ring buffer sl % kSStages; a group per slice (empty past the end), so the
  // group count stays uniform.
  auto issue_slice = [&](int sl) {
    if (sl < kSlices)
      load_rows<T, 128>(Sb + (sl % kSStages) * kSlice * L.ldv, L.ldv, Sn + static_cast<int64_t>(sl) * kSlice * DvP,
                        DvP, kSlice, DvP);
    cp_async_commit();
  };
  for (int sl = 0; sl < kSStages - 1; ++sl) issue_slice(sl);
  if constexpr (kDocs) {
    // Padding rows count as documents of their own, so no pair reaches them.
    const int last = start[t0 + rows - 1];
    for (int i = tid; i < kC; i += 128) {
      const int st = i < rows ? start[t0 + i] : static_cast<int>(t0) + i;
      Dst[i] = st;
      Dw[i] = (kMode == kGradK ? t0 + i >= last : st < t0) ? 1.f : 0.f;
    }
  }
  cp_async_wait<kSStages - 1>();  // the chunk's tiles
  __syncthreads();

  // ---- intra-chunk ----
  auto keep = [&](int r, int c) {
    if constexpr (kDocs)  // (query, key) = (t0 + r, t0 + c), or (t0 + c, t0 + r) for kGradK
      return kUpper ? c >= r && Dst[c] <= t0 + r : c <= r && t0 + c >= Dst[r];
    return kUpper ? c >= r : c <= r;
  };
  // The masked matrix of this warp's rows into M (only this warp reads them back).
  auto write_m = [&](const float (&v)[8][4]) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
        store2(M + r * L.ldm + c, keep(r, c) ? v[nt][2 * hf] : 0.f, keep(r, c + 1) ? v[nt][2 * hf + 1] : 0.f);
      }
    __syncwarp();
  };
  // Key blocks the mask leaves for this warp's rows: k-steps [k0, k0 + ks) of 16 rows.
  const int k0 = kUpper ? m0 : 0, ks = kUpper ? 4 - warp : warp + 1;
  float U[8][4] = {};
  warp_mma<T, false, false, 8>(U, X, L.ldx, m0, 0, Xo, L.ldx, 0, 0, 1);
  float dxi[2][4] = {};
  if (kHasGrad) {
    float Pm[8][4] = {};
    warp_mma<T, false, false, 8>(Pm, Y, L.ldv, m0, 0, Z, L.ldv, 0, 0, ksv);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) Pm[nt][e] *= 1.f + U[nt][e];
    write_m(Pm);
    warp_mma<T, false, true, 2>(dxi, M, L.ldm, m0, k0, Xo, L.ldx, k0, 0, ks);
    __syncwarp();
  }
  float acc[kNT][4] = {};
  if (kHasOut) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) U[nt][e] = 1.f + U[nt][e] + 0.5f * U[nt][e] * U[nt][e];
    write_m(U);
    warp_mma<T, false, true, kNT>(acc, M, L.ldm, m0, k0, Z, L.ldv, k0, 0, ks, ntv);
  }

  // ---- inter-chunk: the exclusive state, slice by slice ----
  float dxa[2][kF] = {}, dxb[2][2][2] = {}, dx1[2][2][2] = {};
  float xj[2][2][2];  // x[row][8 h + 2 q + e] of this lane's rows g, g + 8
#pragma unroll
  for (int ri = 0; ri < 2; ++ri)
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
      for (int ee = 0; ee < 2; ++ee) xj[ri][h8][ee] = to_float(X[(m0 + f.g + 8 * ri) * L.ldx + 8 * h8 + 2 * f.q + ee]);
  // The slice's carry (float4s, all in flight at once) is fetched before the wait for the slice,
  // so its latency overlaps the barrier and the Phi build.
  constexpr int kCarry4 = kSlice * 8 * kNT / 4 / 128;
  const int n4 = kSlice * DvP / 4;
  float4 cv[kCarry4];
#pragma unroll
  for (int sl = 0; sl < kSlices; ++sl) {
    if (Cn) {
      const float4* cs = reinterpret_cast<const float4*>(Cn + static_cast<int64_t>(sl) * kSlice * DvP);
#pragma unroll
      for (int i = 0; i < kCarry4; ++i)
        if (tid + 128 * i < n4) cv[i] = cs[tid + 128 * i];
    }
    cp_async_wait<kSStages - 2>();
    __syncthreads();  // slice sl landed; every warp is done with the buffer and Phi refilled next
    issue_slice(sl + kSStages - 1);
    if (kHasOut)
      for (int idx = tid; idx < kC * kSlice; idx += 128) {
        const int tok = idx / kSlice, c = idx % kSlice;
        const float phi = feature(X + tok * L.ldx, (kSlice / 16) * sl + c / 16, c % 16);
        Phi[tok * L.ldphi + c] = from_float<T>(kDocs ? Dw[tok] * phi : phi);
      }
    T* Ss = Sb + (sl % kSStages) * kSlice * L.ldv;
    if (Cn) {  // segment-local state + the segment's carry
#pragma unroll
      for (int i = 0; i < kCarry4; ++i) {
        const int e = 4 * (tid + 128 * i);
        if (e >= 4 * n4) continue;
        T* sp = Ss + (e / DvP) * L.ldv + e % DvP;
        const float4 s4 = linac::cuda::load4(sp);
        linac::cuda::store4(sp, make_float4(s4.x + cv[i].x, s4.y + cv[i].y, s4.z + cv[i].z, s4.w + cv[i].w));
      }
    }
    __syncthreads();
    if (kHasOut) warp_mma<T, false, true, kNT>(acc, Phi, L.ldphi, m0, 0, Ss, L.ldv, 0, 0, kSlice / 16, ntv);
    if (kHasGrad) {
      float G[kSlice / 8][4] = {};
      warp_mma<T, false, false, kSlice / 8>(G, Y, L.ldv, m0, 0, Ss, L.ldv, 0, 0, ksv);
#pragma unroll
      for (int nt = 0; nt < kSlice / 8; ++nt) {
        const int fb = (kSlice / 16) * sl + nt / 2, h8 = nt & 1;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ri = e >> 1, ee = e & 1;
          if (fb < kF) {
            dxa[ri][fb] = fmaf(G[nt][e], xj[ri][h8][ee], dxa[ri][fb]);
            dxb[ri][h8][ee] = fmaf(G[nt][e], to_float(X[(m0 + f.g + 8 * ri) * L.ldx + fb]), dxb[ri][h8][ee]);
          } else if (fb == kF) {
            dx1[ri][h8][ee] += G[nt][e];
          }
        }
      }
    }
  }

  // ---- epilogue ----
  if (kHasGrad) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int i = 0; i < kF; ++i) {
        float v = dxa[ri][i];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (f.q == 0) DX[(m0 + f.g + 8 * ri) * L.ldf + i] = kDocs ? Dw[m0 + f.g + 8 * ri] * (kRsqrt2 * v) : kRsqrt2 * v;
      }
    __syncwarp();
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
        for (int ee = 0; ee < 2; ++ee) {
          float* dxp = DX + (m0 + f.g + 8 * ri) * L.ldf + 8 * h8 + 2 * f.q + ee;
          if constexpr (kDocs)
            *dxp += Dw[m0 + f.g + 8 * ri] * (kRsqrt2 * dxb[ri][h8][ee] + dx1[ri][h8][ee]) + dxi[h8][2 * ri + ee];
          else
            *dxp += kRsqrt2 * dxb[ri][h8][ee] + dx1[ri][h8][ee] + dxi[h8][2 * ri + ee];
        }
    __syncwarp();
    T* dxb_ = dx + b * dxs.b + t0 * dxs.t + h * kF;
    for (int idx = lane; idx < 16 * kF / 2; idx += 32) {
      const int r = m0 + idx / (kF / 2), c = 2 * (idx % (kF / 2));
      if (r < rows) store2(dxb_ + r * dxs.t + c, 0.5f * DX[r * L.ldf + c], 0.5f * DX[r * L.ldf + c + 1]);
    }
  }
  if (kHasOut) {
    float d[2] = {1.f, 1.f};
    if (kMode == kOut) strip_den(acc, a, pair, t0, m0, rows, den, d);
    store_strip(acc, d, m0, rows, a.Dv, out + b * os.b + t0 * os.t + h * a.Dv, os.t);
  }
}

}  // namespace

template <Mode kMode, class T>
void launch_chunk(const Ctx& ctx, const Args& a, int P, const T* x, const T* xo, const T* y, const T* z,
                  const T* states, const float* carry, T* out, TaylorAttnLayout::Strides os, float* den, T* dx,
                  TaylorAttnLayout::Strides dxs) {
  const bool docs = a.doc_start != nullptr;
  const int bytes = ChunkSmem::of<T>(a.DvP, kMode, docs).bytes;
  auto pick = [&](auto nt, auto doc) { return chunk_kernel<T, kMode, decltype(nt)::value, decltype(doc)::value>; };
  auto by_docs = [&](auto nt) { return docs ? pick(nt, std::true_type{}) : pick(nt, std::false_type{}); };
  auto kernel = a.DvP / 8 <= kNTSmall ? by_docs(std::integral_constant<int, kNTSmall>{})
                                      : by_docs(std::integral_constant<int, kNTLarge>{});
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(P));
  kernel<<<grid, 128, bytes, cuda::stream_of(ctx)>>>(a, x, xo, y, z, states, carry, out, os, den, dx, dxs);
  LINAC_CUDA_LAUNCH_CHECK();
}

// The launcher of one mode for both activation dtypes (in that mode's translation unit).
#define LINAC_TAYLOR_CHUNK_MODE(MODE)                                                                                  \
  template void launch_chunk<MODE, float>(const Ctx&, const Args&, int, const float*, const float*, const float*,      \
                                          const float*, const float*, const float*, float*, TaylorAttnLayout::Strides, \
                                          float*, float*, TaylorAttnLayout::Strides);                                  \
  template void launch_chunk<MODE, bf16_t>(const Ctx&, const Args&, int, const bf16_t*, const bf16_t*, const bf16_t*,  \
                                           const bf16_t*, const bf16_t*, const float*, bf16_t*,                        \
                                           TaylorAttnLayout::Strides, float*, bf16_t*, TaylorAttnLayout::Strides);

}  // namespace taylor_cuda
}  // namespace linac
