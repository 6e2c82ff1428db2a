// CUDA short gated convolution (math in short_conv.h):
//   c[t] = sum_j h[j] ã[t-W+1+j],   z[t] = act(c[t]) (g[t] + bg)        per channel, ã = a + ba, 0 left of t = 0
//   dg = act(c) dz,   dc = dz (g + bg) act'(c),   da[s] = sum_j h[j] dc[s+W-1-j]
//   dh[j] += sum dc[t] ã[t-W+1+j],   dba += sum da,   dbg += sum dg
// Layout: a, g, z, dz, da, dg [B, T, C] with unit channel stride and free batch/token strides; h [C, W]
// and the biases f32; the decode state [B, W-1, C] f32; document starts [B, T] int32 (optional).
// Documents: tap j of token t (ã[t-W+1+j]) is read only when t-W+1+j >= start[t]; da[s] takes
// dc[t] only when start[t] <= s. The stream kernels (kDocs = false) have no masks.
//
// The op streams memory, so the forward and backward kernels are built for bandwidth: a CTA covers
// a tile of kShortConvTileTokens tokens of one sequence and kGroups x V channels; each thread owns V
// consecutive channels (one 16-byte f32 or 8-byte bf16 access when the tensors allow it, else
// V = 1). The CTA first copies every row it will read (a from the W-1 tokens before the tile, g and
// in the backward dz; the backward's rows run W-1 tokens past the tile) into shared memory with
// cp.async, all copies in flight at once (each thread copies every kRows-th row). (Loading each
// token's window from global memory, the neighbours' rows from L1, kept only 12-20 KB per SM in
// flight: the backward took 0.44 against 0.38 ms, NOTES.md.) Then each thread walks kRun
// consecutive tokens with its window of ã = a + ba and its filter taps in registers (Filter), so a
// token reads one new row from shared memory instead of W (once its rows are staged the kernel is
// bound by its instructions, NOTES.md). The sums run in ascending tap order, as on the CPU. The
// backward computes each dc once, for the tile and the W-1 tokens after it, into shared memory,
// where the tile's da reads it, again over runs of consecutive tokens with dc sliding through
// registers (recomputing c at the W tokens each da needs was slower: 0.89 against 0.55 ms,
// NOTES.md); each CTA adds its threads' dh/dba/dbg in a fixed order and writes one row of partial
// sums per tile to ctx.workspace, and a second kernel adds the tiles of each channel in a fixed
// order (deterministic, no atomics). The decode step keeps the old inputs in a register window.
#include <type_traits>

#include "activation/sigmoid.cuh"
#include "common/cuda_common.cuh"
#include "common/mma_sm80.cuh"
#include "short_conv/short_conv.h"

