// CUDA chunkwise GLA forward (math in gla.h) and the kernels the backward reuses.
//
// Per group of sequences (as many as ctx.workspace holds; the whole batch when the chunk buffers go
// to the caller's saved intermediates, gla.h), four launches:
//   prep    grid (N, B*H), a thread per key column: chunk-local inclusive cumsums B of g in f32
//           (rows past T repeat the last sum, so padding never decays the state), the chunk
//           totals bn, and the decayed operands qd = scale q*exp(B), kd = k*exp(bn - B) in the
//           activation dtype (every factor <= 1), chunk-major so every later tile load is dense.
//   state   grid (Dk/BK * Dv/BV tiles, B*H), sequential over the chunks of one sequence: the f32
//           state tile lives in mma accumulators; per chunk it is stored (S_n, rounded to the
//           activation dtype: it only feeds tensor-core matmuls; in 16-byte pieces of rows),
//           decayed by exp(bn) and updated by kd^T v on tensor cores. A multi-stage cp.async
//           pipeline keeps chunks in flight, so a step costs its matmul, not a memory round trip.
//           64x64 tiles (3 stages), or 32x32 tiles (8 stages) when 64x64 would leave SMs idle
//           (few sequences*heads, e.g. B = 1 at T = 32768). The reverse direction scans
//           dS = exp(bn) dS + qd^T do for the backward.
//   intra   grid (N, B*H): P (64x64 per chunk) from 16-row sub-chunks: the 6 off-diagonal blocks
//           as tensor-core matmuls of q*exp(B - B[16I]) and k*exp(B[16I] - B) (all factors <= 1),
//           the 4 diagonal blocks in f32 as dot products of the same factors referenced to the
//           block's first row (those of k within exp(kGlaFactorSpan)), or with exact pairwise
//           exponents where a column of the 64-wide Dk slice decays by more across the block.
//   out     grid (N * Dv/64, B*H): o = qd S_n + P v, both on tensor cores, the causal P v visiting
//           only the sub-chunks at or below the diagonal. The backward runs it as
//           dv = kd dS_n+1 + P^T do.
// f32 activations run the same kernels with SIMT f32 matmuls (gla_common.cuh).
#include <algorithm>

#include "gla/gla_common.cuh"

