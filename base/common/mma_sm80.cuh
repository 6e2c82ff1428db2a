// The sm_80+ tensor-core toolkit shared by the mma.sync kernels (attention, GLA, Latte, Lightning,
// Taylor): cp.async tile loads into padded shared memory (short_conv stages its rows with it too),
// ldmatrix, mma.sync m16n8k16 bf16 -> f32, and a warp-level matmul over shared-memory tiles in
// either storage order.
//
// Tiles live in shared memory row-major with rows padded by 16 bytes (ld_of), so the 8 row
// addresses of an ldmatrix phase and of the cp.async stores land in 8 different bank groups.
// warp_mma computes a 16-row strip of C (f32 accumulators in the mma.sync m16n8k16 layout:
// lane (g = lane/4, q = lane%4) holds C[g][2q..2q+1] and C[g+8][2q..2q+1] of each 16x8 n-tile)
// from A stored [m][k] or [k][m] and B stored [n][k] or [k][n]:
//   bf16: ldmatrix (.trans for A stored [k][m] and B stored [k][n]) + mma.sync bf16 -> f32
//   f32:  the same fragment layout computed with SIMT fmas, so every epilogue is shared and the
//         fp32 path is exact fp32 (no TF32).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/cuda_common.cuh"

namespace linac::sm80 {

using bf16_t = __nv_bfloat16;
using cuda::cdiv;

// Padded row length (elements) of a shared-memory tile with `cols` columns.
template <class T>
__host__ __device__ constexpr int ld_of(int cols) {
  return cols + 16 / static_cast<int>(sizeof(T));
}
template <class T>
__host__ __device__ constexpr int tile_bytes(int rows, int cols) {
  return rows * ld_of<T>(cols) * static_cast<int>(sizeof(T));
}

template <class T>
__device__ __forceinline__ void store2(T* p, float a, float b) {
  if constexpr (sizeof(T) == 2)
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Two adjacent elements (even index) as floats.
__device__ __forceinline__ float2 load2f(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2f(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// ---- cp.async ------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; zero-fills when !valid (src must still be a mapped address). dst is
// a shared-memory address (smem_u32) or a pointer into shared memory.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) { cp_async16(smem_u32(dst), src, valid); }
// kBytes = 4, 8 or 16 bytes global -> shared through L1 (.ca: the only form for 4 and 8 bytes).
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_u32(dst)), "l"(src), "n"(kBytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// All NT threads copy a ROWS x COLS tile whose row r starts at src + r * stride into dst (row
// length ld). Rows >= valid_rows and columns >= valid_cols (a multiple of 16 bytes) read as 0.
template <class T, int ROWS, int COLS, int NT>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, int64_t stride, int valid_rows,
                                          int valid_cols) {
  constexpr int V = 16 / static_cast<int>(sizeof(T)), CPR = COLS / V;
  static_assert(COLS % V == 0, "tile width must be a multiple of 16 bytes");
  for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * CPR; idx += NT) {
    const int r = idx / CPR, c = (idx % CPR) * V;
    const bool ok = r < valid_rows && c < valid_cols;
    cp_async16(dst + r * ld + c, ok ? src + r * stride + c : src, ok);
  }
}

// ---- warp-level matmul ---------------------------------------------------------------------

// Four 8x8 b16 matrices from shared memory (at an address or a pointer), plain or transposed.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(const void* p, uint32_t (&r)[4]) { ldsm_x4(smem_u32(p), r); }
__device__ __forceinline__ void ldsm_x4_trans(const void* p, uint32_t (&r)[4]) { ldsm_x4_trans(smem_u32(p), r); }

// c += a * b for a 16x16 (row) bf16 A, a 16x8 (col) bf16 B and a 16x8 f32 C. Fragment layout
// (g = lane / 4, q = lane % 4): a0 (g, 2q..2q+1), a1 (g+8, 2q..), a2 (g, 2q+8..), a3 (g+8, 2q+8..);
// b0 (k 2q..2q+1, n g), b1 (k 2q+8.., n g); c0,c1 (g, 2q..2q+1), c2,c3 (g+8, 2q..2q+1).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragments of one 16 x 16 tile, for kernels that schedule their own mmas: A at (m0, k0) of A stored
// [m][k] (a0..a3 as mma_bf16 takes them); B at (k0, n0) of B stored [k][n] or [n][k] (b0, b1: n-tile
// n0, b2, b3: n-tile n0 + 8).
template <class T>
__device__ __forceinline__ void ldsm_a_mk(const T* A, int lda, int m0, int k0, uint32_t (&a)[4]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  ldsm_x4(A + (m0 + (lane & 15)) * lda + k0 + (lane >> 4) * 8, a);
}
template <class T>
__device__ __forceinline__ void ldsm_b_kn(const T* B, int ldb, int k0, int n0, uint32_t (&b)[4]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  ldsm_x4_trans(B + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb + n0 + (lane >> 4) * 8, b);
}
template <class T>
__device__ __forceinline__ void ldsm_b_nk(const T* B, int ldb, int k0, int n0, uint32_t (&b)[4]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  ldsm_x4(B + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ldb + k0 + ((lane >> 3) & 1) * 8, b);
}

// acc[nt] += A[am0 .. am0+15][ak0 + 16 ks ..] * B[bk0 + 16 ks ..][bn0 + 8 nt ..] for ks < ksteps and
// nt < nt_valid (even; NT even). kAKM: A stored [k][m] (element (m,k) at A[k*lda + m]), else [m][k].
// kBKN: B stored [k][n] (element (k,n) at B[k*ldb + n]), else [n][k]. All 32 lanes take part.
template <class T, bool kAKM, bool kBKN, int NT>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const T* A, int lda, int am0, int ak0, const T* B,
                                         int ldb, int bk0, int bn0, int ksteps, int nt_valid = NT) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if constexpr (sizeof(T) == 2) {
    for (int ks = 0; ks < ksteps; ++ks) {
      const int ka = ak0 + 16 * ks, kb = bk0 + 16 * ks;
      uint32_t a[4];
      if constexpr (kAKM) {
        const int j = lane >> 3;
        ldsm_x4_trans(A + (ka + (lane & 7) + (j >> 1) * 8) * lda + am0 + (j & 1) * 8, a);
      } else {
        ldsm_a_mk(A, lda, am0, ka, a);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        if (2 * np >= nt_valid) break;
        const int n0 = bn0 + 16 * np;
        uint32_t b[4];
        if constexpr (kBKN)
          ldsm_b_kn(B, ldb, kb, n0, b);
        else
          ldsm_b_nk(B, ldb, kb, n0, b);
        mma_bf16(acc[2 * np], a, b[0], b[1]);
        mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
  } else {
    const int g = lane >> 2, q = lane & 3;
    auto at_a = [&](int m, int k) { return kAKM ? A[k * lda + m] : A[m * lda + k]; };
    auto at_b = [&](int k, int n) { return kBKN ? B[k * ldb + n] : B[n * ldb + k]; };
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= nt_valid) break;
      const int n = bn0 + 8 * nt + 2 * q;
      for (int kk = 0; kk < 16 * ksteps; ++kk) {
        const float a0 = at_a(am0 + g, ak0 + kk), a1 = at_a(am0 + g + 8, ak0 + kk);
        const float b0 = at_b(bk0 + kk, n), b1 = at_b(bk0 + kk, n + 1);
        acc[nt][0] = fmaf(a0, b0, acc[nt][0]);
        acc[nt][1] = fmaf(a0, b1, acc[nt][1]);
        acc[nt][2] = fmaf(a1, b0, acc[nt][2]);
        acc[nt][3] = fmaf(a1, b1, acc[nt][3]);
      }
    }
  }
}

