// CUDA short gated convolution (math in short_conv.h):
//   c[t] = sum_j h[j] ã[t-W+1+j],   z[t] = act(c[t]) (g[t] + bg)        per channel, ã = a + ba, 0 left of t = 0
//   dg = act(c) dz,   dc = dz (g + bg) act'(c),   da[s] = sum_j h[j] dc[s+W-1-j]
//   dh[j] += sum dc[t] ã[t-W+1+j],   dba += sum da,   dbg += sum dg
// Layout: a, g, z, dz, da, dg [B, T, C] with unit channel stride and free batch/token strides; h [C, W]
// and the biases f32; the decode state [B, W-1, C] f32; document starts [B, T] int32 (optional).
// Documents: tap i of token t (win[i] = ã[t-i]) is read only when t-i >= start[t]; da[s] takes
// dc[t] only when start[t] <= s. The window keeps the real inputs and the taps are masked where
// they are used, so the stream kernels (kDocs = false) are the code they were.
//
// A thread owns one channel of a tile of kShortConvTileTokens tokens of one sequence (consecutive
// threads take consecutive channels, so every load is coalesced) and slides along it with the last
// W biased inputs in registers: win[i] = ã[t-i], so the width W stays a runtime value while every
// register index is static. The sums run oldest input first, as on the CPU.
// The backward recomputes c and also visits the W-1 tokens after its tile, whose dc the tile's da
// needs; each thread writes its tile's partial sums of dh/dba/dbg to ctx.workspace, and a second
// kernel adds the tiles of each channel in a fixed order (deterministic, no atomics).
#include "common/cuda_common.cuh"
#include "short_conv/short_conv.h"