namespace linac {
namespace gla_cuda {
namespace {

// ---- prep ----------------------------------------------------------------------------------

// A thread owns four adjacent key columns (16-byte g / bc loads and stores, 8-byte bf16 ones).
// Pass 1 sums the chunk's gates (bn, independent loads); pass 2 re-reads them (L2) for the running
// cumsum, so every load is independent of the stores and nothing waits on a store round trip.
template <class T>
__global__ void __launch_bounds__(128) prep_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                   const float* __restrict__ g, float* __restrict__ bc,
                                                   T* __restrict__ qd, T* __restrict__ kd, float* __restrict__ bn,
                                                   Args a) {
  const int n = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const int i = 4 * static_cast<int>(threadIdx.x);
  if (i >= a.Dk) return;
  const int64_t t0 = static_cast<int64_t>(n) * kC, o0 = (static_cast<int64_t>(bh) * a.N + n) * kC * a.Dk + i;
  const int rows = min(kC, a.T - n * kC);
  const float* gb = g + b * a.g.b + t0 * a.g.t + h * a.Dk + i;
  const T* qb = q + b * a.q.b + t0 * a.q.t + h * a.Dk + i;
  const T* kb = k + b * a.k.b + t0 * a.k.t + h * a.Dk + i;
  float4 tot = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
  for (int r = 0; r < kC; ++r)
    if (r < rows) {
      const float4 v = cuda::load4(gb + r * a.g.t);
      tot.x += v.x, tot.y += v.y, tot.z += v.z, tot.w += v.w;
    }
  cuda::store4(bn + (static_cast<int64_t>(bh) * a.N + n) * a.Dk + i, tot);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float sc = a.scale;
#pragma unroll 8
  for (int r = 0; r < kC; ++r) {
    const bool ok = r < rows;
    const float4 gv = ok ? cuda::load4(gb + r * a.g.t) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 qv = ok ? cuda::load4(qb + r * a.q.t) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 kv = ok ? cuda::load4(kb + r * a.k.t) : make_float4(0.f, 0.f, 0.f, 0.f);
    acc.x += gv.x, acc.y += gv.y, acc.z += gv.z, acc.w += gv.w;
    cuda::store4(bc + o0 + r * a.Dk, acc);
    cuda::store4(qd + o0 + r * a.Dk, make_float4(sc * qv.x * gexp<T>(acc.x), sc * qv.y * gexp<T>(acc.y),
                                                 sc * qv.z * gexp<T>(acc.z), sc * qv.w * gexp<T>(acc.w)));
    cuda::store4(kd + o0 + r * a.Dk, make_float4(kv.x * gexp<T>(tot.x - acc.x), kv.y * gexp<T>(tot.y - acc.y),
                                                 kv.z * gexp<T>(tot.z - acc.z), kv.w * gexp<T>(tot.w - acc.w)));
  }
}

// ---- state scan ----------------------------------------------------------------------------

template <class T, int BK, int BV>
struct StateCfg {
  // 64x64 tiles run many CTAs per SM (3 stages: four fit per SM); 32x32 tiles are chosen when the
  // CTAs are few, so each one prefetches deep (8 stages: seven chunks in flight).
  static constexpr int kThreads = 128, kStages = BK == 64 ? 3 : 8, WM = BK / 16, WN = 4 / WM, NT = BV / WN / 8;
  static constexpr int LDX = ld_of<T>(BK), LDY = ld_of<T>(BV);
  static constexpr int kX = tile_bytes<T>(kC, BK), kY = tile_bytes<T>(kC, BV), kD = BK * 4;
  static constexpr int kStage = kX + kY + kD, kSmem = kStages * kStage;
  static_assert(WM * WN == 4 && NT % 2 == 0, "bad state tile");
};

template <class T, bool kRev, int BK, int BV>
__device__ __forceinline__ void state_scan(const T* __restrict__ x, const T* __restrict__ y, GlaLayout::Strides ys,
                                           const float* __restrict__ bn, const float* __restrict__ init,
                                           T* __restrict__ states, float* __restrict__ final_out, const Args& a) {
  using C = StateCfg<T, BK, BV>;
  constexpr int S = C::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tiles_v = cdiv(a.Dv, BV), kt = blockIdx.x / tiles_v, vt = blockIdx.x % tiles_v;
  const int bh = blockIdx.y, b = bh / a.H, h = bh % a.H, N = a.N, n_states = kRev ? N : N + 1;
  const int i0 = kt * BK, j0 = vt * BV, vk = min(BK, a.Dk - i0), vv = min(BV, a.Dv - j0);
  const int warp = threadIdx.x >> 5, m0 = 16 * (warp / C::WN), n0 = (warp % C::WN) * (BV / C::WN);
  const Frag f;
  auto stage_x = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStage); };
  auto stage_y = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStage + C::kX); };
  auto stage_d = [&](int s) { return reinterpret_cast<float*>(smem + s * C::kStage + C::kX + C::kY); };
  auto chunk = [&](int step) { return kRev ? N - 1 - step : step; };
  // Loads for the given step (an empty group past the end keeps the group count uniform).
  auto issue = [&](int step) {
    if (step < N) {
      const int n = chunk(step), s = step % S, rows = min(kC, a.T - n * kC);
      const int64_t c0 = static_cast<int64_t>(bh) * N + n;
      load_tile<T, kC, BK, 128>(stage_x(s), C::LDX, x + c0 * kC * a.Dk + i0, a.Dk, kC, vk);
      load_tile<T, kC, BV, 128>(stage_y(s), C::LDY, y + b * ys.b + static_cast<int64_t>(n) * kC * ys.t + h * a.Dv + j0,
                                ys.t, rows, vv);
      load_tile<float, 1, BK, 128>(stage_d(s), BK, bn + c0 * a.Dk + i0, 0, 1, vk);
    }
    cp_async_commit();
  };
  auto store = [&](int n, const float (&acc)[C::NT][4]) {
    T* out = states + ((static_cast<int64_t>(bh) * n_states + n) * a.Dk + i0) * a.Dv + j0;
    // bf16 in 16-byte pieces of rows (Dv is a multiple of 16): the forward scan of a 1.3B layer
    // took 234 -> 182 us against the fragments' 4-byte pair stores (NOTES.md).
    store_strip(out, a.Dv, acc, m0, n0, vk, vv);
  };

  float acc[C::NT][4];
