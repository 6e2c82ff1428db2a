// Skinny GEMM for decoding (math in matmul.h): C[M, N] = alpha * A[M, K] W[N, K]^T + beta * C with
// M <= kSkinnyMaxRows, A and W bf16 (row-major, W a linear layer's [out, in] weight), C bf16 or
// f32, accumulated in f32 by mma.sync m16n8k16 with A's rows padded to 8 or 16.
//
// A decoding step multiplies a few rows by every weight matrix once: the product is bound by
// reading W, which cuBLASLt's tiled kernels (and our Hopper GEMMs, 128-row tiles) read at a
// fraction of the memory bandwidth for M this small.
//
// Tiling. A CTA of 8 warps owns kNT tiles of 8 columns (kNT = 1, 2 or 4 by N, so narrow matrices
// still spread over the GPU): warp w takes tile w % kNT and every (8 / kNT)-th chunk of 32 k
// values from chunk w / kNT on. Per chunk, lane (g, q) = (lane / 4, lane % 4) loads 16 bytes of W:
// row g of the tile, k = 8q .. 8q + 7 of the chunk. Those four words are the B fragments of two
// mmas (b0, b1 = words 0, 1, then 2, 3), so each mma's 16 k positions are a permutation of 16 of
// the chunk's k values (lane q's values sit where the fragment layout puts k = 2q, 2q + 1, 2q + 8,
// 2q + 9); A's fragments are read from shared memory in the same permutation: rows g and g + 8,
// the same 8 k values, one 16-byte read each. A's rows (8 when M <= 8, else 16; rows past M and k
// past K zero) are copied into shared memory once per CTA, each row padded to an odd multiple of
// 64 bytes, so a quarter-warp's 16-byte reads (rows g, g + 1, four q) hit distinct banks. The
// warps' tiles are added through shared memory in warp order. Each C element's sum has one fixed
// order (the mmas', then the warps'), independent of the GPU: reruns are bitwise equal.
//
// Dependent launch (cuda_common.cuh): W does not depend on the kernels ahead, so each lane's first
// kInFlight chunks of W are loaded before dependent_wait(), overlapping the previous kernel's tail.
//
// matmul_skinny_glu: A = glu(H), formed while A is copied into shared memory by swiglu_math.cuh's
// function and rounded to bf16, as swiglu_fwd stores it: the same A, hence the same C, without the
// separate launch and the round trip of A through memory.
#include "common/cuda_common.cuh"
#include "common/mma_sm80.cuh"
#include "matmul/matmul.h"
#include "swiglu/swiglu_math.cuh"

namespace linac {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kChunk = 32;    // k values a warp takes per step: 16 bytes of W per lane
constexpr int kInFlight = 8;  // chunks of W a lane has in flight
constexpr int64_t kSmemLimit = 200 * 1024;

struct SkinnyArgs {
  int m, n, k;
  int64_t lda, ldb, ldc;
  float alpha, beta;
};

// Row stride (elements) of A in shared memory: covers K rounded up to whole chunks, and is an odd
// multiple of 64 bytes.
__host__ __device__ constexpr int a_ld(int k) { return (k + 63) / 64 * 64 + 32; }
constexpr int64_t kReduceBytes = int64_t{kWarps} * 32 * 4 * sizeof(float);

inline int64_t smem_bytes(int rows, int64_t k) { return rows * a_ld(static_cast<int>(k)) * 2 + kReduceBytes; }

// kGlu: A is read as is (kNoGlu), or A = glu(H) with H = a [M, 2K] (row stride lda) and the gate
// activation GluAct(kGlu).
constexpr int kNoGlu = -1;

template <int kRows, int kNT, class TC, int kGlu>
__global__ void __launch_bounds__(kThreads, 2)
    skinny_kernel(const bf16_t* __restrict__ a, const bf16_t* __restrict__ w, TC* __restrict__ c, const SkinnyArgs p) {
  constexpr int kSplit = kWarps / kNT;  // warps per column tile, each taking every kSplit-th chunk
  extern __shared__ uint4 smem[];
  const int ld = a_ld(p.k);
  bf16_t* sa = reinterpret_cast<bf16_t*>(smem);                  // [kRows][ld]
  float4* partial = reinterpret_cast<float4*>(sa + kRows * ld);  // [kWarps][32]: each warp's C fragments

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tile = warp % kNT, split = warp / kNT;
  const int n_row = (blockIdx.x * kNT + tile) * 8 + g;
  const bool n_ok = n_row < p.n;
  const bf16_t* w_row = w + static_cast<int64_t>(n_ok ? n_row : 0) * p.ldb + 8 * q;
  const int chunks = (p.k + kChunk - 1) / kChunk, step = kInFlight * kSplit;
  // This lane's 16 bytes of W for chunks first, first + kSplit, ... (zero past N and K).
  auto load_w = [&](uint4 (&dst)[kInFlight], int first) {
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int ch = first + j * kSplit;
      dst[j] = make_uint4(0, 0, 0, 0);
      if (n_ok && ch < chunks && ch * kChunk + 8 * q < p.k)
        dst[j] = __ldg(reinterpret_cast<const uint4*>(w_row + ch * kChunk));
    }
  };
  uint4 cur[kInFlight], next[kInFlight] = {};
  load_w(cur, split);
  cuda::dependent_wait();
  cuda::dependent_release();