namespace linac {
namespace {

constexpr int kMaxW = static_cast<int>(kShortConvMaxWidth);
constexpr int kTile = static_cast<int>(kShortConvTileTokens);
constexpr int kThreads = 128;

struct Args {
  int T, C, W, tiles;  // tiles per sequence
  bool silu;
  const int32_t* doc_start;  // [B, T] or null
  ShortConvLayout::Strides a, g, z, dz, da, dg;
};

Args make_args(const ShortConvLayout& L) {
  LINAC_CHECK(L.T < (int64_t{1} << 31) && L.C < (int64_t{1} << 31), "short_conv (GPU): T or C too large");
  Args r{};
  r.T = static_cast<int>(L.T), r.C = static_cast<int>(L.C), r.W = static_cast<int>(L.W);
  r.tiles = static_cast<int>((L.T + kTile - 1) / kTile);
  r.silu = L.silu;
  r.doc_start = L.doc_start;
  r.a = L.a, r.g = L.g, r.z = L.z, r.dz = L.dz, r.da = L.da, r.dg = L.dg;
  return r;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float activation(float c, bool silu) { return silu ? c * sigmoid(c) : c; }
__device__ __forceinline__ float activation_grad(float c, bool silu) {
  if (!silu) return 1.f;
  const float s = sigmoid(c);
  return s * (1.f + c * (1.f - s));
}

// The filter of channel ch reversed to match the window: hr[i] = h[ch, W-1-i] (0 past W).
__device__ __forceinline__ void load_filter(const float* h, int ch, int W, float (&hr)[kMaxW]) {
#pragma unroll
  for (int i = 0; i < kMaxW; ++i) hr[i] = i < W ? h[int64_t{ch} * W + (W - 1 - i)] : 0.f;
}

// Shifts the window by one token and inserts ã[t] = x as win[0].
__device__ __forceinline__ void push(float (&win)[kMaxW], float x) {
#pragma unroll
  for (int i = kMaxW - 1; i > 0; --i) win[i] = win[i - 1];
  win[0] = x;
}

// c = sum over the window, oldest input first.
__device__ __forceinline__ float conv_window(const float (&hr)[kMaxW], const float (&win)[kMaxW], int W) {
  float c = 0.f;
#pragma unroll
  for (int i = kMaxW - 1; i >= 0; --i)
    if (i < W) c = fmaf(hr[i], win[i], c);
  return c;
}

// The same over the taps that stay inside the document: win[i] with i <= n (n = t - start[t]).
__device__ __forceinline__ float conv_window_doc(const float (&hr)[kMaxW], const float (&win)[kMaxW], int W, int n) {
  float c = 0.f;
#pragma unroll
  for (int i = kMaxW - 1; i >= 0; --i)
    if (i < W && i <= n) c = fmaf(hr[i], win[i], c);
  return c;
}

// The window just before token t0: win[i] = ã[t0-1-i], zero left of the sequence.
template <class T>
__device__ __forceinline__ void load_history(const T* a_seq, int64_t stride_t, float ba, int t0, int W,
                                             float (&win)[kMaxW]) {
#pragma unroll
  for (int i = 0; i < kMaxW; ++i) {
    const int s = t0 - 1 - i;
    win[i] = i < W - 1 && s >= 0 ? cuda::to_float(a_seq[s * stride_t]) + ba : 0.f;
  }
}

template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    fwd_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
               const float* __restrict__ ba, const float* __restrict__ bg, T* __restrict__ z, const Args p) {
  const int ch = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (ch >= p.C) return;
  const int b = static_cast<int>(blockIdx.x) / p.tiles, t0 = (static_cast<int>(blockIdx.x) % p.tiles) * kTile;
  const int t1 = min(t0 + kTile, p.T);
  const T* a_seq = a + b * p.a.b + ch;
  const T* g_seq = g + b * p.g.b + ch;
  T* z_seq = z + b * p.z.b + ch;
  const float bias_a = ba ? ba[ch] : 0.f, bias_g = bg ? bg[ch] : 0.f;
  float hr[kMaxW], win[kMaxW];
  load_filter(h, ch, p.W, hr);
  load_history(a_seq, p.a.t, bias_a, t0, p.W, win);
  const int32_t* start = kDocs ? p.doc_start + static_cast<int64_t>(b) * p.T : nullptr;
  for (int t = t0; t < t1; ++t) {
    push(win, cuda::to_float(a_seq[t * p.a.t]) + bias_a);
    const float c = kDocs ? conv_window_doc(hr, win, p.W, t - start[t]) : conv_window(hr, win, p.W);
    z_seq[t * p.z.t] = cuda::from_float<T>(activation(c, p.silu) * (cuda::to_float(g_seq[t * p.g.t]) + bias_g));
  }
}

// Partial sums: rows of W + 2 channel vectors per (sequence, tile): dh[:, 0..W-1], dba, dbg.
template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    bwd_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
               const float* __restrict__ ba, const float* __restrict__ bg, const T* __restrict__ dz, T* __restrict__ da,
               T* __restrict__ dg, float* __restrict__ partial, const Args p) {
  const int ch = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (ch >= p.C) return;
  const int b = static_cast<int>(blockIdx.x) / p.tiles, t0 = (static_cast<int>(blockIdx.x) % p.tiles) * kTile;
  const int t1 = min(t0 + kTile, p.T);
  const T* a_seq = a + b * p.a.b + ch;
  const T* g_seq = g + b * p.g.b + ch;
  const T* dz_seq = dz + b * p.dz.b + ch;
  T* da_seq = da + b * p.da.b + ch;
  T* dg_seq = dg + b * p.dg.b + ch;
  const float bias_a = ba ? ba[ch] : 0.f, bias_g = bg ? bg[ch] : 0.f;
  float hr[kMaxW], hf[kMaxW], win[kMaxW], dcw[kMaxW] = {}, dh_r[kMaxW] = {};
  load_filter(h, ch, p.W, hr);
#pragma unroll
  for (int j = 0; j < kMaxW; ++j) hf[j] = j < p.W ? h[int64_t{ch} * p.W + j] : 0.f;
  load_history(a_seq, p.a.t, bias_a, t0, p.W, win);
  float dba_sum = 0.f, dbg_sum = 0.f;
  const int32_t* start = kDocs ? p.doc_start + static_cast<int64_t>(b) * p.T : nullptr;
  int stw[kMaxW] = {};  // stw[i] = start[t-i] (documents)
  // Tokens past the tile (and past T, where dc = 0) complete the da of the tile's last W-1 tokens.
  for (int t = t0; t < t1 + p.W - 1; ++t) {
    float dc = 0.f;
    const int lo = kDocs && t < p.T ? start[t] : 0;
    if (t < p.T) {
      push(win, cuda::to_float(a_seq[t * p.a.t]) + bias_a);
      const float c = kDocs ? conv_window_doc(hr, win, p.W, t - lo) : conv_window(hr, win, p.W);
      const float dzv = cuda::to_float(dz_seq[t * p.dz.t]);
      dc = dzv * (cuda::to_float(g_seq[t * p.g.t]) + bias_g) * activation_grad(c, p.silu);
      if (t < t1) {
        const float dgv = activation(c, p.silu) * dzv;
        dg_seq[t * p.dg.t] = cuda::from_float<T>(dgv);
        dbg_sum += dgv;
#pragma unroll
        for (int i = 0; i < kMaxW; ++i)
          if (!kDocs || i <= t - lo) dh_r[i] = fmaf(dc, win[i], dh_r[i]);
      }
    }
    push(dcw, dc);  // dcw[i] = dc[t-i]
    if (kDocs) {
#pragma unroll
      for (int i = kMaxW - 1; i > 0; --i) stw[i] = stw[i - 1];
      stw[0] = lo;
    }
    const int s = t - p.W + 1;
    if (s >= t0) {
      // da[s] = sum_j h[j] dc[s+W-1-j] = sum_j h[j] dcw[j], ascending j (documents: the t-j whose
      // document holds s).
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxW; ++j)
        if (j < p.W && (!kDocs || stw[j] <= s)) acc = fmaf(hf[j], dcw[j], acc);
      da_seq[s * p.da.t] = cuda::from_float<T>(acc);
      dba_sum += acc;
    }
  }
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (p.W + 2);
#pragma unroll
  for (int i = 0; i < kMaxW; ++i)
    if (i < p.W) partial[(row + p.W - 1 - i) * p.C + ch] = dh_r[i];
  partial[(row + p.W) * p.C + ch] = dba_sum;
  partial[(row + p.W + 1) * p.C + ch] = dbg_sum;
}

