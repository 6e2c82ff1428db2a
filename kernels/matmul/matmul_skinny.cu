// Skinny GEMM for decoding (math in matmul.h): C[M, N] = alpha * A[M, K] W[N, K]^T + beta * C with
// M <= kSkinnyMaxRows, A and W bf16 (row-major, W a linear layer's [out, in] weight), C bf16 or
// f32, accumulated in f32.
//
// A decoding step multiplies a few rows by every weight matrix once: the product is bound by
// reading W, which cuBLASLt's tiled kernels (and our Hopper GEMMs, 128-row tiles) do at a fraction
// of the memory bandwidth for M this small. Here a CTA first copies A's rows into shared memory as
// f32 (rows past M zero, up to the template's row count); then each warp owns one column n: its
// lanes stream W's row n in 16-byte loads (8 values, lane l taking k = 8l, 8l + 256, ...) against
// every row of A, and a butterfly adds the 32 lanes' sums. Each C element's K terms are summed in
// one fixed order (per lane in k order, then the butterfly), so reruns are bitwise identical.
#include "common/cuda_common.cuh"
#include "matmul/matmul.h"

namespace linac {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int64_t kSmemLimit = 160 * 1024;  // A's rows as f32 in shared memory

struct SkinnyArgs {
  int m, n, k;
  int64_t lda, ldb, ldc;
  float alpha, beta;
};

__device__ __forceinline__ void unpack8(const uint4& u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

template <int M, class TC>
__global__ void __launch_bounds__(kThreads)
    skinny_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w, TC* __restrict__ c,
                  const SkinnyArgs p) {
  extern __shared__ float4 smem[];
  float* sa = reinterpret_cast<float*>(smem);  // [M][k]
  const int k8 = p.k / 8;
  for (int i = threadIdx.x; i < M * k8; i += kThreads) {
    const int r = i / k8, c8 = i - r * k8;
    float v[8] = {};
    if (r < p.m) unpack8(*reinterpret_cast<const uint4*>(a + r * p.lda + c8 * 8), v);
    float4* dst = reinterpret_cast<float4*>(sa + r * p.k + c8 * 8);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col = int64_t{blockIdx.x} * kWarps + warp;
  if (col >= p.n) return;
  const __nv_bfloat16* wr = w + col * p.ldb;
  float acc[M] = {};
#pragma unroll 4
  for (int k0 = lane * 8; k0 < p.k; k0 += 256) {
    float wv[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(wr + k0)), wv);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const float4 a0 = *reinterpret_cast<const float4*>(sa + r * p.k + k0);
      const float4 a1 = *reinterpret_cast<const float4*>(sa + r * p.k + k0 + 4);
      float s = acc[r];
      s = fmaf(a0.x, wv[0], s), s = fmaf(a0.y, wv[1], s), s = fmaf(a0.z, wv[2], s), s = fmaf(a0.w, wv[3], s);
      s = fmaf(a1.x, wv[4], s), s = fmaf(a1.y, wv[5], s), s = fmaf(a1.z, wv[6], s), s = fmaf(a1.w, wv[7], s);
      acc[r] = s;
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  // Every lane holds every sum; lane r stores row r.
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (lane != r || r >= p.m) continue;
    TC* out = c + r * p.ldc + col;
    const float prior = p.beta != 0.f ? p.beta * cuda::to_float(*out) : 0.f;
    *out = cuda::from_float<TC>(fmaf(p.alpha, acc[r], prior));
  }
}

// Rows the kernel is instantiated for: m rounded up to a power of two.
int64_t padded_rows(int64_t m) {
  int64_t r = 1;
  while (r < m) r *= 2;
  return r;
}

template <int M, class TC>
void launch(const Ctx& ctx, const SkinnyArgs& a, const Tensor& A, const Tensor& W, const Tensor& C) {
  auto kernel = skinny_kernel<M, TC>;
  static const bool opted_in = [&] {
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmemLimit)));
    return true;
  }();
  (void)opted_in;
  const size_t smem = static_cast<size_t>(M) * a.k * sizeof(float);
  kernel<<<static_cast<unsigned>((a.n + kWarps - 1) / kWarps), kThreads, smem, cuda::stream_of(ctx)>>>(
      A.data<__nv_bfloat16>(), W.data<__nv_bfloat16>(), C.data<TC>(), a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class TC>
void dispatch_rows(const Ctx& ctx, const SkinnyArgs& a, const Tensor& A, const Tensor& W, const Tensor& C) {
  switch (padded_rows(a.m)) {
    case 1: return launch<1, TC>(ctx, a, A, W, C);
    case 2: return launch<2, TC>(ctx, a, A, W, C);
    case 4: return launch<4, TC>(ctx, a, A, W, C);
    case 8: return launch<8, TC>(ctx, a, A, W, C);
    default: return launch<16, TC>(ctx, a, A, W, C);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool matmul_skinny_applies(const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  return p.batch == 1 && !p.trans_a && p.trans_b && p.m >= 1 && p.m <= kSkinnyMaxRows && a.dtype == DType::BF16 &&
         b.dtype == DType::BF16 && (c.dtype == DType::F32 || c.dtype == DType::BF16) && p.k % 8 == 0 &&
         p.lda % 8 == 0 && p.ldb % 8 == 0 && aligned16(a.ptr) && aligned16(b.ptr) &&
         padded_rows(p.m) * p.k * static_cast<int64_t>(sizeof(float)) <= kSmemLimit;
}

void matmul_skinny_cuda(const Ctx& ctx, const GemmProblem& p, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (p.n == 0) return;
  const SkinnyArgs args{static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.lda, p.ldb,
                        p.ldc,  static_cast<float>(p.alpha), static_cast<float>(p.beta)};
  if (c.dtype == DType::F32)
    dispatch_rows<float>(ctx, args, a, b, c);
  else
    dispatch_rows<__nv_bfloat16>(ctx, args, a, b, c);
}

}  // namespace linac
