// CUDA Latte backward (math in latte.h, docs/latte.md §4.2), per group of sequences that fits ctx.workspace:
//   chunk terms + state scan again -> S[n] = mu at each chunk start
//   grad_p  per chunk: gP_{t,l} = dec_{t,l} (gy_t . mu_prev_l) + sum_{s<=t} exp(b_{s,l} - lse_{t,l}) M_{t,s},
//           M = gy V^T, gP_{t,0} = gy_t . local_t; da (softmax backward), dlocal = pi_0 gy; the
//           reverse terms U[n] = sum_t c_{t,l} [gy_t | gP_{t,l}], c_{t,l} = exp(lse_{f-1} - lse_t) pi_{t,l}
//           (the extra column is r's)
//   reverse state scan -> S[n] = [R | r] at each chunk's end
//   grad_bv per chunk, with E_{s,l} = exp(b_{s,l} - lse_{e,l}) and P = exp(b_{s,l} - lse_{t,l}):
//           db_{s,l} = E_{s,l} (v_s . R_l - r_l) + sum_{t>=s} pi_{t,l} P (M_{t,s} - gP_{t,l})
//           dv_s = sum_l E_{s,l} R_l + sum_{t>=s} A_{t,s} gy_t
// On tensor cores, with the factor tiles of latte_common.cuh (P = Qe Kt, Qt = pi Qe):
//   gP = dec * (gy mu^T) + Qe * (M Kt),   U = c^T gy,
//   db = E * (V R^T - r) + Kt * (M^T Qt - sum_{t>=s} Qt gP),   dv = E R + A^T gy;
// a chunk whose lse grows too much takes the P terms with exact exponents instead.
// Documents (latte_common.cuh): M and A masked to pairs of one document, the carried-state terms
// (gy.mu_prev, c) only for rows whose document began before the chunk, E only for rows of the last
// row's document, and the suffix sums of Qt gP segmented at document ends. Operands that
// feed a difference of nearly equal sums (mu_prev into gP, R into v.R - r, M in the exact-exponent
// terms) and the f32 states' inputs (c) are split into bf16 parts (store_parts), so they keep f32
// or near-f32 precision on tensor cores.
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

// Shared memory of grad_p: f32 lse [64][L], b [64][L] in its own dtype (exact), f32 pi, gP
// [64][La]; tiles of T: V, gy [64][Dp], mu_prev [Lp][Dp] (2 parts), M [64][64] over V's tile where
// it fits (Dp >= 64: V is dead once M is formed), Kt [64][Lp] in a space that holds 3 of them (then
// c in 3 parts; in an exact-exponent chunk, which has no Kt, M's second part, which fits: 3 (Lp + 8)
// >= 64 + 8). At the paper's shape (L 16, Dv 96, bf16) that is 57,344 bytes: four CTAs per SM, the
// most its 64 registers allow (three with a separate M and b in f32: 68,608).
template <class T>
struct GradPSmem {
  float *lam, *pi, *gP;
  T *bq, *V, *GY, *mu, *M, *Kt;
  int* sd;
  size_t bytes;
  __host__ __device__ GradPSmem(unsigned char* base, const Args& a) {
    SmemCarve c{base};
    lam = c.take<float>(kC * a.L), bq = c.take<T>(kC * a.L);
    pi = c.take<float>(kC * a.La), gP = c.take<float>(kC * a.La);
    V = c.take<T>(kC * ld_of<T>(a.Dp)), GY = c.take<T>(kC * ld_of<T>(a.Dp));
    mu = c.take<T>(parts_of<T>(2) * a.Lp * ld_of<T>(a.Dp));
    M = m_over_v(a) ? V : c.take<T>(kC * ld_of<T>(kC));
    Kt = c.take<T>(parts_of<T>(3) * kC * ld_of<T>(a.Lp));
    sd = c.take<int>(doc_ints(a));
    bytes = c.bytes;
  }
  __host__ __device__ static bool m_over_v(const Args& a) { return ld_of<T>(a.Dp) >= ld_of<T>(kC); }
};