// Adds the tiles' partial sums into dh, dba, dbg: blockIdx.y picks the row k of W + 2; kRowGroups
// groups of threads sum interleaved tiles in order, then one group adds the groups in order.
constexpr int kRowGroups = 8;

__global__ void __launch_bounds__(32 * kRowGroups)
    reduce_partials_kernel(const float* __restrict__ partial, int64_t tiles, int W, int C, float* __restrict__ dh,
                           float* __restrict__ dba, float* __restrict__ dbg) {
  __shared__ float sums[kRowGroups][32];
  const int ch = static_cast<int>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x), k = static_cast<int>(blockIdx.y);
  float acc = 0.f;
  if (ch < C)
    for (int64_t r = threadIdx.y; r < tiles; r += kRowGroups) acc += partial[(r * (W + 2) + k) * C + ch];
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || ch >= C) return;
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < kRowGroups; ++i) total += sums[i][threadIdx.x];
  if (k < W)
    dh[int64_t{ch} * W + k] += total;
  else if (k == W && dba)
    dba[ch] += total;
  else if (k == W + 1 && dbg)
    dbg[ch] += total;
}

// One thread per (sequence, channel); the state holds ã of the last W-1 tokens, oldest first.
template <class T>
__global__ void __launch_bounds__(kThreads)
    step_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
                const float* __restrict__ ba, const float* __restrict__ bg, float* __restrict__ state,
                T* __restrict__ z, const Args p) {
  const int ch = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (ch >= p.C) return;
  const int64_t b = blockIdx.x;
  float* st = state + b * (p.W - 1) * p.C + ch;
  float hr[kMaxW], win[kMaxW];
  load_filter(h, ch, p.W, hr);
#pragma unroll
  for (int i = 0; i < kMaxW; ++i) win[i] = i < p.W - 1 ? st[int64_t{p.W - 2 - i} * p.C] : 0.f;
  push(win, cuda::to_float(a[b * p.a.b + ch]) + (ba ? ba[ch] : 0.f));
  const float c = conv_window(hr, win, p.W);
  const float gate = cuda::to_float(g[b * p.g.b + ch]) + (bg ? bg[ch] : 0.f);
  z[b * p.z.b + ch] = cuda::from_float<T>(activation(c, p.silu) * gate);
#pragma unroll
  for (int i = 0; i < kMaxW; ++i)
    if (i < p.W - 1) st[int64_t{p.W - 2 - i} * p.C] = win[i];
}