#pragma unroll
  for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = f.row(m0, e), c = f.col(n0, nt, e);
      acc[nt][e] = init && r < vk && c < vv ? init[(static_cast<int64_t>(bh) * a.Dk + i0 + r) * a.Dv + j0 + c] : 0.f;
    }
  for (int s = 0; s < S - 1; ++s) issue(s);
  for (int step = 0; step < N; ++step) {
    const int s = step % S;
    cp_async_wait<S - 2>();
    __syncthreads();      // this step's tiles landed; every warp is done with the stage issue() refills
    issue(step + S - 1);
    store(chunk(step), acc);  // the state before this chunk (forward: S_n; reverse: dS_n+1)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float decay = gexp<T>(stage_d(s)[f.row(m0, 2 * hf)]);
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt) {
        acc[nt][2 * hf] *= decay;
        acc[nt][2 * hf + 1] *= decay;
      }
    }
    warp_mma<T, true, true, C::NT>(acc, stage_x(s), C::LDX, m0, 0, stage_y(s), C::LDY, 0, n0, kC / 16);
  }
  // Nothing reads S_N (dqk forms dg's carry from S_n), but a version without it (N states per
  // sequence) compiled to a slower loop: 158 against 141 us per 340M layer (H200, ncu).
  if (!kRev) store(N, acc);
  if (final_out)
#pragma unroll
    for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = f.row(m0, e), c = f.col(n0, nt, e);
        if (r < vk && c < vv) final_out[(static_cast<int64_t>(bh) * a.Dk + i0 + r) * a.Dv + j0 + c] = acc[nt][e];
      }
}

// Two kernels, as the register bounds differ: the reverse scan is held to 128 registers (left
// alone it took 168: three CTAs per SM, and a 340M layer's 512 CTAs of 64x64 tiles then ran in
// two waves); the forward one takes 110 unbounded (124 with the 4-byte stores, which spilled
// under the same bound).
template <class T, int BK, int BV>
__global__ void __launch_bounds__(128)
    state_fwd_kernel(const T* __restrict__ x, const T* __restrict__ y, GlaLayout::Strides ys,
                     const float* __restrict__ bn, const float* __restrict__ init, T* __restrict__ states,
                     float* __restrict__ final_out, Args a) {
  state_scan<T, false, BK, BV>(x, y, ys, bn, init, states, final_out, a);
}
template <class T, int BK, int BV>
__global__ void __launch_bounds__(128, 4)
    state_rev_kernel(const T* __restrict__ x, const T* __restrict__ y, GlaLayout::Strides ys,
                     const float* __restrict__ bn, const float* __restrict__ init, T* __restrict__ states,
                     float* __restrict__ final_out, Args a) {
  state_scan<T, true, BK, BV>(x, y, ys, bn, init, states, final_out, a);
}

// ---- intra-chunk P -------------------------------------------------------------------------

template <class T>
struct IntraCfg {
  static constexpr int LD = ld_of<T>(kW), LDB = ld_of<float>(kW);
  static constexpr int kQ = tile_bytes<T>(kC, kW), kB = tile_bytes<float>(kC, kW);
  static constexpr int kQs = tile_bytes<T>(48, kW), kKs = tile_bytes<T>(96, kW);
  // + the diagonal blocks' f32 operands Qf, Kf and a flag per sub-chunk. 8 warps and two CTAs per
  // SM (bf16) took a 340M layer's P from 134 to 116 us against 4 warps.
  static constexpr int kSmem = 2 * kQ + kB + kQs + kKs + 2 * kB + 16;
  static constexpr int kThreads = 256, kItems = 4 * 136, kPerThread = (kItems + kThreads - 1) / kThreads;
};