namespace linac {
namespace {

constexpr int kMaxW = static_cast<int>(kShortConvMaxWidth);
constexpr int kTile = static_cast<int>(kShortConvTileTokens);
constexpr int kGroups = 16;  // channel groups of a CTA (consecutive threads, consecutive groups)
constexpr int kRows = 16;    // token rows of a CTA
constexpr int kRun = kTile / kRows;  // a thread's consecutive tokens in the sums
constexpr int kThreads = kGroups * kRows;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannels = 4 * kGroups;  // channels of a CTA at V = 4
static_assert(kTile % kRows == 0 && kRows % 2 == 0 && kGroups == 16, "two token rows per warp");

struct Args {
  int T, C, W, tiles;  // tiles per sequence
  int cblocks;         // channel blocks (kGroups x V channels) per tile: the fastest grid index
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

__device__ __forceinline__ float activation(float c, bool silu) { return silu ? c * cuda::sigmoid(c) : c; }
__device__ __forceinline__ float activation_grad(float c, bool silu) { return silu ? cuda::silu_grad(c) : 1.f; }

// The CTAs of a tile's channel blocks are consecutive, so the CTAs running at once read whole token
// rows, and the grid is one-dimensional (no 65,535 limit on either count).
__device__ __forceinline__ int tile_of(const Args& p) { return static_cast<int>(blockIdx.x) / p.cblocks; }
__device__ __forceinline__ int cblock_of(const Args& p) { return static_cast<int>(blockIdx.x) % p.cblocks; }

// A thread's share of the tile [t0, t1) of sequence b: V channels from ch (cl within the CTA), the
// staged rows at tokens t0 + row in steps of kRows, the window sums and the backward's da over the
// run t0 + row kRun, ... (kRun tokens); active: those channels exist.
template <int V>
struct Slot {
  int b, t0, t1, row, cl, ch;
  bool active;
};
template <int V>
__device__ __forceinline__ Slot<V> slot_of(const Args& p) {
  Slot<V> s;
  const int tile = tile_of(p);
  s.b = tile / p.tiles;
  s.t0 = (tile % p.tiles) * kTile;
  s.t1 = min(s.t0 + kTile, p.T);
  s.row = static_cast<int>(threadIdx.x) / kGroups;
  s.cl = (static_cast<int>(threadIdx.x) % kGroups) * V;
  s.ch = cblock_of(p) * kGroups * V + s.cl;
  s.active = s.ch < p.C;  // V divides C when V > 1
  return s;
}

// hs[j][c] = h[ch, j] for the CTA's kGroups x V channels (0 past C); ends with a barrier.
template <int V>
__device__ __forceinline__ void load_filter_tile(const float* h, const Args& p, float (&hs)[kMaxW][kMaxChannels]) {
  constexpr int n = kGroups * V;
  const int ch0 = cblock_of(p) * n;
  for (int i = static_cast<int>(threadIdx.x); i < p.W * n; i += kThreads) {
    const int j = i / n, c = i % n;
    hs[j][c] = ch0 + c < p.C ? h[int64_t{ch0 + c} * p.W + j] : 0.f;
  }
  __syncthreads();
}

template <int V>
__device__ __forceinline__ void load_bias(const float* bias, int ch, float (&v)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = bias ? bias[ch + i] : 0.f;
}

// The filter of a thread's V channels by window entry: hf(i, v) = h[W-1-i] of channel v (tap j =
// W-1-i of ã[t-i]), 0 for i >= W, so the window sums need no test of the width. In registers
// (kInRegs), or read from shared memory as the sums go: the backward's 8-tap instances would
// spill at their 128 registers per thread with it in registers.
template <int kTaps, int V, bool kInRegs>
struct Filter {
  float r[kInRegs ? kTaps : 1][V];
  const float (*hs)[kMaxChannels];
  int W, cl;
  __device__ __forceinline__ Filter(const float (&h)[kMaxW][kMaxChannels], int width, int lane_channel)
      : hs(h), W(width), cl(lane_channel) {
    if constexpr (kInRegs) {
#pragma unroll
      for (int i = 0; i < kTaps; ++i)
#pragma unroll
        for (int v = 0; v < V; ++v) r[i][v] = i < W ? hs[W - 1 - i][cl + v] : 0.f;
    }
  }
  __device__ __forceinline__ float operator()(int i, int v) const {
    if constexpr (kInRegs)
      return r[i][v];
    else
      return i < W ? hs[max(W - 1 - i, 0)][cl + v] : 0.f;
  }
};

// A thread's run of consecutive tokens [first, last) (at most kRun of them), with the window of ã
// sliding through registers: xa[kTaps - 1 + k - i] = ã[first + k - i], so each token loads one new
// row of the staging (row r, `pitch` elements, holds token t0 - halo + r) instead of its whole
// window. Rows before the sequence are the left padding (0). body(t, w, c) runs for each token
// t = first + k with the window w[i] = ã[t-i] as summed (0 before lo(t), t's document start, with
// documents) and c = sum_j h[j] ã[t-W+1+j] over it in ascending j, as the CPU sums it. In the
// stream instance no window reaches before the sequence's start but through the padding, so no
// tap is tested.
template <class T, int V, int kTaps, int kRun, bool kDocs, bool kInRegs, class Lo, class Body>
__device__ __forceinline__ void conv_run(const T* As, int pitch, int halo, int t0, int first, int last, int cl,
                                         const float (&ba)[V], const Filter<kTaps, V, kInRegs>& hf, Lo&& lo,
                                         Body&& body) {
  float xa[kTaps - 1 + kRun][V];
  auto load = [&](int t, float(&x)[V]) {
    cuda::load_vals<V>(As + (t - t0 + halo) * pitch + cl, x);
#pragma unroll
    for (int v = 0; v < V; ++v) x[v] = t >= 0 ? x[v] + ba[v] : 0.f;
  };
#pragma unroll
  for (int i = 1; i < kTaps; ++i) load(first - i, xa[kTaps - 1 - i]);
#pragma unroll
  for (int k = 0; k < kRun; ++k) {
    const int t = first + k;
    if (t >= last) break;
    load(t, xa[kTaps - 1 + k]);
    const int l = kDocs ? lo(t) : 0;
    float w[kTaps][V], c[V];  // the window as summed: ã[t-i], 0 before lo
#pragma unroll
    for (int i = 0; i < kTaps; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) w[i][v] = !kDocs || t - i >= l ? xa[kTaps - 1 + k - i][v] : 0.f;
#pragma unroll
    for (int v = 0; v < V; ++v) c[v] = 0.f;
#pragma unroll
    for (int i = kTaps - 1; i >= 0; --i)
#pragma unroll
      for (int v = 0; v < V; ++v) c[v] = fmaf(hf(i, v), w[i][v], c[v]);
    body(t, w, c);
  }
}

// The rows a CTA reads, staged in shared memory before any is used: a from token t0 - kHalo (the
// window of the tile's first token), g and, in the backward, dz from t0; the backward's rows run
// W - 1 tokens past the tile. Each row holds the CTA's kGroups x V channels.
template <class T, int V, int kTaps, bool kBwd>
struct Staging {
  static constexpr int kN = kGroups * V;  // row pitch
  static constexpr int kHalo = kTaps - 1;
  static constexpr int kAfter = kBwd ? kTaps - 1 : 0;
  static constexpr int kRowsA = kTile + kHalo + kAfter, kRowsG = kTile + kAfter;
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * kN * (kRowsA + (kBwd ? 2 : 1) * kRowsG);
};

template <int V, class T>
__device__ __forceinline__ void copy_vals_async(T* dst, const T* src) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if constexpr (kBytes >= 4)
    sm80::cp_async_ca<kBytes>(dst, src);
  else
    *dst = *src;  // one bf16 channel: below cp.async's 4 bytes
}

// Rows first + r of seq for r in [0, n) into dst's row r: this thread's V channels (cl) of rows
// row, row + kRows, ... Source rows are clamped into [0, len): the taps they feed outside the
// sequence are masked where they are summed, so no copy needs a condition. Every copy is issued
// before any completes: a CTA has its whole tile in flight.
template <int V, class T>
__device__ __forceinline__ void stage_rows(T* dst, const T* seq, int64_t stride_t, int first, int n, int len, int row,
                                           int cl) {
  for (int r = row; r < n; r += kRows)
    copy_vals_async<V>(dst + r * (kGroups * V) + cl,
                       seq + static_cast<int64_t>(min(max(first + r, 0), len - 1)) * stride_t);
}

template <class T, int V, int kTaps, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    fwd_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
               const float* __restrict__ ba, const float* __restrict__ bg, T* __restrict__ z, const Args p) {
  using S = Staging<T, V, kTaps, false>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);  // a of token t0 - kHalo + r
  T* Gs = As + S::kRowsA * S::kN;      // g of token t0 + r
  __shared__ float hs[kMaxW][kMaxChannels];
  const Slot<V> s = slot_of<V>(p);
  if (s.active) {
    stage_rows<V>(As, a + s.b * p.a.b + s.ch, p.a.t, s.t0 - S::kHalo, s.t1 - s.t0 + S::kHalo, p.T, s.row, s.cl);
    stage_rows<V>(Gs, g + s.b * p.g.b + s.ch, p.g.t, s.t0, s.t1 - s.t0, p.T, s.row, s.cl);
  }
  sm80::cp_async_commit();
  load_filter_tile<V>(h, p, hs);
  sm80::cp_async_wait<0>();
  __syncthreads();
  if (!s.active) return;
  T* z_seq = z + s.b * p.z.b + s.ch;
  const int32_t* start = kDocs ? p.doc_start + static_cast<int64_t>(s.b) * p.T : nullptr;
  float bias_a[V], bias_g[V];
  load_bias<V>(ba, s.ch, bias_a);
  load_bias<V>(bg, s.ch, bias_g);
  const Filter<kTaps, V, true> hf(hs, p.W, s.cl);
  const int first = s.t0 + s.row * kRun;
  conv_run<T, V, kTaps, kRun, kDocs, true>(
      As, S::kN, S::kHalo, s.t0, first, min(first + kRun, s.t1), s.cl, bias_a, hf, [&](int t) { return start[t]; },
      [&](int t, const float(&)[kTaps][V], const float(&c)[V]) {
        float gv[V], zv[V];
        cuda::load_vals<V>(Gs + (t - s.t0) * S::kN + s.cl, gv);
#pragma unroll
        for (int i = 0; i < V; ++i) zv[i] = activation(c[i], p.silu) * (gv[i] + bias_g[i]);
        cuda::store_vals<V>(z_seq + t * p.z.t, zv);
      });
}