  // A plain copy of 16 rows stores each piece before it loads the next, one load in flight per
  // thread: at batch 16 (d = 768: 6 pieces per thread) the copy is latency bound. It goes in rounds
  // of kCopy loads issued before any store, the piece's row and column stepped without divisions
  // (b16 decode of the 125M model +8%, GLA b16 +3%; NOTES.md). The 8-row tiles (batch <= 8) have
  // half the pieces, and the GLU copy two loads per piece already: both keep the plain loop.
  const int pieces = ld / 8;  // 16-byte pieces per row of sa
  auto form = [&](const bf16_t* row) {
    if constexpr (kGlu == kNoGlu) {
      return *reinterpret_cast<const uint4*>(row);
    } else {
      const uint4 g4 = *reinterpret_cast<const uint4*>(row), u4 = *reinterpret_cast<const uint4*>(row + p.k);
      const uint32_t gw[4] = {g4.x, g4.y, g4.z, g4.w}, uw[4] = {u4.x, u4.y, u4.z, u4.w};
      uint32_t out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gate = cuda::unpack_bf16(gw[j]), up = cuda::unpack_bf16(uw[j]);
        out[j] = cuda::pack_bf16(cuda::swiglu<static_cast<GluAct>(kGlu)>(gate.x, up.x),
                                 cuda::swiglu<static_cast<GluAct>(kGlu)>(gate.y, up.y));
      }
      return make_uint4(out[0], out[1], out[2], out[3]);
    }
  };
  if constexpr (kRows == 16 && kGlu == kNoGlu) {
    constexpr int kCopy = 7;
    const int dr = kThreads / pieces, dc = kThreads % pieces;
    int r = threadIdx.x / pieces, c8 = threadIdx.x % pieces;
    while (r < kRows) {
      uint4 raw[kCopy];
      int rr[kCopy], cc[kCopy];
#pragma unroll
      for (int j = 0; j < kCopy; ++j) {
        rr[j] = r, cc[j] = c8;
        raw[j] = make_uint4(0, 0, 0, 0);
        if (r < p.m && c8 * 8 < p.k) raw[j] = *reinterpret_cast<const uint4*>(a + r * p.lda + c8 * 8);
        r += dr, c8 += dc;
        if (c8 >= pieces) c8 -= pieces, ++r;
      }
#pragma unroll
      for (int j = 0; j < kCopy; ++j)
        if (rr[j] < kRows) reinterpret_cast<uint4*>(sa + rr[j] * ld)[cc[j]] = raw[j];
    }
  } else {
    for (int i = threadIdx.x; i < kRows * pieces; i += kThreads) {
      const int r = i / pieces, c8 = i - r * pieces;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < p.m && c8 * 8 < p.k) v = form(a + r * p.lda + c8 * 8);
      reinterpret_cast<uint4*>(sa + r * ld)[c8] = v;
    }
  }
  __syncthreads();

  float acc[4] = {};
  for (int first = split; first < chunks; first += step) {
    if (first + step < chunks) load_w(next, first + step);
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int ch = first + j * kSplit;
      if (ch >= chunks) break;
      const int k0 = ch * kChunk + 8 * q;  // past K (within sa's padded row): zeros in sa and cur
      const uint4 lo = *reinterpret_cast<const uint4*>(sa + g * ld + k0);
      uint4 hi = make_uint4(0, 0, 0, 0);
      if constexpr (kRows == 16) hi = *reinterpret_cast<const uint4*>(sa + (g + 8) * ld + k0);
      sm80::mma_bf16(acc, {lo.x, hi.x, lo.y, hi.y}, cur[j].x, cur[j].y);
      sm80::mma_bf16(acc, {lo.z, hi.z, lo.w, hi.w}, cur[j].z, cur[j].w);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) cur[j] = next[j];
  }
  partial[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();

  // Element e of lane l's fragment of a tile: C[l / 4 + 8 (e / 2)][2 (l % 4) + e % 2].
  for (int i = threadIdx.x; i < kNT * 32 * 4; i += kThreads) {
    const int t = i / 128, l = (i / 4) % 32, e = i % 4;
    const int row = l / 4 + 8 * (e / 2), col = (blockIdx.x * kNT + t) * 8 + 2 * (l % 4) + e % 2;
    if (row >= p.m || col >= p.n) continue;
    float s = 0.f;
    for (int sp = 0; sp < kSplit; ++sp) s += reinterpret_cast<const float*>(&partial[(sp * kNT + t) * 32 + l])[e];
    TC* out = c + row * p.ldc + col;
    const float prior = p.beta != 0.f ? p.beta * cuda::to_float(*out) : 0.f;
    *out = cuda::from_float<TC>(fmaf(p.alpha, s, prior));
  }
}