template <class T>
__global__ void __launch_bounds__(IntraCfg<T>::kThreads, sizeof(T) == 2 ? 2 : 1)
    intra_kernel(const T* __restrict__ q, const T* __restrict__ k, const float* __restrict__ bc, T* __restrict__ P,
                 Args a) {
  using C = IntraCfg<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* Q = reinterpret_cast<T*>(smem);
  T* K = reinterpret_cast<T*>(smem + C::kQ);
  float* Bc = reinterpret_cast<float*>(smem + 2 * C::kQ);
  T* Qs = reinterpret_cast<T*>(smem + 2 * C::kQ + C::kB);
  T* Ks = reinterpret_cast<T*>(smem + 2 * C::kQ + C::kB + C::kQs);
  float* Qf = reinterpret_cast<float*>(smem + 2 * C::kQ + C::kB + C::kQs + C::kKs);
  float* Kf = Qf + kC * C::LDB;
  int* wide = reinterpret_cast<int*>(Kf + kC * C::LDB);  // [4]: sub-chunk I takes exact exponents
  const int n = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const int64_t t0 = static_cast<int64_t>(n) * kC;
  const int rows = min(kC, a.T - n * kC), warp = threadIdx.x >> 5;
  const Frag f;

  // Diagonal-block items: (sub-chunk I, r, s) with s <= r inside I, fixed per thread.
  int ir[C::kPerThread], is[C::kPerThread];
  float dacc[C::kPerThread];
#pragma unroll
  for (int u = 0; u < C::kPerThread; ++u) {
    const int it = threadIdx.x + C::kThreads * u;
    int idx = it % 136, r = 0;
    while (idx > r) idx -= ++r;
    ir[u] = it < C::kItems ? 16 * (it / 136) + r : -1;
    is[u] = 16 * (it / 136) + idx;
    dacc[u] = 0.f;
  }
  float acc[6][4] = {};

  for (int kt = 0; kt < cdiv(a.Dk, kW); ++kt) {
    const int i0 = kt * kW, vk = min(kW, a.Dk - i0);
    load_tile<T, kC, kW, C::kThreads>(Q, C::LD, q + b * a.q.b + t0 * a.q.t + h * a.Dk + i0, a.q.t, rows, vk);
    load_tile<T, kC, kW, C::kThreads>(K, C::LD, k + b * a.k.b + t0 * a.k.t + h * a.Dk + i0, a.k.t, rows, vk);
    const float* bcn = bc + (static_cast<int64_t>(bh) * a.N + n) * kC * a.Dk + i0;
    load_tile<float, kC, kW, C::kThreads>(Bc, C::LDB, bcn, a.Dk, kC, vk);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    {  // Operands referenced to the first row of each sub-chunk I (gla_common.cuh): Qf = q[r] *
       // exp(B[r] - B[16 I]) for r in I (f32; in bf16 as Qs for I >= 1, the off-diagonal blocks),
       // Kf = k[s] * exp(B[16 I] - B[s]) for s in I (f32, the diagonal block), and k[s] * exp(B[16 I]
       // - B[s]) for keys s < 16 I (bf16 Ks). Sub-chunk I = warp is wide (exact exponents in its
       // diagonal block) when a column decays by more than kGlaFactorSpan across it.
      const int c = 2 * (threadIdx.x & 31), p = threadIdx.x >> 5;
      if (warp < 4) {
        const int lane = threadIdx.x & 31, w0 = 16 * warp;
        const float span = static_cast<float>(kGlaFactorSpan);
        const bool far = Bc[w0 * C::LDB + lane] - Bc[(w0 + 15) * C::LDB + lane] > span ||
                         Bc[w0 * C::LDB + lane + 32] - Bc[(w0 + 15) * C::LDB + lane + 32] > span;
        const bool any_far = __any_sync(0xffffffffu, far);
        if (lane == 0) wide[warp] = any_far;
      }
      float2 bI[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) bI[u] = load2f(Bc + 16 * u * C::LDB + c);
      for_rows<C::kThreads, 0, 64>(p, [&](int r, auto rb) {
        constexpr int I = decltype(rb)::value;
        const float2 qv = load2f(Q + r * C::LD + c), kv = load2f(K + r * C::LD + c), br = load2f(Bc + r * C::LDB + c);
        const float2 qf = make_float2(qv.x * gexp<T>(br.x - bI[I].x), qv.y * gexp<T>(br.y - bI[I].y));
        *reinterpret_cast<float2*>(Qf + r * C::LDB + c) = qf;
        *reinterpret_cast<float2*>(Kf + r * C::LDB + c) =
            make_float2(kv.x * gexp<T>(bI[I].x - br.x), kv.y * gexp<T>(bI[I].y - br.y));
        if constexpr (I >= 1) store2(Qs + (r - 16) * C::LD + c, qf.x, qf.y);
      });
      const float2 bI3[3] = {bI[1], bI[2], bI[3]};
      key_block_operands<T, C::kThreads>(Ks, K, Bc, C::LD, C::LDB, c, p, bI3);
    }
    __syncthreads();
    if (warp > 0 && warp < 4)  // warp I computes P[I block rows][keys < 16 I]; all take diagonal items
      warp_mma<T, false, false, 6>(acc, Qs, C::LD, 16 * (warp - 1), 0, Ks + ks_off(warp) * C::LD, C::LD, 0, 0,
                                   kW / 16, 2 * warp);
#pragma unroll
    for (int u = 0; u < C::kPerThread; ++u) {
      if (ir[u] < 0) continue;
      float sum = 0.f;
      if (!wide[ir[u] >> 4]) {  // exp(B[r] - B[s]) = exp(B[r] - B[16 I]) exp(B[16 I] - B[s])
        const float* qr = Qf + ir[u] * C::LDB;
        const float* ks = Kf + is[u] * C::LDB;
#pragma unroll 4
        for (int i = 0; i < kW; i += 4) {
          const float4 qv = cuda::load4(qr + i), kv = cuda::load4(ks + i);
          sum = fmaf(qv.x, kv.x, sum);
          sum = fmaf(qv.y, kv.y, sum);
          sum = fmaf(qv.z, kv.z, sum);
          sum = fmaf(qv.w, kv.w, sum);
        }
      } else {
        const T* qr = Q + ir[u] * C::LD;
        const T* ks = K + is[u] * C::LD;
        const float* br = Bc + ir[u] * C::LDB;
        const float* bs = Bc + is[u] * C::LDB;
#pragma unroll 4
        for (int i = 0; i < kW; i += 4) {
          const float4 qv = cuda::load4(qr + i), kv = cuda::load4(ks + i);
          const float4 b1 = cuda::load4(br + i), b2 = cuda::load4(bs + i);
          sum = fmaf(qv.x * kv.x, gexp<T>(b1.x - b2.x), sum);
          sum = fmaf(qv.y * kv.y, gexp<T>(b1.y - b2.y), sum);
          sum = fmaf(qv.z * kv.z, gexp<T>(b1.z - b2.z), sum);
          sum = fmaf(qv.w * kv.w, gexp<T>(b1.w - b2.w), sum);
        }
      }
      dacc[u] += sum;
    }
    __syncthreads();  // the next slice overwrites the tiles
  }

  float* Ps = Bc;  // [64][LDB] f32, reusing the cumsum tile
  for (int idx = threadIdx.x; idx < kC * C::LDB; idx += C::kThreads) Ps[idx] = 0.f;
  __syncthreads();
  if (warp > 0 && warp < 4)
#pragma unroll
    for (int nt = 0; nt < 6; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (nt < 2 * warp) Ps[f.row(16 * warp, e) * C::LDB + f.col(0, nt, e)] = a.scale * acc[nt][e];
#pragma unroll
  for (int u = 0; u < C::kPerThread; ++u)
    if (ir[u] >= 0) Ps[ir[u] * C::LDB + is[u]] = a.scale * dacc[u];
  __syncthreads();
  T* Pg = P + (static_cast<int64_t>(bh) * a.N + n) * kC * kC;
  for (int idx = threadIdx.x; idx < kC * kC; idx += C::kThreads)
    Pg[idx] = cuda::from_float<T>(Ps[(idx / kC) * C::LDB + idx % kC]);
}

// ---- chunk output (forward o; backward dv) -----------------------------------------------

template <class T>
struct OutCfg {
  static constexpr int LD = ld_of<T>(kW), kT = tile_bytes<T>(kC, kW);
  static constexpr int kStage = 2 * kT, kSmem = 2 * kStage + 2 * kT;
};

template <class T, bool kDv>
__global__ void __launch_bounds__(128)
    out_kernel(const T* __restrict__ x, const T* __restrict__ states, int n_states, const T* __restrict__ P,
               const T* __restrict__ y, GlaLayout::Strides ys, T* __restrict__ out, GlaLayout::Strides os, Args a) {
  using C = OutCfg<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int nz = cdiv(a.Dv, kW), n = blockIdx.x / nz, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const int j0 = blockIdx.x % nz * kW, vv = min(kW, a.Dv - j0);
  const int64_t t0 = static_cast<int64_t>(n) * kC, c0 = static_cast<int64_t>(bh) * a.N + n;
  const int rows = min(kC, a.T - n * kC), warp = threadIdx.x >> 5, kslices = cdiv(a.Dk, kW);
  auto stage_x = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStage); };
  auto stage_s = [&](int s) { return reinterpret_cast<T*>(smem + s * C::kStage + C::kT); };
  T* Pm = reinterpret_cast<T*>(smem + 2 * C::kStage);
  T* Y = reinterpret_cast<T*>(smem + 2 * C::kStage + C::kT);
  const T* st = states + (static_cast<int64_t>(bh) * n_states + n) * a.Dk * a.Dv + j0;
  auto issue = [&](int kt, int s) {
    const int i0 = kt * kW, vk = min(kW, a.Dk - i0);
    load_tile<T, kC, kW, 128>(stage_x(s), C::LD, x + c0 * kC * a.Dk + i0, a.Dk, kC, vk);
    load_tile<T, kC, kW, 128>(stage_s(s), C::LD, st + static_cast<int64_t>(i0) * a.Dv, a.Dv, vk, vv);
  };
  issue(0, 0);
  cp_async_commit();
  // P and y serve only the last product: their group lands behind the first slice.
  load_tile<T, kC, kC, 128>(Pm, C::LD, P + c0 * kC * kC, kC, kC, kC);
  load_tile<T, kC, kW, 128>(Y, C::LD, y + b * ys.b + t0 * ys.t + h * a.Dv + j0, ys.t, rows, vv);
  cp_async_commit();

  float acc[8][4] = {};
  for (int kt = 0; kt < kslices; ++kt) {
    const int s = kt & 1;
    const bool next = kt + 1 < kslices;
    if (next) {
      issue(kt + 1, s ^ 1);
      cp_async_commit();
    }
    // Groups: slice 0, then P and y, then slices 1, 2, ...: what may still pend behind slice kt.
    if (kt == 0)
      next ? cp_async_wait<2>() : cp_async_wait<1>();
    else
      next ? cp_async_wait<1>() : cp_async_wait<0>();
    __syncthreads();
    warp_mma<T, false, true, 8>(acc, stage_x(s), C::LD, 16 * warp, 0, stage_s(s), C::LD, 0, 0, kW / 16);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();  // P and y (with one Dk slice, still in flight at the loop's wait)
  if (kDv)  // dv[s] += sum_{r >= s} P[r][s] do[r]: A = P^T (P stored [r][s] = [k][m])
    warp_mma<T, true, true, 8>(acc, Pm, C::LD, 16 * warp, 16 * warp, Y, C::LD, 16 * warp, 0, 4 - warp);
  else  // o[r] += sum_{s <= r} P[r][s] v[s]
    warp_mma<T, false, true, 8>(acc, Pm, C::LD, 16 * warp, 0, Y, C::LD, 0, 0, warp + 1);

  T* ob = out + b * os.b + t0 * os.t + h * a.Dv + j0;
  store_strip(ob, os.t, acc, 16 * warp, 0, rows, vv);  // bf16 in 16-byte pieces of rows, as the state scan
}

