// CUDA Lightning Attention state scan (math in lightning.h, contract in lightning_common.cuh):
//   S_n+1 = exp(-s m) S_n + U_n,   U_n = sum_r f[r] x_r^T y_r,
//   f[r] = exp(-s (m-1-r)) forward, exp(-s (r+1)) reverse
// over the blocks of one sequence (m = tokens in the block; the ragged last block uses its own m).
// Layout: x [B, T, H, Dk], y [B, T, H, Dv] (free batch/token strides); U [B*H, N, Dk, Dv] f32;
// states [B*H, N, Dk, Dv] in T.
// Two ways, by the batch's number of 64x64 state tiles (a.walk, kWalkMinTiles):
//   walk     grid (B*H, Dk/64 * Dv/64), 128 threads, when the tiles fill the GPU: a CTA holds one
//            state tile in registers (f32, the fragments of its U_n) and walks the blocks in
//            order, the x and y tiles of the next two blocks loading (cp.async, three buffers)
//            while it computes U_n of this one on tensor cores (bf16: the decay factors applied
//            to x^T's fragments), stores S_n and adds: one pass over x and y, one barrier per
//            block, the states written once, no U in memory.
//   local + combine, when there are few tiles (one CTA per tile would leave most SMs idle, e.g.
//            one sequence of 32768 tokens): the matmuls in parallel over all blocks, then the
//            serial part as a cheap elementwise walk.
//     local    grid (N, B*H, Dk/64 * Dv/64), 128 threads: U_n of one 64x64 tile on tensor cores,
//              the decay factors (every exponent <= 0) applied as the walk applies them.
//     combine  grid (Dk*Dv/1024, B*H), 256 threads: a thread owns 4 adjacent state elements and
//              walks the blocks in order (fixed-order f32 sums), loading 8 blocks' U ahead.
// Both compute U_n = (f * x)^T y with f * x rounded to the activation dtype (block_term: bf16 scales
// the mma fragments, f32 the tile in shared memory) and S_n+1 = fmaf(g, S_n, U_n) in f32.
// Documents (lightning.h; the kDocs instantiations): local gives the rows outside the term's
// document the factor 0, combine walks with g = 0 through the blocks where a document starts.
// With lim = max(t0, 1) and e the block's last token, a row r is in the term when
//   forward: en(t0 + r) > e  (its document reaches the next block)
//   reverse: st(t0 + r) < lim  (it continues the state carried into the block)
#include "lightning/lightning_common.cuh"