template <int kRows, int kNT, class TC, int kGlu>
void launch(const Ctx& ctx, const SkinnyArgs& a, const Tensor& A, const Tensor& W, const Tensor& C) {
  auto kernel = skinny_kernel<kRows, kNT, TC, kGlu>;
  static const bool opted_in = [&] {
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmemLimit)));
    return true;
  }();
  (void)opted_in;
  const int tiles = (a.n + 7) / 8;
  cuda::launch_dependent(ctx, kernel, dim3(static_cast<unsigned>((tiles + kNT - 1) / kNT)), dim3(kThreads),
                         static_cast<size_t>(smem_bytes(kRows, a.k)), A.data<bf16_t>(), W.data<bf16_t>(), C.data<TC>(),
                         a);
}

// Column tiles per CTA by N alone (so the summation order does not depend on the GPU): wide
// matrices (the LM head) in fewer, longer CTAs that copy A fewer times.
template <int kRows, class TC, int kGlu>
void dispatch_tiles(const Ctx& ctx, const SkinnyArgs& a, const Tensor& A, const Tensor& W, const Tensor& C) {
  const int tiles = (a.n + 7) / 8;
  if (tiles >= 2048) return launch<kRows, 4, TC, kGlu>(ctx, a, A, W, C);
  if (tiles >= 1024) return launch<kRows, 2, TC, kGlu>(ctx, a, A, W, C);
  launch<kRows, 1, TC, kGlu>(ctx, a, A, W, C);
}

SkinnyArgs args_of(const GemmProblem& p) {
  return {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.lda, p.ldb, p.ldc,
          static_cast<float>(p.alpha), static_cast<float>(p.beta)};
}

// The problem matmul_skinny_glu computes: A = glu(H) is [M, F] for H [M, 2F].
GemmProblem glu_problem(const Tensor& h, const Tensor& w, const Tensor& c) {
  GemmProblem p;
  p.m = h.size(0), p.n = w.size(0), p.k = h.size(1) / 2, p.trans_b = true;
  p.lda = h.strides[0], p.ldb = w.strides[0], p.ldc = c.strides[0];
  return p;
}

int rows_of(int64_t m) { return m <= 8 ? 8 : 16; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool matmul_skinny_applies(const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  return p.batch == 1 && !p.trans_a && p.trans_b && p.m >= 1 && p.m <= kSkinnyMaxRows && a.dtype == DType::BF16 &&
         b.dtype == DType::BF16 && (c.dtype == DType::F32 || c.dtype == DType::BF16) && p.k % 8 == 0 &&
         p.lda % 8 == 0 && p.ldb % 8 == 0 && aligned16(a.ptr) && aligned16(b.ptr) && p.n < (int64_t{1} << 30) &&
         smem_bytes(rows_of(p.m), p.k) <= kSmemLimit;
}

void matmul_skinny_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (p.n == 0) return;
  const SkinnyArgs args = args_of(p);
  const bool rows8 = rows_of(p.m) == 8;
  if (c.dtype == DType::F32)
    rows8 ? dispatch_tiles<8, float, kNoGlu>(ctx, args, a, b, c) : dispatch_tiles<16, float, kNoGlu>(ctx, args, a, b, c);
  else
    rows8 ? dispatch_tiles<8, bf16_t, kNoGlu>(ctx, args, a, b, c)
          : dispatch_tiles<16, bf16_t, kNoGlu>(ctx, args, a, b, c);
}

bool matmul_skinny_glu_applies(const Tensor& h, const Tensor& w, const Tensor& c) {
  if (h.device != Device::CUDA || h.ndim != 2 || w.ndim != 2 || c.ndim != 2 || h.size(1) % 2 != 0 ||
      h.strides[1] != 1 || w.strides[1] != 1 || c.strides[1] != 1 || c.dtype != DType::BF16)
    return false;
  const GemmProblem p = glu_problem(h, w, c);
  // H's second half starts F elements in: 16-byte aligned when F is a multiple of 8, as K must be.
  return w.size(1) == p.k && c.size(0) == p.m && c.size(1) == p.n && matmul_skinny_applies(p, h, w, c);
}

void matmul_skinny_glu(const Ctx& ctx, const Tensor& h, const Tensor& w, const Tensor& c, GluAct act) {
  LINAC_CHECK(matmul_skinny_glu_applies(h, w, c), "matmul_skinny_glu: H " + h.shape_str() + ", W " + w.shape_str() +
                                                     " and C " + c.shape_str() + " are not a problem it takes");
  const GemmProblem p = glu_problem(h, w, c);
  if (p.n == 0) return;
  const SkinnyArgs args = args_of(p);
  const bool rows8 = rows_of(p.m) == 8;
  constexpr int kSilu = static_cast<int>(GluAct::Silu), kIdentity = static_cast<int>(GluAct::Identity);
  if (act == GluAct::Silu)
    rows8 ? dispatch_tiles<8, bf16_t, kSilu>(ctx, args, h, w, c) : dispatch_tiles<16, bf16_t, kSilu>(ctx, args, h, w, c);
  else
    rows8 ? dispatch_tiles<8, bf16_t, kIdentity>(ctx, args, h, w, c)
          : dispatch_tiles<16, bf16_t, kIdentity>(ctx, args, h, w, c);
}

}  // namespace linac