// Coordinates of accumulator element e of n-tile nt of a warp strip at (m0, n0).
struct Frag {
  int g, q;
  __device__ Frag() : g((static_cast<int>(threadIdx.x) & 31) >> 2), q(static_cast<int>(threadIdx.x) & 3) {}
  __device__ int row(int m0, int e) const { return m0 + g + 8 * (e >> 1); }
  __device__ int col(int n0, int nt, int e) const { return n0 + 8 * nt + 2 * q + (e & 1); }
};

// Row g (hf = 0) or g + 8 (hf = 1) of four adjacent bf16 n-tiles nt0..nt0+3 as 8 contiguous columns
// per lane: lane q receives n-tile nt0 + q, columns 8 (nt0 + q) + 0..7 (a 4x4 transpose of the
// quad's packed pairs in two xor shuffles). One 16-byte store per lane then writes whole 32-byte
// sectors, where the accumulators' own pairs would be 4-byte stores into half sectors. Every lane
// of the warp must call it.
template <int NT>
__device__ __forceinline__ uint4 quad_rows_bf16(const float (&acc)[NT][4], int nt0, int hf) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(acc[nt0 + j][2 * hf], acc[nt0 + j][2 * hf + 1]);
    w[j] = *reinterpret_cast<const uint32_t*>(&p);
  }
  const int q = static_cast<int>(threadIdx.x) & 3;
  const bool hi = q & 2, odd = q & 1;
  // Swap the off-diagonal 2x2 blocks with lane q ^ 2, then transpose each block with lane q ^ 1.
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? w[0] : w[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? w[1] : w[3], 2);
  if (hi) {
    w[0] = r0;
    w[1] = r1;
  } else {
    w[2] = r0;
    w[3] = r1;
  }
  r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
  if (odd) {
    w[0] = r0;
    w[2] = r1;
  } else {
    w[1] = r0;
    w[3] = r1;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The rows < `rows`, columns < `cols` corner of a warp's 16-row strip of f32 accumulators (rows
// m0.., n-tiles from column n0) into bf16 `out` (row length ld; rows 16-byte aligned, cols a
// multiple of 8) in 16-byte pieces of rows, through quad_rows_bf16.
template <int NT>
__device__ __forceinline__ void store_strip_bf16(bf16_t* out, int64_t ld, const float (&acc)[NT][4], int m0, int n0,
                                                 int rows, int cols) {
  static_assert(NT % 4 == 0, "whole quads of n-tiles");
  const Frag f;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int nt0 = 0; nt0 < NT; nt0 += 4) {
      const uint4 w = quad_rows_bf16(acc, nt0, hf);
      const int r = f.row(m0, 2 * hf), c = n0 + 8 * (nt0 + f.q);
      if (r < rows && c < cols) *reinterpret_cast<uint4*>(out + r * ld + c) = w;
    }
}

// The same corner in either activation dtype: bf16 (whole quads of n-tiles) through
// store_strip_bf16, f32 as the fragments' own pairs.
template <class T, int NT>
__device__ __forceinline__ void store_strip(T* out, int64_t ld, const float (&acc)[NT][4], int m0, int n0, int rows,
                                            int cols) {
  if constexpr (std::is_same_v<T, bf16_t> && NT % 4 == 0) {
    store_strip_bf16(out, ld, acc, m0, n0, rows, cols);
  } else {
    const Frag f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = f.row(m0, 2 * hf), c = f.col(n0, nt, 0);
        if (r < rows && c < cols) store2(out + r * ld + c, acc[nt][2 * hf], acc[nt][2 * hf + 1]);
      }
  }
}

}  // namespace linac::sm80