namespace linac {
namespace lightning_cuda {
namespace {

using sm80::ld_of;
using sm80::tile_bytes;

template <class T>
struct LocalCfg {
  static constexpr int LD = ld_of<T>(kW), kTile = tile_bytes<T>(kC, kW), kSmem = 2 * kTile;
  static constexpr int kTables = 4 * 64 * sizeof(float);  // block_term's decay table per warp
};

// f[r] x_r for the m rows of block n of the tile X (shared memory): the decay factor of each row,
// 0 for rows outside the term's document.
template <class T, bool kRev, bool kDocs>
__device__ __forceinline__ void apply_decay(T* X, int LD, int n, int m, int b, float s, const Args& a) {
  const int64_t t0 = static_cast<int64_t>(n) * kC;
  for (int idx = threadIdx.x; idx < m * kW; idx += 128) {
    const int r = idx / kW, c = idx % kW;
    float fr = __expf(-s * static_cast<float>(kRev ? r + 1 : m - 1 - r));
    if constexpr (kDocs) {
      const int64_t bt = static_cast<int64_t>(b) * a.T + t0 + r;  // token t0 + r of sequence b
      const bool in_term = kRev ? a.doc_start[bt] < max(n * kC, 1) : a.doc_end[bt] >= n * kC + m;
      if (!in_term) fr = 0.f;
    }
    X[r * LD + c] = cuda::from_float<T>(fr * cuda::to_float(X[r * LD + c]));
  }
}

// The decay g of the state carried across block n: 0 where a document starts in it (at its first
// token too, except token 0).
template <bool kDocs>
__device__ __forceinline__ float carry_decay(int n, int b, float g_full, float g_last, const Args& a) {
  float g = n == a.N - 1 ? g_last : g_full;
  if constexpr (kDocs) {
    const int t0 = n * kC, last = min(a.T, t0 + kC) - 1;
    if (a.doc_start[static_cast<int64_t>(b) * a.T + last] >= max(t0, 1)) g = 0.f;
  }
  return g;
}

// Blocks in flight in the walk: each block's x and y tiles start loading two blocks ahead, so
// a step's work overlaps the loads of the next two (one block ahead left the step chain waiting
// on global-memory latency).
constexpr int kWalkStages = 3;

// A warp's copy of the decay factors f[r] of one block's 64 token rows (apply_decay's factors: 0
// past the block's m rows and for rows outside the term's document), for decayed_xty.
template <bool kRev, bool kDocs>
__device__ __forceinline__ void decay_table(float* fac, int n, int m, int b, float s, const Args& a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  __syncwarp();  // the warp's reads of the previous table are done
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane + 32 * half;
    float fr = r < m ? __expf(-s * static_cast<float>(kRev ? r + 1 : m - 1 - r)) : 0.f;
    if constexpr (kDocs) {
      const int64_t bt = static_cast<int64_t>(b) * a.T + static_cast<int64_t>(n) * kC + r;
      const bool in_term = r < m && (kRev ? a.doc_start[bt] < max(n * kC, 1) : a.doc_end[bt] >= n * kC + m);
      if (!in_term) fr = 0.f;
    }
    fac[r] = fr;
  }
  __syncwarp();
}

// acc += (f * X)^T Y for a warp's 16 rows m0.. of the 64 x 64 result, X and Y [token][dim] tiles
// of ld elements, fac the warp's decay table: the factors scale x^T's fragments after ldmatrix
// (mma_bf16's layout: a0 and a1 hold tokens 16 ks + 2q and + 1, a2 and a3 those + 8), rounded to
// bf16 as apply_decay rounds the tile, so the products are the same bits without a pass over
// the tile in shared memory and the barrier after it.
__device__ __forceinline__ void decayed_xty(float (&acc)[8][4], const bf16_t* X, const bf16_t* Y, int ld, int m0,
                                            int ksteps, const float* fac) {
  const int lane = static_cast<int>(threadIdx.x) & 31, j = lane >> 3, q = lane & 3;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    if (ks >= ksteps) break;
    uint32_t af[4];
    sm80::ldsm_x4_trans(X + (16 * ks + (lane & 7) + (j >> 1) * 8) * ld + m0 + (j & 1) * 8, af);
    const float2 f01 = *reinterpret_cast<const float2*>(fac + 16 * ks + 2 * q);
    const float2 f89 = *reinterpret_cast<const float2*>(fac + 16 * ks + 2 * q + 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = cuda::unpack_bf16(af[i]);
      const float2 fr = i < 2 ? f01 : f89;
      af[i] = cuda::pack_bf16(fr.x * v.x, fr.y * v.y);
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      sm80::ldsm_b_kn(Y, ld, 16 * ks, 16 * np, bf);
      sm80::mma_bf16(acc[2 * np], af, bf[0], bf[1]);
      sm80::mma_bf16(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc += U_n = (f * X)^T Y, the term of block n (m rows) for a warp's 16 rows m0.. of a 64 x 64 state
// tile, all 128 threads taking part. bf16 scales the fragments (fac: the warp's decay table,
// recomputed unless fac_full says it holds a full block's factors outside documents); f32 (SIMT
// products) scales the tile in shared memory, which needs a barrier.
template <class T, bool kRev, bool kDocs>
__device__ __forceinline__ void block_term(float (&acc)[8][4], T* X, const T* Y, int m0, int n, int m, int b, float s,
                                           const Args& a, float* fac, bool& fac_full) {
  constexpr int LD = LocalCfg<T>::LD;
  if constexpr (sizeof(T) == 2) {
    if (kDocs || m != kC || !fac_full) {
      decay_table<kRev, kDocs>(fac, n, m, b, s, a);
      fac_full = !kDocs && m == kC;
    }
    decayed_xty(acc, X, Y, LD, m0, cdiv(m, 16), fac);
  } else {
    apply_decay<T, kRev, kDocs>(X, LD, n, m, b, s, a);
    __syncthreads();
    sm80::warp_mma<T, true, true, 8>(acc, X, LD, m0, 0, Y, LD, 0, 0, cdiv(m, 16));
  }
}

template <class T, bool kRev, bool kDocs>
__global__ void __launch_bounds__(128) local_kernel(const T* __restrict__ x, LightningLayout::Strides xs,
                                                    const T* __restrict__ y, LightningLayout::Strides ys,
                                                    float* __restrict__ U, Args a) {
  using C = LocalCfg<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* X = reinterpret_cast<T*>(smem);
  T* Y = reinterpret_cast<T*>(smem + C::kTile);
  const int n = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const int tiles_v = cdiv(a.Dv, kW), i0 = (blockIdx.z / tiles_v) * kW, j0 = (blockIdx.z % tiles_v) * kW;
  const int vk = min(kW, a.Dk - i0), vv = min(kW, a.Dv - j0), m = min(kC, a.T - n * kC);
  const int64_t t0 = static_cast<int64_t>(n) * kC;
  const int warp = threadIdx.x >> 5, m0 = 16 * warp;
  const float s = a.decay[h];
  sm80::load_tile<T, kC, kW, 128>(X, C::LD, x + b * xs.b + t0 * xs.t + h * a.Dk + i0, xs.t, m, vk);
  sm80::load_tile<T, kC, kW, 128>(Y, C::LD, y + b * ys.b + t0 * ys.t + h * a.Dv + j0, ys.t, m, vv);
  sm80::cp_async_commit();
  sm80::cp_async_wait<0>();
  __syncthreads();
  float* fac = reinterpret_cast<float*>(smem + C::kSmem) + 64 * warp;
  bool fac_full = false;
  float acc[8][4] = {};
  block_term<T, kRev, kDocs>(acc, X, Y, m0, n, m, b, s, a, fac, fac_full);
  sm80::store_strip(U + ((static_cast<int64_t>(bh) * a.N + n) * a.Dk + i0) * a.Dv + j0, a.Dv, acc, m0, 0, vk, vv);
}

constexpr int kCombineThreads = 256, kAhead = 8;

template <class T, bool kRev, bool kDocs>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const float* __restrict__ U,
                                                                  const float* __restrict__ init,
                                                                  T* __restrict__ states,
                                                                  float* __restrict__ final_out, Args a) {
  const int64_t SS = static_cast<int64_t>(a.Dk) * a.Dv;
  const int64_t e = 4 * (static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x);
  if (e >= SS) return;
  const int bh = blockIdx.y, b = bh / a.H, h = bh % a.H, N = a.N;
  const float s = a.decay[h];
  const float g_full = __expf(-s * static_cast<float>(kC)), g_last = __expf(-s * static_cast<float>(a.T - (N - 1) * kC));
  const int64_t base = static_cast<int64_t>(bh) * N * SS + e;
  float4 cur = init ? cuda::load4(init + bh * SS + e) : make_float4(0.f, 0.f, 0.f, 0.f);
  for (int step0 = 0; step0 < N; step0 += kAhead) {
    float4 u[kAhead];
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int step = step0 + i, n = kRev ? N - 1 - step : step;
      if (step < N) u[i] = cuda::load4(U + base + n * SS);
    }
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int step = step0 + i, n = kRev ? N - 1 - step : step;
      if (step < N) {
        cuda::store4(states + base + n * SS, cur);
        const float g = carry_decay<kDocs>(n, b, g_full, g_last, a);
        cur = make_float4(fmaf(g, cur.x, u[i].x), fmaf(g, cur.y, u[i].y), fmaf(g, cur.z, u[i].z), fmaf(g, cur.w, u[i].w));
      }
    }
  }
  if (final_out) cuda::store4(final_out + bh * SS + e, cur);
}

template <class T, bool kRev, bool kDocs>
__global__ void __launch_bounds__(128, 4) walk_kernel(const T* __restrict__ x, LightningLayout::Strides xs,
                                                      const T* __restrict__ y, LightningLayout::Strides ys,
                                                      const float* __restrict__ init, T* __restrict__ states,
                                                      float* __restrict__ final_out, Args a) {
  using C = LocalCfg<T>;  // the same X and Y tiles, kWalkStages times
  extern __shared__ __align__(16) unsigned char smem[];
  const int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, N = a.N;
  const int tiles_v = cdiv(a.Dv, kW), i0 = (blockIdx.y / tiles_v) * kW, j0 = (blockIdx.y % tiles_v) * kW;
  const int vk = min(kW, a.Dk - i0), vv = min(kW, a.Dv - j0);
  const int warp = threadIdx.x >> 5, m0 = 16 * warp;
  const float s = a.decay[h];
  const float g_full = __expf(-s * static_cast<float>(kC)), g_last = __expf(-s * static_cast<float>(a.T - (N - 1) * kC));
  const int64_t SS = static_cast<int64_t>(a.Dk) * a.Dv, tile0 = static_cast<int64_t>(i0) * a.Dv + j0;
  const sm80::Frag f;
  auto X = [&](int step) { return reinterpret_cast<T*>(smem + 2 * (step % kWalkStages) * C::kTile); };
  auto Y = [&](int step) { return reinterpret_cast<T*>(smem + (2 * (step % kWalkStages) + 1) * C::kTile); };
  auto block_of = [&](int step) { return kRev ? N - 1 - step : step; };
  // Every step commits one cp.async group (empty past the last block), so "block `step` has
  // landed" is always "at most kWalkStages - 2 groups pending".
  auto load = [&](int step) {
    if (step < N) {
      const int n = block_of(step);
      const int64_t t0 = static_cast<int64_t>(n) * kC;
      const int m = min(kC, a.T - n * kC);
      sm80::load_tile<T, kC, kW, 128>(X(step), C::LD, x + b * xs.b + t0 * xs.t + h * a.Dk + i0, xs.t, m, vk);
      sm80::load_tile<T, kC, kW, 128>(Y(step), C::LD, y + b * ys.b + t0 * ys.t + h * a.Dv + j0, ys.t, m, vv);
    }
    sm80::cp_async_commit();
  };

  float cur[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = f.row(m0, e), c = f.col(0, nt, e);
      cur[nt][e] = init && r < vk && c < vv ? init[bh * SS + tile0 + static_cast<int64_t>(r) * a.Dv + c] : 0.f;
    }
  for (int step = 0; step < kWalkStages - 1; ++step) load(step);
  float* fac = reinterpret_cast<float*>(smem + kWalkStages * C::kSmem) + 64 * warp;  // this warp's decay table
  bool fac_full = false;  // fac holds the factors of a full block outside documents
  for (int step = 0; step < N; ++step) {
    const int n = block_of(step), m = min(kC, a.T - n * kC);
    sm80::cp_async_wait<kWalkStages - 2>();
    // Block `step` is in shared memory for every thread, and every thread is done with the
    // buffers of block step - 1, which the next load refills.
    __syncthreads();
    load(step + kWalkStages - 1);
    float acc[8][4] = {};
    block_term<T, kRev, kDocs>(acc, X(step), Y(step), m0, n, m, b, s, a, fac, fac_full);
    sm80::store_strip(states + (static_cast<int64_t>(bh) * N + n) * SS + tile0, a.Dv, cur, m0, 0, vk, vv);
    const float g = carry_decay<kDocs>(n, b, g_full, g_last, a);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) cur[nt][e] = fmaf(g, cur[nt][e], acc[nt][e]);
  }
  if (final_out) sm80::store_strip(final_out + bh * SS + tile0, a.Dv, cur, m0, 0, vk, vv);
}

template <class T, bool kRev, bool kDocs>
void scan(const Ctx& ctx, const Args& a, int B, const T* x, LightningLayout::Strides xs, const T* y,
          LightningLayout::Strides ys, const float* init, float* U, T* states, float* final_out) {
  const int tiles = cdiv(a.Dk, kW) * cdiv(a.Dv, kW);
  if (a.walk) {
    auto walk = walk_kernel<T, kRev, kDocs>;
    constexpr int smem = kWalkStages * LocalCfg<T>::kSmem + LocalCfg<T>::kTables;
    LINAC_CUDA_CHECK(cudaFuncSetAttribute(walk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(static_cast<unsigned>(B * a.H), static_cast<unsigned>(tiles));
    walk<<<grid, 128, smem, cuda::stream_of(ctx)>>>(x, xs, y, ys, init, states, final_out, a);
    LINAC_CUDA_LAUNCH_CHECK();
    return;
  }
  auto local = local_kernel<T, kRev, kDocs>;
  constexpr int smem = LocalCfg<T>::kSmem + LocalCfg<T>::kTables;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(local, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(B * a.H), static_cast<unsigned>(tiles));
  local<<<grid, 128, smem, cuda::stream_of(ctx)>>>(x, xs, y, ys, U, a);
  LINAC_CUDA_LAUNCH_CHECK();
  const int64_t quads = static_cast<int64_t>(a.Dk) * a.Dv / 4;
  const dim3 cgrid(static_cast<unsigned>((quads + kCombineThreads - 1) / kCombineThreads), static_cast<unsigned>(B * a.H));
  combine_kernel<T, kRev, kDocs><<<cgrid, kCombineThreads, 0, cuda::stream_of(ctx)>>>(U, init, states, final_out, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void launch_scan(const Ctx& ctx, const Args& a, int B, bool rev, const T* x, LightningLayout::Strides xs, const T* y,
                 LightningLayout::Strides ys, const float* init, float* U, T* states, float* final_out) {
  auto fn = a.doc_start ? (rev ? scan<T, true, true> : scan<T, false, true>)
                        : (rev ? scan<T, true, false> : scan<T, false, false>);
  fn(ctx, a, B, x, xs, y, ys, init, U, states, final_out);
}

template void launch_scan<float>(const Ctx&, const Args&, int, bool, const float*, LightningLayout::Strides,
                                 const float*, LightningLayout::Strides, const float*, float*, float*, float*);
template void launch_scan<bf16_t>(const Ctx&, const Args&, int, bool, const bf16_t*, LightningLayout::Strides,
                                  const bf16_t*, LightningLayout::Strides, const float*, float*, bf16_t*, float*);

}  // namespace lightning_cuda
}  // namespace linac