// The CTA's sums of dh/dba/dbg into its tile's row of partial sums: the two token rows of a warp
// (lanes l and l + 16 hold the same channels), then the warps in order. Accumulator k < kTaps is
// window entry k, the filter's tap W-1-k (row W-1-k of W + 2), then dba (row W) and dbg (W + 1).
template <int V, int kTaps>
__device__ __forceinline__ void write_partials(const float (&dh_acc)[kTaps][V], const float (&dba_acc)[V],
                                               const float (&dbg_acc)[V], float (*sums)[kMaxW + 2][kMaxChannels],
                                               float* __restrict__ partial, const Args& p, const Slot<V>& s) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int k = 0; k < kTaps + 2; ++k) {
    const int row = k < kTaps ? (k < p.W ? p.W - 1 - k : -1) : p.W + (k - kTaps);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float v = k < kTaps ? dh_acc[k][i] : k == kTaps ? dba_acc[i] : dbg_acc[i];
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 16 && row >= 0) sums[warp][row][s.cl + i] = v;
    }
  }
  __syncthreads();
  constexpr int n = kGroups * V;
  const int64_t row0 = static_cast<int64_t>(tile_of(p)) * (p.W + 2);
  for (int idx = static_cast<int>(threadIdx.x); idx < (p.W + 2) * n; idx += kThreads) {
    const int k = idx / n, c = idx % n, ch = cblock_of(p) * n + c;
    if (ch >= p.C) continue;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w][k][c];
    partial[(row0 + k) * p.C + ch] = total;
  }
}