// M = gy V^T for first(t) <= s <= t (zero elsewhere) into the tile M[64][ld_of<T>(64)], which may
// be V's own tile: every warp forms its tiles in registers, and they are stored after a barrier,
// once no warp reads V. With Mlo (a tile of the same shape, bf16 only), M as two parts
// (store_parts) for the exact-exponent sums.
template <class T, bool kDocs>
__device__ void form_M(const Args& a, const T* GY, const T* V, const ChunkDocs<kDocs>& dc, T* M, T* Mlo) {
  constexpr int kTiles = (kC / 16) * (kC / 16), kWarps = kThreads / 32;  // 16 x 16 tiles (two n-tiles of 8)
  static_assert(kTiles % kWarps == 0, "every warp takes as many tiles");
  constexpr int kPerWarp = kTiles / kWarps;
  const int ldd = ld_of<T>(a.Dp), ldc = ld_of<T>(kC), warp = static_cast<int>(threadIdx.x) >> 5;
  float acc[kPerWarp][2][4] = {};
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    const int i = warp + kWarps * k, m0 = 16 * (i / (kC / 16)), n0 = 16 * (i % (kC / 16));
    if (n0 <= m0) warp_mma<T, false, false, 2>(acc[k], GY, ldd, m0, 0, V, ldd, 0, n0, a.Dp / 16, 2);
  }
  __syncthreads();  // V is read by every warp until here
#pragma unroll
  for (int k = 0; k < kPerWarp; ++k) {
    const int i = warp + kWarps * k, m0 = 16 * (i / (kC / 16)), n0 = 16 * (i % (kC / 16));
    each_acc(acc[k], m0, n0, 2, [&](int t, int s, float x) {
      x = s <= t && s >= dc.first(t) ? x : 0.f;
      const T hi = cuda::from_float<T>(x);
      M[t * ldc + s] = hi;
      if (Mlo) Mlo[t * ldc + s] = cuda::from_float<T>(x - cuda::to_float(hi));
    });
  }
}

template <class T>
__device__ __forceinline__ float m_at(const T* M, const T* Mlo, int t, int s) {
  const int i = t * ld_of<T>(kC) + s;
  return Mlo ? cuda::to_float(M[i]) + cuda::to_float(Mlo[i]) : cuda::to_float(M[i]);
}