template <class K>
void set_smem(K kernel, int bytes) {
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class T, bool kRev, int BK, int BV>
void run_state(const Ctx& ctx, const Args& a, int B, const T* x, const T* y, GlaLayout::Strides ys, const float* bn,
               const float* init, T* states, float* final_out) {
  using C = StateCfg<T, BK, BV>;
  auto kernel = kRev ? state_rev_kernel<T, BK, BV> : state_fwd_kernel<T, BK, BV>;
  set_smem(kernel, C::kSmem);
  const dim3 grid(static_cast<unsigned>(cdiv(a.Dk, BK) * cdiv(a.Dv, BV)), static_cast<unsigned>(B * a.H));
  kernel<<<grid, C::kThreads, C::kSmem, cuda::stream_of(ctx)>>>(x, y, ys, bn, init, states, final_out, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void launch_prep(const Ctx& ctx, const Args& a, int B, const T* q, const T* k, const float* g, float* bc, T* qd,
                 T* kd, float* bn) {
  const int threads = cdiv(a.Dk / 4, 32) * 32;  // Dk <= 1024: at most 256
  prep_kernel<T><<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(B * a.H)), threads, 0,
                   cuda::stream_of(ctx)>>>(q, k, g, bc, qd, kd, bn, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_state(const Ctx& ctx, const Args& a, int B, bool rev, const T* x, const T* y, GlaLayout::Strides ys,
                  const float* bn, const float* init, T* states, float* final_out) {
  // The scan is sequential over chunks: use 32x32 tiles (4x the CTAs) when 64x64 ones would not
  // give every SM two.
  const bool small = static_cast<int64_t>(cdiv(a.Dk, 64)) * cdiv(a.Dv, 64) * B * a.H < 2 * gpu_sm_count();
  if (rev) {
    if (small)
      run_state<T, true, 32, 32>(ctx, a, B, x, y, ys, bn, init, states, final_out);
    else
      run_state<T, true, 64, 64>(ctx, a, B, x, y, ys, bn, init, states, final_out);
  } else {
    if (small)
      run_state<T, false, 32, 32>(ctx, a, B, x, y, ys, bn, init, states, final_out);
    else
      run_state<T, false, 64, 64>(ctx, a, B, x, y, ys, bn, init, states, final_out);
  }
}

template <class T>
void launch_intra(const Ctx& ctx, const Args& a, int B, const T* q, const T* k, const float* bc, T* P) {
  using C = IntraCfg<T>;
  auto kernel = intra_kernel<T>;
  set_smem(kernel, C::kSmem);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(B * a.H)), C::kThreads, C::kSmem,
           cuda::stream_of(ctx)>>>(q, k, bc, P, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_out(const Ctx& ctx, const Args& a, int B, bool dv, const T* x, const T* states, int n_states, const T* P,
                const T* y, GlaLayout::Strides ys, T* out, GlaLayout::Strides os) {
  auto kernel = dv ? out_kernel<T, true> : out_kernel<T, false>;
  set_smem(kernel, OutCfg<T>::kSmem);
  // The Dv slices of a chunk are adjacent in launch order: all but the first read x and P from L2.
  const dim3 grid(static_cast<unsigned>(a.N * cdiv(a.Dv, kW)), static_cast<unsigned>(B * a.H));
  kernel<<<grid, 128, OutCfg<T>::kSmem, cuda::stream_of(ctx)>>>(x, states, n_states, P, y, ys, out, os, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

#define LINAC_GLA_LAUNCHERS(T)                                                                                     \
  template void launch_prep<T>(const Ctx&, const Args&, int, const T*, const T*, const float*, float*, T*, T*,   \
                               float*);                                                                            \
  template void launch_state<T>(const Ctx&, const Args&, int, bool, const T*, const T*, GlaLayout::Strides,      \
                                const float*, const float*, T*, float*);                                          \
  template void launch_intra<T>(const Ctx&, const Args&, int, const T*, const T*, const float*, T*);              \
  template void launch_out<T>(const Ctx&, const Args&, int, bool, const T*, const T*, int, const T*, const T*,    \
                              GlaLayout::Strides, T*, GlaLayout::Strides);
LINAC_GLA_LAUNCHERS(float)
LINAC_GLA_LAUNCHERS(bf16_t)
#undef LINAC_GLA_LAUNCHERS

Args make_args(const GlaLayout& L) {
  LINAC_CHECK(L.T < (int64_t{1} << 30) && L.Dk <= 1024 && L.Dv <= 1024, "gla (GPU): T or head dims too large");
  LINAC_CHECK(L.chunk == kC && L.sub_chunk == kSub, "gla (GPU): needs chunk 64 and sub_chunk 16");
  LINAC_CHECK(L.Dk % 16 == 0 && L.Dv % 16 == 0, "gla (GPU): Dk and Dv must be multiples of 16");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.Dk = static_cast<int>(L.Dk), a.Dv = static_cast<int>(L.Dv);
  a.N = cdiv(a.T, kC);
  a.scale = static_cast<float>(L.scale);
  a.q = L.q, a.k = L.k, a.v = L.v, a.g = L.g, a.o = L.o;
  a.dout = L.dout, a.dq = L.dq, a.dk = L.dk, a.dv = L.dv, a.dg = L.dg;
  return a;
}

void check_rows16(const Tensor& x, const GlaLayout::Strides& s, const char* name) {
  const int64_t v = 16 / static_cast<int64_t>(dtype_size(x.dtype));
  LINAC_CHECK(reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && s.b % v == 0 && s.t % v == 0,
              std::string("gla (GPU): ") + name + " rows must be 16-byte aligned");
}

int group_size(const Ctx& ctx, const GlaLayout& L, DType act, bool saved) {
  const size_t per = gla_workspace_bytes_per_seq(L.T, L.H, L.Dk, L.Dv, act, saved);
  if (per > ctx.workspace_bytes)
    throw UserError("gla: one sequence of " + std::to_string(L.T) + " tokens needs " + std::to_string((per >> 20) + 1) +
                    " MiB of GPU workspace, more than the " + std::to_string(ctx.workspace_bytes >> 20) +
                    " MiB there are; set LINAC_WORKSPACE_MB");
  return static_cast<int>(std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per)));
}

namespace {

// Carves the chunk buffers of B sequences from p, each array 256-byte aligned (the sizes
// gla.cpp's chunk_buffer_bytes adds up); returns the end.
template <class T>
char* chunk_buffers(char* p, const Args& a, int64_t B, Workspace<T>& w) {
  auto take = [&](size_t bytes) {
    char* r = p;
    p += (bytes + 255) / 256 * 256;
    return r;
  };
  const size_t BH = static_cast<size_t>(B) * a.H, N = a.N, Dk = a.Dk, Dv = a.Dv;
  w.bc = reinterpret_cast<float*>(take(BH * N * kC * Dk * 4));
  w.qd = reinterpret_cast<T*>(take(BH * N * kC * Dk * sizeof(T)));
  w.kd = reinterpret_cast<T*>(take(BH * N * kC * Dk * sizeof(T)));
  w.bn = reinterpret_cast<float*>(take(BH * N * Dk * 4));
  w.S = reinterpret_cast<T*>(take(BH * (N + 1) * Dk * Dv * sizeof(T)));
  w.P = reinterpret_cast<T*>(take(BH * N * kC * kC * sizeof(T)));
  return p;
}

}  // namespace

template <class T>
Workspace<T> group_buffers(const Ctx& ctx, const Args& a, int64_t batch, int64_t b0, int B, void* saved,
                           bool backward) {
  Workspace<T> w;
  char* ws = static_cast<char*>(ctx.workspace);
  if (saved) {
    // Every array spans the whole batch, sequence-major: the group's part starts b0 sequences in.
    chunk_buffers<T>(static_cast<char*>(saved), a, batch, w);
    const int64_t H = a.H, N = a.N, rows = H * N * kC * a.Dk;
    w.bc += b0 * rows;
    w.qd += b0 * rows;
    w.kd += b0 * rows;
    w.bn += b0 * H * N * a.Dk;
    w.S += b0 * H * (N + 1) * a.Dk * a.Dv;
    w.P += b0 * H * N * kC * kC;
  } else {
    ws = chunk_buffers<T>(ws, a, B, w);
  }
  if (backward) {
    w.dS = reinterpret_cast<T*>(ws);
    ws += (static_cast<size_t>(B) * a.H * a.N * a.Dk * a.Dv * sizeof(T) + 255) / 256 * 256;
  }
  LINAC_CHECK(static_cast<size_t>(ws - static_cast<char*>(ctx.workspace)) <= ctx.workspace_bytes,
              "gla (GPU): workspace carve overflow");
  return w;
}
template Workspace<float> group_buffers<float>(const Ctx&, const Args&, int64_t, int64_t, int, void*, bool);
template Workspace<bf16_t> group_buffers<bf16_t>(const Ctx&, const Args&, int64_t, int64_t, int, void*, bool);

namespace {

template <class T>
void fwd_group(const Ctx& ctx, const Args& a, int B, const Workspace<T>& w, const T* q, const T* k, const T* v,
               const float* g, const float* s0, T* o, float* s_final) {
  launch_prep<T>(ctx, a, B, q, k, g, w.bc, w.qd, w.kd, w.bn);
  launch_state<T>(ctx, a, B, false, w.kd, v, a.v, w.bn, s0, w.S, s_final);
  launch_intra<T>(ctx, a, B, q, k, w.bc, w.P);
  launch_out<T>(ctx, a, B, false, w.qd, w.S, a.N + 1, w.P, v, a.v, o, a.o);
}

}  // namespace
}  // namespace gla_cuda

void gla_fwd_cuda(const Ctx& ctx, const GlaLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& s0, const Tensor& o, const Tensor& s_final, const Tensor& saved) {
  using namespace gla_cuda;
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype, "gla (GPU): activation dtypes must agree");
  LINAC_CHECK(g.dtype == DType::F32, "gla (GPU): g must be f32");
  for (const Tensor* s : {&s0, &s_final})
    LINAC_CHECK(!s->defined() || s->dtype == DType::F32, "gla (GPU): states must be f32");
  if (L.B * L.T * L.H == 0) return;
  const Args a = make_args(L);
  check_rows16(q, L.q, "q");
  check_rows16(k, L.k, "k");
  check_rows16(v, L.v, "v");
  check_rows16(o, L.o, "o");
  check_rows16(g, L.g, "g");
  // With saved intermediates the forward needs no workspace: one group.
  const int per = saved.defined() ? static_cast<int>(L.B) : group_size(ctx, L, q.dtype, false);
  const int64_t SS = L.H * L.Dk * L.Dv;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const float* s0p = s0.defined() ? s0.data<float>() + b0 * SS : nullptr;
    float* sfp = s_final.defined() ? s_final.data<float>() + b0 * SS : nullptr;
    LINAC_GPU_DISPATCH(q.dtype, T, {
      const Workspace<T> w = group_buffers<T>(ctx, a, L.B, b0, B, saved.ptr, false);
      fwd_group<T>(ctx, a, B, w, q.data<T>() + b0 * L.q.b, k.data<T>() + b0 * L.k.b, v.data<T>() + b0 * L.v.b,
                   g.data<float>() + b0 * L.g.b, s0p, o.data<T>() + b0 * L.o.b, sfp);
    });
  }
}

}  // namespace linac