// Partial sums: rows of W + 2 channel vectors per (sequence, tile): dh[:, 0..W-1], dba, dbg. First
// every token of the tile and the W-1 after it computes its c and dc (dg and the filter taps for
// the tile's own tokens) and leaves dc in shared memory, then every tile token adds its da from there.
template <class T, int V, int kTaps, bool kDocs>
__global__ void __launch_bounds__(kThreads, 2)
    bwd_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
               const float* __restrict__ ba, const float* __restrict__ bg, const T* __restrict__ dz, T* __restrict__ da,
               T* __restrict__ dg, float* __restrict__ partial, const Args p) {
  using S = Staging<T, V, kTaps, true>;
  constexpr int kRowsDc = kTile + kMaxW - 1;
  static_assert(kRowsDc * kMaxChannels >= kWarps * (kMaxW + 2) * kMaxChannels, "sums alias dc");
  extern __shared__ __align__(16) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);  // a of token t0 - kHalo + r
  T* Gs = As + S::kRowsA * S::kN;      // g of token t0 + r
  T* DZs = Gs + S::kRowsG * S::kN;     // dz of token t0 + r
  __shared__ float hs[kMaxW][kMaxChannels];
  __shared__ float dcs[kRowsDc][kMaxChannels];  // dc of token t0 + r; later the CTA's sums
  const Slot<V> s = slot_of<V>(p);
  const int t_end = min(s.t1 + p.W - 1, p.T);
  if (s.active) {
    stage_rows<V>(As, a + s.b * p.a.b + s.ch, p.a.t, s.t0 - S::kHalo, t_end - s.t0 + S::kHalo, p.T, s.row, s.cl);
    stage_rows<V>(Gs, g + s.b * p.g.b + s.ch, p.g.t, s.t0, t_end - s.t0, p.T, s.row, s.cl);
    stage_rows<V>(DZs, dz + s.b * p.dz.b + s.ch, p.dz.t, s.t0, t_end - s.t0, p.T, s.row, s.cl);
  }
  sm80::cp_async_commit();
  load_filter_tile<V>(h, p, hs);
  sm80::cp_async_wait<0>();
  __syncthreads();
  float dh_acc[kTaps][V] = {}, dba_acc[V] = {}, dbg_acc[V] = {};
  const int32_t* start = kDocs ? p.doc_start + static_cast<int64_t>(s.b) * p.T : nullptr;
  float bias_a[V], bias_g[V];
  constexpr bool kInRegs = kTaps <= 4;
  const Filter<kTaps, V, kInRegs> hf(hs, p.W, s.cl);
  if (s.active) {
    load_bias<V>(ba, s.ch, bias_a);
    load_bias<V>(bg, s.ch, bias_g);
    T* dg_seq = dg ? dg + s.b * p.dg.b + s.ch : nullptr;  // null: the gate's gradient not wanted
    auto dc_of = [&](int t, const float(&w)[kTaps][V], const float(&c)[V]) {
      const int r = t - s.t0;
      float dzv[V], gv[V], dc[V];
      cuda::load_vals<V>(DZs + r * S::kN + s.cl, dzv);
      cuda::load_vals<V>(Gs + r * S::kN + s.cl, gv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        dc[i] = dzv[i] * (gv[i] + bias_g[i]) * activation_grad(c[i], p.silu);
        dcs[r][s.cl + i] = dc[i];
      }
      if (t < s.t1) {
        float dgv[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          dgv[i] = activation(c[i], p.silu) * dzv[i];
          dbg_acc[i] += dgv[i];
        }
        if (dg_seq) cuda::store_vals<V>(dg_seq + t * p.dg.t, dgv);
#pragma unroll
        for (int i = 0; i < kTaps; ++i)  // entries past W add into rows that write_partials leaves out
#pragma unroll
          for (int v = 0; v < V; ++v) dh_acc[i][v] = fmaf(dc[v], w[i][v], dh_acc[i][v]);
      }
    };
    auto lo = [&](int t) { return start[t]; };
    // The tile's tokens in runs of kRun, then the W - 1 after it (one per thread row), whose dc the
    // tile's last da need.
    const int first = s.t0 + s.row * kRun, extra = s.t1 + s.row;
    conv_run<T, V, kTaps, kRun, kDocs, kInRegs>(As, S::kN, S::kHalo, s.t0, first, min(first + kRun, s.t1), s.cl, bias_a,
                                                hf, lo, dc_of);
    if (extra < t_end)
      conv_run<T, V, kTaps, 1, kDocs, kInRegs>(As, S::kN, S::kHalo, s.t0, extra, extra + 1, s.cl, bias_a, hf, lo,
                                               dc_of);
  }
  __syncthreads();
  if (s.active) {
    // da[u] = sum_j h[j] dc[u + d], d = W-1-j, ascending j (descending d), over the thread's run of
    // consecutive u with dc sliding through registers: dw[k + d] = dc[first + k + d], 0 from
    // t_end on (past T, or past the W-1 rows computed after the tile, which no d < W reaches);
    // with documents, dc[t] of a document that starts after u dropped.
    T* da_seq = da + s.b * p.da.b + s.ch;
    const int first = s.t0 + s.row * kRun, last = min(first + kRun, s.t1);
    float dw[kTaps - 1 + kRun][V];
    auto load_dc = [&](int t, float(&x)[V]) {
#pragma unroll
      for (int v = 0; v < V; ++v) x[v] = t < t_end ? dcs[t - s.t0][s.cl + v] : 0.f;
    };
#pragma unroll
    for (int d = 0; d < kTaps - 1; ++d) load_dc(first + d, dw[d]);
#pragma unroll
    for (int k = 0; k < kRun; ++k) {
      const int u = first + k;
      if (u >= last) break;
      load_dc(u + kTaps - 1, dw[k + kTaps - 1]);
      float dav[V] = {};
#pragma unroll
      for (int d = kTaps - 1; d >= 0; --d) {
        const bool used = !kDocs || start[min(u + d, p.T - 1)] <= u;
#pragma unroll
        for (int v = 0; v < V; ++v) dav[v] = fmaf(hf(d, v), used ? dw[k + d][v] : 0.f, dav[v]);
      }
      cuda::store_vals<V>(da_seq + u * p.da.t, dav);
#pragma unroll
      for (int v = 0; v < V; ++v) dba_acc[v] += dav[v];
    }
  }
  __syncthreads();  // dcs becomes the CTA's sums
  write_partials<V, kTaps>(dh_acc, dba_acc, dbg_acc, reinterpret_cast<float(*)[kMaxW + 2][kMaxChannels]>(&dcs[0][0]),
                           partial, p, s);
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