void check_f32(std::initializer_list<const Tensor*> ts, const char* what) {
  for (const Tensor* t : ts)
    LINAC_CHECK(!t->defined() || t->dtype == DType::F32, std::string("short_conv (GPU): ") + what + " must be f32");
}

dim3 tile_grid(const Args& p, int64_t B) {
  LINAC_CHECK(B * p.tiles < (int64_t{1} << 31), "short_conv (GPU): too many tokens");
  return dim3(static_cast<unsigned>(B * p.tiles), cuda::grid_1d(p.C, kThreads));
}

}  // namespace

void short_conv_fwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& z) {
  LINAC_CHECK(g.dtype == a.dtype && z.dtype == a.dtype, "short_conv (GPU): a, g, z dtypes must agree");
  check_f32({&h, &ba, &bg}, "h and the biases");
  if (L.B * L.T * L.C == 0) return;
  const Args p = make_args(L);
  LINAC_GPU_DISPATCH(a.dtype, T, {
    auto kernel = p.doc_start ? fwd_kernel<T, true> : fwd_kernel<T, false>;
    kernel<<<tile_grid(p, L.B), kThreads, 0, cuda::stream_of(ctx)>>>(
        a.data<T>(), g.data<T>(), h.data<float>(), ptr_or_null<float>(ba), ptr_or_null<float>(bg), z.data<T>(), p);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

void short_conv_bwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& dz, const Tensor& da, const Tensor& dg,
                         const Tensor& dh, const Tensor& dba, const Tensor& dbg) {
  for (const Tensor* t : {&g, &dz, &da, &dg})
    LINAC_CHECK(t->dtype == a.dtype, "short_conv (GPU): a, g, dz, da, dg dtypes must agree");
  check_f32({&h, &ba, &bg, &dh, &dba, &dbg}, "h, the biases and their gradients");
  if (L.B * L.T * L.C == 0) return;
  LINAC_CHECK(ctx.workspace_bytes >= short_conv_bwd_workspace_bytes(L.B, L.T, L.C, L.W),
              "short_conv (GPU): workspace too small");
  const Args p = make_args(L);
  float* partial = static_cast<float*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  LINAC_GPU_DISPATCH(a.dtype, T, {
    auto kernel = p.doc_start ? bwd_kernel<T, true> : bwd_kernel<T, false>;
    kernel<<<tile_grid(p, L.B), kThreads, 0, st>>>(a.data<T>(), g.data<T>(), h.data<float>(), ptr_or_null<float>(ba),
                                                   ptr_or_null<float>(bg), dz.data<T>(), da.data<T>(), dg.data<T>(),
                                                   partial, p);
  });
  LINAC_CUDA_LAUNCH_CHECK();
  const dim3 grid(cuda::grid_1d(p.C, 32), static_cast<unsigned>(p.W + 2));
  reduce_partials_kernel<<<grid, dim3(32, kRowGroups), 0, st>>>(partial, L.B * p.tiles, p.W, p.C, dh.data<float>(),
                                                                ptr_or_null<float>(dba), ptr_or_null<float>(dbg));
  LINAC_CUDA_LAUNCH_CHECK();
}

void short_conv_step_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                          const Tensor& ba, const Tensor& bg, const Tensor& state, const Tensor& z) {
  LINAC_CHECK(g.dtype == a.dtype && z.dtype == a.dtype, "short_conv_step (GPU): a_t, g_t, z_t dtypes must agree");
  check_f32({&h, &ba, &bg, &state}, "h, the biases and the state");
  if (L.B * L.C == 0) return;
  const Args p = make_args(L);
  const dim3 grid(static_cast<unsigned>(L.B), cuda::grid_1d(p.C, kThreads));
  LINAC_GPU_DISPATCH(a.dtype, T, {
    step_kernel<T><<<grid, kThreads, 0, cuda::stream_of(ctx)>>>(a.data<T>(), g.data<T>(), h.data<float>(),
                                                                ptr_or_null<float>(ba), ptr_or_null<float>(bg), ptr_or_null<float>(state),
                                                                z.data<T>(), p);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