template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads) grad_p_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as,
                                                         const T* __restrict__ b, LatteLayout::Strides bs,
                                                         const T* __restrict__ v, LatteLayout::Strides vs,
                                                         const T* __restrict__ local, LatteLayout::Strides ls,
                                                         const float* __restrict__ lse, const T* __restrict__ dy,
                                                         LatteLayout::Strides dys, const float* __restrict__ S,
                                                         float* __restrict__ gP, float* __restrict__ U,
                                                         T* __restrict__ da, LatteLayout::Strides das,
                                                         T* __restrict__ dlocal, LatteLayout::Strides dls) {
  extern __shared__ __align__(16) unsigned char smem[];
  const GradPSmem<T> sm(smem, a);
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  const int ldd = ld_of<T>(a.Dp), ldl = ld_of<T>(a.Lp), ldc = ld_of<T>(kC);
  constexpr int mu_parts = parts_of<T>(2);
  store_lse_rows(lse, a, bb, h, f, rows, sm.lam);  // one RowBatch at a time (latte_fwd.cu)
  store_head_rows<kMaxL>(b, bs, bb, h, f, rows, a.L, sm.bq);
  store_head_rows<kMaxL + 1>(av, as, bb, h, f, rows, a.La, sm.pi);
  rows_of<kMaxDv>(v, vs, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.V, ldd);
  rows_of<kMaxDv>(dy, dys, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.GY, ldd);
  store_state(state_of(S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd, a), sm.mu, ldd, a, mu_parts);
  const ChunkDocs<kDocs> dc = load_docs<kDocs>(a, bb, f, rows, sm.sd);
  __syncthreads();
  softmax_rows(sm.pi, rows, a.La);
  const bool direct = factor_tiles<T>(a, rows, sm.lam, sm.bq, sm.pi, dc, nullptr, sm.Kt);
  T* Mlo = direct && sizeof(T) == 2 ? sm.Kt : nullptr;
  form_M(a, sm.GY, sm.V, dc, sm.M, Mlo);
  if (a.off) {  // gP_{t,0} = gy_t . local_t: a warp per row, a slot of kVec columns per lane
    auto local_rows = rows_of<kMaxDv>(local, ls, bb, h, f, rows, a.Dv);
    static_assert(decltype(local_rows)::G == 32, "a row's slots must lie in one warp");
    local_rows.each([&](Slot<T>& x, int t, int c, bool in) {
      float acc = 0.f;
      if (in)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc = fmaf(cuda::to_float(sm.GY[t * ldd + c + e]), x.at(e), acc);
      acc = cuda::warp_sum(acc);  // every lane of the warp is at the same slot of the same row
      if ((threadIdx.x & 31) == 0 && t < rows) sm.gP[t * a.La] = acc;
    });
  }
  __syncthreads();
  const float* lam_prev = lse + ((static_cast<int64_t>(bb) * a.T + f - 1) * a.H + h) * a.L;  // valid for n > 0
  for_tiles<2>(kC, a.Lp, [&](int m0, int n0, int ntv) {
    float mu_dot[2][4] = {}, mk[2][4] = {};
    if (n > 0)
      for (int k = 0; k < mu_parts; ++k)
        warp_mma<T, false, false, 2>(mu_dot, sm.GY, ldd, m0, 0, sm.mu + k * a.Lp * ldd, ldd, 0, n0, a.Dp / 16, ntv);
    if (!direct) warp_mma<T, false, true, 2>(mk, sm.M, ldc, m0, 0, sm.Kt, ldl, 0, n0, m0 / 16 + 1, ntv);
    each_acc2(mu_dot, mk, m0, n0, ntv, [&](int t, int l, float md, float mkv) {
      if (t >= rows || l >= a.L) return;
      const float lt = sm.lam[t * a.L + l];
      const float x = n > 0 && dc.carried(t) ? expf(lam_prev[l] - lt) * md : 0.f;
      sm.gP[t * a.La + a.off + l] = direct ? x : fmaf(expf(sm.lam[dc.first(t) * a.L + l] - lt), mkv, x);
    });
  });
  __syncthreads();
  if (direct) {  // the exact-exponent sum in a pass of its own, out of the unrolled tiles (direct_db says why)
    for_rows(rows, a.L, [&](int t, int l) {
      const float lt = sm.lam[t * a.L + l];
      float x = sm.gP[t * a.La + a.off + l];
      for (int s = dc.first(t); s <= t; ++s)
        x = fmaf(expf(cuda::to_float(sm.bq[s * a.L + l]) - lt), m_at(sm.M, Mlo, t, s), x);
      sm.gP[t * a.La + a.off + l] = x;
    });
    __syncthreads();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* gPg = gP + (static_cast<int64_t>(bh) * a.T + f) * a.Lg;
  // da = pi (gP - pi . gP), softmax_rows' layout
  T* const da_c = da + bb * das.b + static_cast<int64_t>(f) * das.t + static_cast<int64_t>(h) * a.La;
  for_row_groups(rows, a.La, [&](int t, int c0, int cols) {
    const float* p = sm.pi + t * a.La;
    const float* g = sm.gP + t * a.La;
    float dot = 0.f;
    for (int c = c0; c < cols; c += kRowLanes) dot = fmaf(p[c], g[c], dot);
    dot = cuda::lanes_sum<kRowLanes>(dot);
    T* dat = da_c + t * static_cast<int>(das.t);
    for (int c = c0; c < cols; c += kRowLanes) {
      dat[c] = cuda::from_float<T>(p[c] * (g[c] - dot));
      gPg[t * a.Lg + c] = g[c];
    }
  });
  if (a.off) {  // dlocal = pi_0 gy, kVec columns at a time (Dv % kVec == 0)
    T* dl = dlocal + bb * dls.b + static_cast<int64_t>(f) * dls.t + static_cast<int64_t>(h) * a.Dv;
    const bool vdl = vec_rows(dl, dls.t);
    for_rows(rows, a.Dv / kVec, [&](int t, int q) {
      const int j = kVec * q;
      Slot<T> gy;
      gy.load(sm.GY + t * ldd + j);
      const float p0 = sm.pi[t * a.La];
      float x[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) x[e] = p0 * gy.at(e);
      T* d = dl + t * static_cast<int>(dls.t) + j;
      if (vdl) {
        store_vec(d, x);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) d[e] = cuda::from_float<T>(x[e]);
      }
    });
  }
  if (n == 0) return;  // the reverse scan never reads chunk 0's terms
  T* c = sm.Kt;        // Kt is spent: c_{t,l} = exp(lse_{f-1,l} - lse_{t,l}) pi_{t,l} (<= 1) takes its place
  constexpr int c_parts = parts_of<T>(3);
  for_rows(kC, a.Lp, [&](int t, int l) {
    const bool ok = t < rows && l < a.L && dc.carried(t);  // only f - 1's document reaches it
    store_parts(c + t * ldl + l, static_cast<size_t>(kC) * ldl, c_parts,
                ok ? expf(lam_prev[l] - sm.lam[t * a.L + l]) * sm.pi[t * a.La + a.off + l] : 0.f);
  });
  __syncthreads();
  float* Un = U + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for_tiles<2>(a.Lp, a.Dp, [&](int m0, int n0, int ntv) {
    float acc[2][4] = {};
    for (int k = 0; k < c_parts; ++k)
      warp_mma<T, true, true, 2>(acc, c + k * kC * ldl, ldl, m0, 0, sm.GY, ldd, 0, n0, kC / 16, ntv);
    each_acc_pair(acc, m0, n0, ntv, [&](int l, int j, float x, float y) {  // Dv % 4 == 0: j < Dv has j + 1
      if (l < a.L && j < a.Dv) store_pair(Un + l * a.Wd + j, x, y, true);
    });
  });
  for (int l = warp; l < a.L; l += kThreads / 32) {  // r_l = sum_t c_{t,l} gP_{t,l}: a warp per latent
    float r = 0.f;
    for (int t = lane; t < rows && dc.carried(t); t += 32)
      r = fmaf(expf(lam_prev[l] - sm.lam[t * a.L + l]) * sm.pi[t * a.La + a.off + l], sm.gP[t * a.La + a.off + l], r);
    r = cuda::warp_sum(r);
    if (lane == 0) Un[l * a.Wd + a.Dv] = r;
  }
}

// Shared memory of grad_bv: f32 lse [64][L], b [64][L] in its own dtype, f32 r [L], pi [64][La], gP
// (then its suffix sums) [64][L] (the latent columns: grad_p's column of the local term is not
// read here); tiles of T: V, gy [64][Dp], R [Lp][Dp] (2 parts), M (then A) [64][64] over V's tile
// where it fits and db's V R^T is one tile per warp (Dp >= 64, Lp <= 32: that product is taken
// into registers before M is formed), Qt, Kt (then E) [64][Lp] in a space that also holds M's
// second part for exact-exponent chunks (bf16), which have no Qt or Kt. At the paper's shape (L
// 16, Dv 96, bf16) that is 57,152 bytes: four CTAs per SM (three with separate M, M's second part
// and f32 b: 74,816).
template <class T>
struct GradBvSmem {
  float *lam, *pi, *gP, *r;
  T *bq, *V, *GY, *R, *M, *Mlo, *Qt, *Kt;
  int* sd;
  size_t bytes;
  __host__ __device__ GradBvSmem(unsigned char* base, const Args& a) {
    SmemCarve c{base};
    const int ldl = ld_of<T>(a.Lp), ldc = ld_of<T>(kC);
    lam = c.take<float>(kC * a.L), bq = c.take<T>(kC * a.L), r = c.take<float>(a.L);
    pi = c.take<float>(kC * a.La), gP = c.take<float>(kC * a.L);
    V = c.take<T>(kC * ld_of<T>(a.Dp)), GY = c.take<T>(kC * ld_of<T>(a.Dp));
    R = c.take<T>(parts_of<T>(2) * a.Lp * ld_of<T>(a.Dp));
    M = m_over_v(a) ? V : c.take<T>(kC * ldc);
    const int mlo = (parts_of<T>(2) - 1) * kC * ldc;
    Qt = c.take<T>(2 * kC * ldl > mlo ? 2 * kC * ldl : mlo);
    Kt = Qt + kC * ldl, Mlo = Qt;
    sd = c.take<int>(doc_ints(a));
    bytes = c.bytes;
  }
  __host__ __device__ static bool m_over_v(const Args& a) {
    return ld_of<T>(a.Dp) >= ld_of<T>(kC) && (kC / 16) * ((a.Lp + 15) / 16) <= kThreads / 32;
  }
};

// db's intra-chunk terms with exact exponents for (s, l) after x, the terms before them, for the
// rare chunks whose lse grows past kMaxGrowth: sum over t >= s in s's document of pi_{t,l}
// exp(b_{s,l} - lse_{t,l}) (M_{t,s} - gP_{t,l}). Out of line, as grad_p's runs in a pass of its
// own: inlined in the tile loop, every unrolled accumulator element carried a copy of the loop
// (12% of this kernel's code, 20% of grad_p's, and both wait on instruction fetch:
// kernels/latte/NOTES.md).
template <class T, bool kDocs>
__device__ __noinline__ float direct_db(float x, int s, int l, float bsl, int rows, int L, int La, int off,
                                        const float* pi, const float* lam, const T* M, const T* Mlo, const float* gP,
                                        ChunkDocs<kDocs> dc) {
  for (int t = s; t < rows && dc.first(t) <= s; ++t)  // t in s's document
    x = fmaf(pi[t * La + off + l] * expf(bsl - lam[t * L + l]), m_at(M, Mlo, t, s) - gP[t * L + l], x);
  return x;
}

template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads, 4)
    grad_bv_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as, const T* __restrict__ b,
                   LatteLayout::Strides bs, const T* __restrict__ v, LatteLayout::Strides vs,
                   const float* __restrict__ lse, const T* __restrict__ dy, LatteLayout::Strides dys,
                   const float* __restrict__ S, const float* __restrict__ gP, T* __restrict__ db,
                   LatteLayout::Strides dbs, T* __restrict__ dv, LatteLayout::Strides dvs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const GradBvSmem<T> sm(smem, a);
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  const int ldd = ld_of<T>(a.Dp), ldl = ld_of<T>(a.Lp), ldc = ld_of<T>(kC);
  const float* Sn = S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  constexpr int r_parts = parts_of<T>(2);
  store_lse_rows(lse, a, bb, h, f, rows, sm.lam);  // one RowBatch at a time (latte_fwd.cu)
  store_head_rows<kMaxL>(b, bs, bb, h, f, rows, a.L, sm.bq);
  store_head_rows<kMaxL + 1>(av, as, bb, h, f, rows, a.La, sm.pi);
  rows_of<kMaxDv>(v, vs, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.V, ldd);
  rows_of<kMaxDv>(dy, dys, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.GY, ldd);
  store_state(state_of(Sn, a), sm.R, ldd, a, r_parts);
  const float* gPg = gP + (static_cast<int64_t>(bh) * a.T + f) * a.Lg;
  store_latent_rows<kMaxL>(rows, a.L, gPg + a.off, a.Lg, sm.gP);
  if (threadIdx.x < a.L) sm.r[threadIdx.x] = Sn[threadIdx.x * a.Wd + a.Dv];
  const ChunkDocs<kDocs> dc = load_docs<kDocs>(a, bb, f, rows, sm.sd);
  __syncthreads();
  softmax_rows(sm.pi, rows, a.La);
  __syncthreads();
  const bool direct = factor_tiles<T>(a, rows, sm.lam, sm.bq, sm.pi, dc, sm.Qt, sm.Kt);
  T* Mlo = direct && sizeof(T) == 2 ? sm.Mlo : nullptr;
  // db's V R^T, [64][Lp]: where M takes V's tile, this warp's one tile of it now, kept in registers.
  float vr[2][4] = {};
  const auto v_r = [&](int m0, int n0, int ntv) {
    for (int k = 0; k < r_parts; ++k)
      warp_mma<T, false, false, 2>(vr, sm.V, ldd, m0, 0, sm.R + k * a.Lp * ldd, ldd, 0, n0, a.Dp / 16, ntv);
  };
  const bool m_over_v = GradBvSmem<T>::m_over_v(a);
  if (m_over_v) for_tiles<2>(kC, a.Lp, v_r);
  form_M(a, sm.GY, sm.V, dc, sm.M, Mlo);
  __syncthreads();
  // gP_{t,l} -> sum over t' >= t in t's document of Qt_{t',l} gP_{t',l}, with the Qt values the tensor cores see
  if (!direct) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // With documents the scan is segmented: whether rows 2k, 2k + 1 share a document (same) and
    // whether row 2k + 1's document goes on past the pair (cont); without, both always.
    const int t1 = 2 * lane + 1, t2 = 2 * lane + 2;
    const bool same = !kDocs || dc.first(t1) <= t1 - 1;
    const bool cont = !kDocs || (t2 < kC && dc.first(t2) <= t1);
    for (int l = warp; l < a.L; l += kThreads / 32) {  // a warp per latent, lane k owns rows 2k and 2k + 1
      float x[2];
      for (int i = 0; i < 2; ++i) {
        const int t = 2 * lane + i;
        x[i] = t < rows ? cuda::to_float(sm.Qt[t * ldl + l]) * sm.gP[t * a.L + l] : 0.f;
      }
      // Inclusive segmented suffix sum over the lanes' pairs, Kogge-Stone (fixed order): a lane
      // holds the sum from its first row to its segment's end or the next lane's rows (stop: ended).
      float suffix = same ? x[0] + x[1] : x[0];
      if constexpr (kDocs) {
        bool stop = !same || !cont;
        for (int o = 1; o < 32; o <<= 1) {
          const float y = __shfl_down_sync(0xffffffffu, suffix, o);
          const bool ys = __shfl_down_sync(0xffffffffu, stop, o);
          if (lane + o < 32 && !stop) suffix += y, stop = ys;
        }
      } else {
        for (int o = 1; o < 32; o <<= 1) {
          const float y = __shfl_down_sync(0xffffffffu, suffix, o);
          if (lane + o < 32) suffix += y;
        }
      }
      float after = __shfl_down_sync(0xffffffffu, suffix, 1);  // the sum over later lanes of row 2k + 1's document
      if (lane == 31 || !cont) after = 0.f;
      const float s1 = x[1] + after;
      if (2 * lane < rows) sm.gP[2 * lane * a.L + l] = same ? (x[0] + x[1]) + after : x[0];
      if (t1 < rows) sm.gP[t1 * a.L + l] = s1;
    }
  }
  __syncthreads();
  const float* lam_e = sm.lam + (rows - 1) * a.L;
  const int s_last = dc.first(rows - 1);  // R, r reach the rows of the last row's document only
  T* dbc = db + bb * dbs.b + static_cast<int64_t>(f) * dbs.t + static_cast<int64_t>(h) * a.L;
  for_tiles<2>(kC, a.Lp, [&](int m0, int n0, int ntv) {
    float mq[2][4] = {};
    if (!m_over_v) {
      for (auto& x : vr)
        for (float& y : x) y = 0.f;
      v_r(m0, n0, ntv);
    }
    if (!direct) warp_mma<T, true, true, 2>(mq, sm.M, ldc, m0, m0, sm.Qt, ldl, m0, n0, (kC - m0) / 16, ntv);
    each_acc2(vr, mq, m0, n0, ntv, [&](int s, int l, float vrv, float mqv) {
      if (s >= rows || l >= a.L) return;
      const float bsl = cuda::to_float(sm.bq[s * a.L + l]);
      float x = s >= s_last ? expf(bsl - lam_e[l]) * (vrv - sm.r[l]) : 0.f;
      if (!direct)
        x = fmaf(expf(bsl - sm.lam[dc.first(s) * a.L + l]), mqv - sm.gP[s * a.L + l], x);
      else
        x = direct_db(x, s, l, bsl, rows, a.L, a.La, a.off, sm.pi, sm.lam, sm.M, Mlo, sm.gP, dc);
      dbc[s * static_cast<int>(dbs.t) + l] = cuda::from_float<T>(x);
    });
  });
  __syncthreads();
  T* At = sm.M;  // M is spent
  form_A(a, rows, direct, sm.Qt, sm.Kt, sm.lam, sm.bq, sm.pi, dc, At);
  __syncthreads();
  T* E = sm.Kt;  // Kt is spent: E_{s,l} = exp(b_{s,l} - lse_{e,l}) (<= 1), rows of the last row's document
  for_rows(kC, a.Lp, [&](int s, int l) {
    E[s * ldl + l] = cuda::from_float<T>(
        s >= s_last && s < rows && l < a.L ? expf(cuda::to_float(sm.bq[s * a.L + l]) - lam_e[l]) : 0.f);
  });
  __syncthreads();
  T* dvc = dv + bb * dvs.b + static_cast<int64_t>(f) * dvs.t + static_cast<int64_t>(h) * a.Dv;
  const bool vdv = vec_pairs(dvc, dvs.t);
  for_tiles<2>(kC, a.Dp, [&](int m0, int n0, int ntv) {
    float acc[2][4] = {};
    warp_mma<T, false, true, 2>(acc, E, ldl, m0, 0, sm.R, ldd, 0, n0, a.Lp / 16, ntv);
    warp_mma<T, true, true, 2>(acc, At, ldc, m0, m0, sm.GY, ldd, m0, n0, (kC - m0) / 16, ntv);
    each_acc_pair(acc, m0, n0, ntv, [&](int s, int j, float x, float y) {  // Dv % 4 == 0: j < Dv has j + 1
      if (s < rows && j < a.Dv) store_pair(dvc + s * static_cast<int>(dvs.t) + j, x, y, vdv);
    });
  });
}

}  // namespace
}  // namespace latte_cuda

void latte_bwd_cuda(const Ctx& ctx, const LatteLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                    const Tensor& local, const Tensor& lse, const Tensor& dy, const Tensor& da, const Tensor& db,
                    const Tensor& dv, const Tensor& dlocal) {
  using namespace latte_cuda;
  for (const Tensor* t : {&b, &v, &local, &dy, &da, &db, &dv, &dlocal})
    LINAC_CHECK(!t->defined() || t->dtype == a.dtype, "latte (GPU): activation dtypes must agree");
  if (L.B * L.T * L.H == 0) return;
  const Args a0 = make_args(L);
  const int per = group_size(ctx, L);
  const int64_t lse_seq = L.T * L.H * L.L;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Args ar = group_args(a0, L, b0);
    Workspace w = carve(ctx, ar, B);
    use_saved_states(w, L, ar, b0);
    float* lsep = lse.data<float>() + b0 * lse_seq;
    const dim3 grid(ar.N, B * ar.H);
    LINAC_GPU_DISPATCH(a.dtype, T, {
      const T* ap = at_batch(a.data<T>(), b0, L.a.b);
      const T* bp = at_batch(b.data<T>(), b0, L.b.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      const T* dyp = at_batch(dy.data<T>(), b0, L.dy.b);
      const T* lp = L.local ? at_batch(local.data<T>(), b0, L.local_s.b) : nullptr;
      T* dlp = L.local ? at_batch(dlocal.data<T>(), b0, L.dlocal.b) : nullptr;
      if (!L.saved_states) {  // else the forward's chunk states and decays are there
        launch_chunk_terms<T>(ctx, ar, B, bp, L.b, vp, L.v, lsep, false, w.carry, w.U);
        launch_state_scan(ctx, ar, B, false, ar.Dv, w.carry, w.U, w.S, nullptr);
      }
      const size_t smem_p = GradPSmem<T>(nullptr, ar).bytes, smem_bv = GradBvSmem<T>(nullptr, ar).bytes;
      with_docs(ar, [&](auto docs) {
        constexpr bool kD = decltype(docs)::value;
        LINAC_CUDA_CHECK(cudaFuncSetAttribute(grad_p_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem_p)));
        grad_p_kernel<T, kD><<<grid, kThreads, smem_p, cuda::stream_of(ctx)>>>(
            ar, ap, L.a, bp, L.b, vp, L.v, lp, L.local_s, lsep, dyp, L.dy, w.S, w.gP, w.U,
            at_batch(da.data<T>(), b0, L.da.b), L.da, dlp, L.dlocal);
        LINAC_CUDA_LAUNCH_CHECK();
        launch_state_scan(ctx, ar, B, true, ar.Dv + 1, w.carry, w.U, w.S, nullptr);
        LINAC_CUDA_CHECK(cudaFuncSetAttribute(grad_bv_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem_bv)));
        grad_bv_kernel<T, kD><<<grid, kThreads, smem_bv, cuda::stream_of(ctx)>>>(
            ar, ap, L.a, bp, L.b, vp, L.v, lsep, dyp, L.dy, w.S, w.gP, at_batch(db.data<T>(), b0, L.db.b), L.db,
            at_batch(dv.data<T>(), b0, L.dv.b), L.dv);
        LINAC_CUDA_LAUNCH_CHECK();
      });
    });
  }
}

}  // namespace linac