// Decode step: one thread per (sequence, channel); the state holds ã of the last W-1 tokens,
// oldest first, read into a window win[i] = ã[t-i] with the filter reversed to match (hr[i] =
// h[W-1-i]), summed oldest input first.
template <class T>
__global__ void __launch_bounds__(128)
    step_kernel(const T* __restrict__ a, const T* __restrict__ g, const float* __restrict__ h,
                const float* __restrict__ ba, const float* __restrict__ bg, float* __restrict__ state,
                T* __restrict__ z, const Args p) {
  const int ch = static_cast<int>(blockIdx.y) * 128 + static_cast<int>(threadIdx.x);
  if (ch >= p.C) return;
  const int64_t b = blockIdx.x;
  float* st = state + b * (p.W - 1) * p.C + ch;
  float win[kMaxW];
#pragma unroll
  for (int i = 1; i < kMaxW; ++i) win[i] = i < p.W ? st[int64_t{p.W - 1 - i} * p.C] : 0.f;
  win[0] = cuda::to_float(a[b * p.a.b + ch]) + (ba ? ba[ch] : 0.f);
  float c = 0.f;
#pragma unroll
  for (int i = kMaxW - 1; i >= 0; --i)
    if (i < p.W) c = fmaf(h[int64_t{ch} * p.W + (p.W - 1 - i)], win[i], c);
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

// Whether every token row of every tensor starts on a 4-element boundary (and C is a multiple of
// 4), so that a thread may own 4 channels with one access.
bool four_channels(int64_t C, std::initializer_list<std::pair<const Tensor*, ShortConvLayout::Strides>> ts) {
  if (C % 4 != 0) return false;
  for (const auto& [t, st] : ts)
    if (t->defined() && (!cuda::vec4_aligned(*t) || st.b % 4 != 0 || st.t % 4 != 0)) return false;
  return true;
}

// The grid of a forward or backward launch (sets p.cblocks for V channels per thread).
unsigned tile_grid(Args& p, int64_t B, int V) {
  p.cblocks = static_cast<int>(cuda::grid_1d(p.C, kGroups * V));
  LINAC_CHECK(B * p.tiles * p.cblocks < (int64_t{1} << 31), "short_conv (GPU): too many tokens");
  return static_cast<unsigned>(B * p.tiles * p.cblocks);
}

// Calls launch(integral_constant kTaps, integral_constant kDocs): 4 taps for W <= 4, else 8; the
// documents instance where bounds are given.
template <class Fn>
void with_taps(const Args& p, Fn&& launch) {
  using Four = std::integral_constant<int, 4>;
  using Eight = std::integral_constant<int, kMaxW>;
  if (p.W <= 4)
    p.doc_start ? launch(Four{}, std::true_type{}) : launch(Four{}, std::false_type{});
  else
    p.doc_start ? launch(Eight{}, std::true_type{}) : launch(Eight{}, std::false_type{});
}

// Calls launch(std::integral_constant<int, V>{}, grid) with V = 4 channels per thread when `four`
// (four_channels), else 1, and the grid for that V.
template <class Fn>
void launch_tiles(Args& p, int64_t B, bool four, Fn&& launch) {
  if (four)
    launch(std::integral_constant<int, 4>{}, tile_grid(p, B, 4));
  else
    launch(std::integral_constant<int, 1>{}, tile_grid(p, B, 1));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

void short_conv_fwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& z) {
  LINAC_CHECK(g.dtype == a.dtype && z.dtype == a.dtype, "short_conv (GPU): a, g, z dtypes must agree");
  check_f32({&h, &ba, &bg}, "h and the biases");
  if (L.B * L.T * L.C == 0) return;
  Args p = make_args(L);
  const bool four = four_channels(L.C, {{&a, L.a}, {&g, L.g}, {&z, L.z}});
  launch_tiles(p, L.B, four, [&](auto v, unsigned grid) {
    constexpr int V = decltype(v)::value;
    LINAC_GPU_DISPATCH(a.dtype, T, {
      auto launch = [&](auto taps, auto docs) {
        constexpr int kTaps = decltype(taps)::value;
        auto kernel = fwd_kernel<T, V, kTaps, decltype(docs)::value>;
        constexpr int kBytes = Staging<T, V, kTaps, false>::kBytes;
        LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
        kernel<<<grid, kThreads, kBytes, cuda::stream_of(ctx)>>>(
            a.data<T>(), g.data<T>(), h.data<float>(), ptr_or_null<float>(ba), ptr_or_null<float>(bg), z.data<T>(), p);
      };
      with_taps(p, launch);
    });
  });
}

void short_conv_bwd_cuda(const Ctx& ctx, const ShortConvLayout& L, const Tensor& a, const Tensor& g, const Tensor& h,
                         const Tensor& ba, const Tensor& bg, const Tensor& dz, const Tensor& da, const Tensor& dg,
                         const Tensor& dh, const Tensor& dba, const Tensor& dbg) {
  for (const Tensor* t : {&g, &dz, &da, &dg})
    LINAC_CHECK(!t->defined() || t->dtype == a.dtype, "short_conv (GPU): a, g, dz, da, dg dtypes must agree");
  check_f32({&h, &ba, &bg, &dh, &dba, &dbg}, "h, the biases and their gradients");
  if (L.B * L.T * L.C == 0) return;
  LINAC_CHECK(ctx.workspace_bytes >= short_conv_bwd_workspace_bytes(L.B, L.T, L.C, L.W),
              "short_conv (GPU): workspace too small");
  Args p = make_args(L);
  float* partial = static_cast<float*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  const bool four = four_channels(L.C, {{&a, L.a}, {&g, L.g}, {&dz, L.dz}, {&da, L.da}, {&dg, L.dg}});
  launch_tiles(p, L.B, four, [&](auto v, unsigned grid) {
    constexpr int V = decltype(v)::value;
    LINAC_GPU_DISPATCH(a.dtype, T, {
      auto launch = [&](auto taps, auto docs) {
        constexpr int kTaps = decltype(taps)::value;
        auto kernel = bwd_kernel<T, V, kTaps, decltype(docs)::value>;
        constexpr int kBytes = Staging<T, V, kTaps, true>::kBytes;
        LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
        kernel<<<grid, kThreads, kBytes, st>>>(a.data<T>(), g.data<T>(), h.data<float>(), ptr_or_null<float>(ba),
                                               ptr_or_null<float>(bg), dz.data<T>(), da.data<T>(), ptr_or_null<T>(dg),
                                               partial, p);
      };
      with_taps(p, launch);
    });
  });
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
  const dim3 grid(static_cast<unsigned>(L.B), cuda::grid_1d(p.C, 128));
  LINAC_GPU_DISPATCH(a.dtype, T, {
    step_kernel<T><<<grid, 128, 0, cuda::stream_of(ctx)>>>(a.data<T>(), g.data<T>(), h.data<float>(),
                                                           ptr_or_null<float>(ba), ptr_or_null<float>(bg),
                                                           ptr_or_null<float>(state), z.data<T>(), p);
  });
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac
