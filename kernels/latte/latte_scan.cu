// CUDA Latte scans (math in latte.h; launchers declared in latte_common.cuh):
//   lse       lse_t = logaddexp(lse_{t-1}, b_t) chunk-parallel: each chunk's local logcumsumexp
//             (CTA per chunk, thread per latent), an exclusive carry over the N chunk totals
//             (thread per (sequence*head, latent)), and the final logaddexp(carry, local) applied by
//             the chunk-terms kernel; no thread walks T.
//   terms     U[n] = exp(B_n - lse_e)^T V_n, every factor <= 1 (CTA per chunk, tensor cores), and
//             the chunk's decay exp(lse_{f-1} - lse_e)
//   states    S[n] = decay[n-1] S[n-1] + U[n-1] forward, or the reverse walk of the backward:
//             elementwise over the L x width state, sequential over the N chunks, f32.
// Documents (latte_common.cuh): the local scan restarts at every document start, a carry passes a
// chunk only when the chunk's last row's document began before it (else the chunk's total is the
// next carry), and the decay is 0 there, so U (over the last row's document) and the state scans
// need nothing else.
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

// Grid (N, B*H), kThreads threads: the chunk's b rows into shared memory, then thread l scans
// latent l over the chunk.
template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads) lse_local_kernel(Args a, const T* __restrict__ b, LatteLayout::Strides bs,
                                                         float* __restrict__ lse, float* __restrict__ total) {
  __shared__ float bq[kC * kMaxL];
  __shared__ int sd[kDocs ? kC : 1];
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H, l = threadIdx.x;
  const int f = n * kC, rows = min(kC, a.T - f);
  store_head_rows<kMaxL>(b, bs, bb, h, f, rows, a.L, bq);
  load_docs<kDocs>(a, bb, f, rows, sd);
  __syncthreads();
  if (l >= a.L) return;
  float run = -INFINITY;
  float* out = lse + ((static_cast<int64_t>(bb) * a.T + f) * a.H + h) * a.L + l;
  for (int r = 0; r < rows; ++r) {
    if (kDocs && sd[r] == r) run = -INFINITY;  // a document starts at row r
    run = logaddexpf(run, bq[r * a.L + l]);
    out[static_cast<int64_t>(r) * a.H * a.L] = run;
  }
  total[(static_cast<int64_t>(bh) * a.N + n) * a.L + l] = run;
}

// Loads of the sequential walks below are issued kBatch chunks ahead of the dependent chain.
constexpr int kBatch = 16;

// Grid B*H, kMaxL threads: the chunk totals become exclusive carries, in place. With documents a
// chunk whose last row's document starts inside it passes on its own total alone.
template <bool kDocs>
__global__ void __launch_bounds__(kMaxL) lse_carry_kernel(Args a, float* __restrict__ carry) {
  const int bh = blockIdx.x, l = threadIdx.x;
  if (l >= a.L) return;
  float run = -INFINITY;
  float* c = carry + static_cast<int64_t>(bh) * a.N * a.L + l;
  const int32_t* st = kDocs ? a.ds + static_cast<int64_t>(bh / a.H) * a.T : nullptr;
  for (int n0 = 0; n0 < a.N; n0 += kBatch) {
    float total[kBatch];
    bool restart[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (n0 + i < a.N) {
        const int f = (n0 + i) * kC, e = min(f + kC, a.T) - 1;
        total[i] = c[static_cast<int64_t>(n0 + i) * a.L];
        restart[i] = kDocs && st[e] >= f;
      }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (n0 + i < a.N) {
        c[static_cast<int64_t>(n0 + i) * a.L] = run;
        run = restart[i] ? total[i] : logaddexpf(run, total[i]);
      }
  }
}

// Shared memory of the chunk-terms kernel: f32 lse and b [64][L]; tiles of T: W = exp(b - lse_e)
// [64][Lp] in three parts (an f32 W exactly: the states are f32 sums) and V [64][Dp].
template <class T>
struct TermsSmem {
  float *lam, *bq;
  T *W, *V;
  int* sd;
  size_t bytes;
  __host__ __device__ TermsSmem(unsigned char* base, const Args& a) {
    SmemCarve c{base};
    lam = c.take<float>(kC * a.L), bq = c.take<float>(kC * a.L), W = c.take<T>(parts_of<T>(3) * kC * ld_of<T>(a.Lp));
    V = c.take<T>(kC * ld_of<T>(a.Dp)), sd = c.take<int>(doc_ints(a));
    bytes = c.bytes;
  }
};

// Grid (N, B*H): U[n] = W^T V on tensor cores.
template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads) chunk_terms_kernel(Args a, const T* __restrict__ b,
                                                               LatteLayout::Strides bs, const T* __restrict__ v,
                                                               LatteLayout::Strides vs, float* __restrict__ lse,
                                                               bool finalise, float* __restrict__ carry,
                                                               float* __restrict__ U) {
  extern __shared__ __align__(16) unsigned char smem[];
  const TermsSmem<T> sm(smem, a);
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  const int ldl = ld_of<T>(a.Lp), ldd = ld_of<T>(a.Dp);
  float* lse_f = lse_row(lse, a, bb, h, f);
  float* carry_n = carry + (static_cast<int64_t>(bh) * a.N + n) * a.L;
  const ChunkDocs<kDocs> dc = load_docs<kDocs>(a, bb, f, rows, sm.sd);
  if constexpr (kDocs) __syncthreads();  // sd before the lse rows read it
  // lse_{f-1}: the carry when finalising (the same logaddexp chain the previous chunk's last row took)
  float lam_prev = 0.f;
  if (n > 0 && threadIdx.x < a.L)
    lam_prev = finalise ? carry_n[threadIdx.x] : lse_f[static_cast<int64_t>(threadIdx.x) - a.H * a.L];
  lse_rows_of(lse, a, bb, h, f, rows).store([&](int r, int l, float x) {  // one RowBatch at a time (latte_fwd.cu)
    if (finalise && dc.carried(r)) x = logaddexpf(carry_n[l], x);  // else its document starts in the chunk
    if (finalise) lse_f[static_cast<int64_t>(r) * a.H * a.L + l] = x;
    sm.lam[r * a.L + l] = x;
  });
  store_head_rows<kMaxL>(b, bs, bb, h, f, rows, a.L, sm.bq);
  rows_of<kMaxDv>(v, vs, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.V, ldd);
  __syncthreads();
  const float* lam_e = sm.lam + (rows - 1) * a.L;
  if (threadIdx.x < a.L)  // every read of carry_n is done: it becomes the chunk's decay
    carry_n[threadIdx.x] = n > 0 && dc.carried(rows - 1) ? expf(lam_prev - lam_e[threadIdx.x]) : 0.f;
  constexpr int parts = parts_of<T>(3);
  const int s0 = dc.first(rows - 1);  // U sums over the last row's document
  for_rows(kC, a.Lp, [&](int s, int l) {
    store_parts(sm.W + s * ldl + l, static_cast<size_t>(kC) * ldl, parts,
                s >= s0 && s < rows && l < a.L ? expf(sm.bq[s * a.L + l] - lam_e[l]) : 0.f);
  });
  __syncthreads();
  float* Un = U + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for_tiles<2>(a.Lp, a.Dp, [&](int m0, int n0, int ntv) {
    float acc[2][4] = {};
    for (int k = 0; k < parts; ++k)
      warp_mma<T, true, true, 2>(acc, sm.W + k * kC * ldl, ldl, m0, 0, sm.V, ldd, 0, n0, kC / 16, ntv);
    each_acc_pair(acc, m0, n0, ntv, [&](int l, int j, float x, float y) {  // Dv % 4 == 0: j < Dv has j + 1
      if (l < a.L && j < a.Dv) store_pair(Un + l * a.Wd + j, x, y, true);
    });
  });
}

constexpr int kScanThreads = 128;

// Grid (ceil(L * width / 128), B*H): a thread owns one state element (l, j) and walks the chunks.
__global__ void __launch_bounds__(kScanThreads) state_scan_kernel(Args a, bool reverse, int width,
                                                                  const float* __restrict__ decay,
                                                                  const float* __restrict__ U, float* __restrict__ S,
                                                                  float* __restrict__ mu_final) {
  const int bh = blockIdx.y;
  const int i = blockIdx.x * kScanThreads + threadIdx.x;
  if (i >= a.L * width) return;
  const int l = i / width, j = i % width;
  const int64_t base = static_cast<int64_t>(bh) * a.N * a.L * a.Wd + l * a.Wd + j;
  const int64_t step = static_cast<int64_t>(a.L) * a.Wd;
  const float* dec = decay + static_cast<int64_t>(bh) * a.N * a.L + l;
  float x = 0.f;
  // The i-th chunk of the walk is n = i forward, N - 1 - i in reverse; chunk 0 has decay 0.
  auto chunk = [&](int i) { return reverse ? a.N - 1 - i : i; };
  int i0 = 0;
  for (; i0 + kBatch <= a.N; i0 += kBatch) {  // whole batches: straight-line code, every load issued first
    float u[kBatch], k[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) u[i] = U[base + chunk(i0 + i) * step], k[i] = dec[chunk(i0 + i) * a.L];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      S[base + chunk(i0 + i) * step] = x;
      x = k[i] * x + u[i];
    }
  }
  for (; i0 < a.N; ++i0) {
    S[base + chunk(i0) * step] = x;
    x = dec[chunk(i0) * a.L] * x + U[base + chunk(i0) * step];
  }
  if (!reverse && mu_final) mu_final[(static_cast<int64_t>(bh) * a.L + l) * a.Dv + j] = x;
}

}  // namespace

template <class T>
void launch_lse_scan(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, float* lse,
                     float* carry) {
  with_docs(a, [&](auto docs) {
    constexpr bool kD = decltype(docs)::value;
    lse_local_kernel<T, kD><<<dim3(a.N, B * a.H), kThreads, 0, cuda::stream_of(ctx)>>>(a, b, bs, lse, carry);
    LINAC_CUDA_LAUNCH_CHECK();
    lse_carry_kernel<kD><<<B * a.H, kMaxL, 0, cuda::stream_of(ctx)>>>(a, carry);
    LINAC_CUDA_LAUNCH_CHECK();
  });
}

template <class T>
void launch_chunk_terms(const Ctx& ctx, const Args& a, int B, const T* b, LatteLayout::Strides bs, const T* v,
                        LatteLayout::Strides vs, float* lse, bool finalise, float* carry, float* U) {
  const size_t smem = TermsSmem<T>(nullptr, a).bytes;
  with_docs(a, [&](auto docs) {
    constexpr bool kD = decltype(docs)::value;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(chunk_terms_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    chunk_terms_kernel<T, kD><<<dim3(a.N, B * a.H), kThreads, smem, cuda::stream_of(ctx)>>>(a, b, bs, v, vs, lse,
                                                                                                finalise, carry, U);
    LINAC_CUDA_LAUNCH_CHECK();
  });
}

void launch_state_scan(const Ctx& ctx, const Args& a, int B, bool reverse, int width, const float* decay,
                       const float* U, float* S, float* mu_final) {
  const dim3 grid((a.L * width + kScanThreads - 1) / kScanThreads, B * a.H);
  state_scan_kernel<<<grid, kScanThreads, 0, cuda::stream_of(ctx)>>>(a, reverse, width, decay, U, S, mu_final);
  LINAC_CUDA_LAUNCH_CHECK();
}

#define LINAC_LATTE_SCAN_INSTANTIATE(T)                                                                              \
  template void launch_lse_scan<T>(const Ctx&, const Args&, int, const T*, LatteLayout::Strides, float*, float*);  \
  template void launch_chunk_terms<T>(const Ctx&, const Args&, int, const T*, LatteLayout::Strides, const T*,      \
                                      LatteLayout::Strides, float*, bool, float*, float*);
LINAC_LATTE_SCAN_INSTANTIATE(float)
LINAC_LATTE_SCAN_INSTANTIATE(__nv_bfloat16)
#undef LINAC_LATTE_SCAN_INSTANTIATE

}  // namespace latte_cuda
}  // namespace linac
