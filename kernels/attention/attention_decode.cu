// CUDA attention decode (math in attention_decode.h): per (batch, head) and block of
// kAttentionDecodeSplit cache slots,
//   S[s] = scale <q, k[s]>,   m = max_s S[s],   l = sum_s exp(S[s] - m),   acc = sum_s exp(S[s] - m) v[s]
// and o = acc / l once the blocks are combined.
// Layout: q, o [B, H, D] (free batch stride), k_cache, v_cache [B, S, Hk, D] contiguous (query head
// h reads key/value head h / (H / Hk)); bf16 or f32, math in f32.
//
// A CTA of kWarps warps owns one (batch*head, slot block). A key row is read by a group of G lanes,
// 8 dims each (G = the power of two >= D/8), so a warp scores 32/G slots at once; the group adds its
// partial dot products with a butterfly (every lane ends with the same sum) and keeps its own
// online softmax (running max, sum, 8 output dims per lane) over the slots it visits. The groups'
// states are merged through shared memory in group order; with one slot block the CTA writes o,
// otherwise it writes (acc, m, l) to ctx.workspace and combine_kernel merges the blocks in block
// order. Every order is fixed by the shapes, so results are bitwise reproducible.
//
// The decoding step (attention_decode_step) reads each row's position on the device: prepare_kernel
// rotates the row's q and k (rope_math.cuh's rotation, as rope.cu) and writes k and v into the
// cache; decode_kernel's grid then covers every slot of the cache and the blocks past a row's
// valid slots return at once (a few microseconds over a graph's replay, against a relaunch per
// token), so the launches do not depend on the positions.
#include "attention/attention_decode.h"
#include "common/cuda_common.cuh"
#include "rope/rope_math.cuh"

namespace linac {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kSplit = static_cast<int>(kAttentionDecodeSplit);

struct Args {
  int H, Hk, D, S, n_valid, splits;  // splits: the grid's slot blocks per (batch, head)
  float scale;
  int64_t q_b, o_b;
  const int32_t* pos;  // the step's positions [B] (then n_valid is per row), or null
  int window;
};

// The valid slots of row b.
__device__ __forceinline__ int valid_slots(const Args& p, int b) {
  if (!p.pos) return p.n_valid;
  const int pos = p.pos[b];
  return p.window > 0 ? min(pos + 1, p.window) : pos + 1;
}

template <class T>
__device__ __forceinline__ void load8(const T* p, float (&x)[8]) {
  const float4 lo = cuda::load4(p), hi = cuda::load4(p + 4);
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float (&x)[8], float mul) {
  cuda::store4(p, make_float4(x[0] * mul, x[1] * mul, x[2] * mul, x[3] * mul));
  cuda::store4(p + 4, make_float4(x[4] * mul, x[5] * mul, x[6] * mul, x[7] * mul));
}

// Shared memory: per group its running max and sum, then its D accumulators.
template <class T, int G>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ partial, const Args p) {
  constexpr int kPerWarp = 32 / G, kGroups = kWarps * kPerWarp;
  extern __shared__ float smem[];
  float* s_m = smem;
  float* s_l = s_m + kGroups;
  float* s_acc = s_l + kGroups;

  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, split = blockIdx.y, g = h / (p.H / p.Hk);
  const int n_valid = valid_slots(p, b), splits = (n_valid + kSplit - 1) / kSplit;
  if (split >= splits) return;
  const int s_begin = split * kSplit, s_end = min(s_begin + kSplit, n_valid);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp * kPerWarp + lane / G;
  const int d0 = (lane % G) * 8;
  const bool dims = d0 < p.D;  // D/8 may be less than G: the group's last lanes then hold no dims

  float qf[8] = {}, acc[8] = {};
  if (dims) load8(q + b * p.q_b + h * p.D + d0, qf);
  float m = -INFINITY, l = 0.f;
  const int64_t slot_stride = int64_t{p.Hk} * p.D;
  const int64_t row0 = (int64_t{b} * p.S * p.Hk + g) * p.D + d0;
  // Warp-uniform trip count, so the butterfly's shuffles always see the whole warp.
  for (int base = s_begin + warp * kPerWarp; base < s_end; base += kGroups) {
    const int s = base + lane / G;
    const bool valid = s < s_end;
    float kf[8] = {}, vf[8] = {};
    if (valid && dims) {
      load8(k + row0 + s * slot_stride, kf);
      load8(v + row0 + s * slot_stride, vf);
    }
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) dot = fmaf(qf[i], kf[i], dot);
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (!valid) continue;
    const float score = dot * p.scale, m_new = fmaxf(m, score);
    const float alpha = expf(m - m_new), w = expf(score - m_new);
    l = l * alpha + w;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, vf[i], acc[i] * alpha);
    m = m_new;
  }
  if (lane % G == 0) s_m[group] = m, s_l[group] = l;
  if (dims) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s_acc[group * p.D + d0 + i] = acc[i];
  }
  __syncthreads();

  // Every slot block holds at least one valid slot, so the maximum is finite and groups that saw
  // none (m = -inf) get weight 0.
  float m_all = -INFINITY;
  for (int g = 0; g < kGroups; ++g) m_all = fmaxf(m_all, s_m[g]);
  float l_all = 0.f;
  for (int g = 0; g < kGroups; ++g) l_all += expf(s_m[g] - m_all) * s_l[g];
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    float a = 0.f;
    for (int g = 0; g < kGroups; ++g) a += expf(s_m[g] - m_all) * s_acc[g * p.D + d];
    if (splits == 1)
      o[b * p.o_b + h * p.D + d] = cuda::from_float<T>(a / l_all);
    else
      partial[(int64_t{bh} * p.splits + split) * (p.D + 2) + d] = a;
  }
  if (splits > 1 && threadIdx.x == 0) {
    float* tail = partial + (int64_t{bh} * p.splits + split) * (p.D + 2) + p.D;
    tail[0] = m_all, tail[1] = l_all;
  }
}

// Merges the slot blocks of one (batch, head) in block order (with one block decode_kernel wrote o).
template <class T>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const float* __restrict__ partial, T* __restrict__ o, const Args p) {
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int splits = (valid_slots(p, b) + kSplit - 1) / kSplit;
  if (splits == 1) return;
  const float* rows = partial + int64_t{bh} * p.splits * (p.D + 2);
  float m_all = -INFINITY;
  for (int sp = 0; sp < splits; ++sp) m_all = fmaxf(m_all, rows[sp * (p.D + 2) + p.D]);
  float l_all = 0.f;
  for (int sp = 0; sp < splits; ++sp) {
    const float* tail = rows + sp * (p.D + 2) + p.D;
    l_all += expf(tail[0] - m_all) * tail[1];
  }
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    float a = 0.f;
    for (int sp = 0; sp < splits; ++sp) {
      const float* row = rows + sp * (p.D + 2);
      a += expf(row[p.D] - m_all) * row[d];
    }
    o[b * p.o_b + h * p.D + d] = cuda::from_float<T>(a / l_all);
  }
}

struct PrepareArgs {
  int H, Hk, D, S, window;
  int64_t q_b, k_b, v_b;
  bool rope;
};

// One CTA per sequence: the (cos, sin) of its position into shared memory, then its q and k heads
// rotated in place, one pair per thread and pass, the rotated k and the v row written into the
// cache slot.
template <class T>
__global__ void __launch_bounds__(kThreads)
    prepare_kernel(T* __restrict__ q, T* __restrict__ k, const T* __restrict__ v, T* __restrict__ k_cache,
                   T* __restrict__ v_cache, const int32_t* __restrict__ positions, const PrepareArgs a,
                   const __grid_constant__ cuda::RopeInvFreq freq) {
  extern __shared__ float cs[];  // cos [half], then sin [half]
  const int b = blockIdx.x, pos = positions[b], half = a.D / 2, row = a.Hk * a.D;
  const int slot = a.window > 0 ? pos % a.window : pos;
  T* kc = k_cache + (int64_t{b} * a.S + slot) * row;
  T* vc = v_cache + (int64_t{b} * a.S + slot) * row;
  T* qb = q + b * a.q_b;
  T* kb = k + b * a.k_b;
  const T* vb = v + b * a.v_b;
  for (int j = threadIdx.x; j < row; j += blockDim.x) vc[j] = vb[j];
  if (!a.rope) {
    for (int j = threadIdx.x; j < row; j += blockDim.x) kc[j] = kb[j];
    return;
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(static_cast<float>(pos) * freq.v[i], &s, &c);
    cs[i] = c, cs[half + i] = s;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < (a.H + a.Hk) * half; j += blockDim.x) {
    const int hh = j / half, i = j - hh * half;
    T* x = hh < a.H ? qb + hh * a.D : kb + (hh - a.H) * a.D;
    const float2 r = cuda::rope_rotate(cuda::to_float(x[i]), cuda::to_float(x[i + half]), cs[i], cs[half + i]);
    const T y1 = cuda::from_float<T>(r.x), y2 = cuda::from_float<T>(r.y);
    x[i] = y1, x[i + half] = y2;
    if (hh >= a.H) {
      T* c = kc + (hh - a.H) * a.D;
      c[i] = y1, c[i + half] = y2;
    }
  }
}

template <class T, int G>
void launch(const Ctx& ctx, const Args& a, int64_t BH, const Tensor& q, const Tensor& k, const Tensor& v,
            const Tensor& o) {
  constexpr int kGroups = kWarps * 32 / G;
  const size_t smem = static_cast<size_t>(kGroups) * (a.D + 2) * sizeof(float);
  float* partial = static_cast<float*>(ctx.workspace);
  auto st = cuda::stream_of(ctx);
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>(a.splits));
  decode_kernel<T, G><<<grid, kThreads, smem, st>>>(q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), partial, a);
  LINAC_CUDA_LAUNCH_CHECK();
  if (a.splits == 1) return;
  combine_kernel<T><<<static_cast<unsigned>(BH), kThreads, 0, st>>>(partial, o.data<T>(), a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void dispatch_group(const Ctx& ctx, const Args& a, int64_t BH, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& o) {
  const int lanes = a.D / 8;
  if (lanes <= 1)
    launch<T, 1>(ctx, a, BH, q, k, v, o);
  else if (lanes <= 2)
    launch<T, 2>(ctx, a, BH, q, k, v, o);
  else if (lanes <= 4)
    launch<T, 4>(ctx, a, BH, q, k, v, o);
  else if (lanes <= 8)
    launch<T, 8>(ctx, a, BH, q, k, v, o);
  else if (lanes <= 16)
    launch<T, 16>(ctx, a, BH, q, k, v, o);
  else
    launch<T, 32>(ctx, a, BH, q, k, v, o);
}

// The checks both entry points share; the kernel arguments for n_valid slots.
Args decode_args(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k_cache,
                 const Tensor& v_cache, const Tensor& o, int64_t n_valid) {
  LINAC_CHECK(L.D % 8 == 0 && L.D <= 256,
              "attention_decode (GPU): head dim must be a multiple of 8 up to 256, got " + std::to_string(L.D));
  LINAC_CHECK(k_cache.dtype == q.dtype && v_cache.dtype == q.dtype && o.dtype == q.dtype,
              "attention_decode (GPU): dtypes must agree");
  // Rows are read and written four elements at a time.
  for (const Tensor* t : {&q, &k_cache, &v_cache, &o})
    LINAC_CHECK(cuda::vec4_aligned(*t), "attention_decode (GPU): data must be aligned to four elements");
  LINAC_CHECK(L.q_b % 4 == 0 && L.o_b % 4 == 0, "attention_decode (GPU): batch strides must be multiples of 4");
  LINAC_CHECK(L.B * L.S * L.H * L.D < (int64_t{1} << 62) && L.S < (int64_t{1} << 31),
              "attention_decode (GPU): cache too large");
  LINAC_CHECK(ctx.workspace_bytes >= attention_decode_workspace_bytes(L.B, L.H, L.D, n_valid),
              "attention_decode (GPU): workspace too small");
  Args a{};
  a.H = static_cast<int>(L.H), a.Hk = static_cast<int>(L.Hk), a.D = static_cast<int>(L.D), a.S = static_cast<int>(L.S);
  a.n_valid = static_cast<int>(n_valid);
  a.splits = static_cast<int>((n_valid + kSplit - 1) / kSplit);
  a.scale = static_cast<float>(L.scale);
  a.q_b = L.q_b, a.o_b = L.o_b;
  return a;
}

}  // namespace

void attention_decode_cuda(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& o) {
  const Args a = decode_args(ctx, L, q, k_cache, v_cache, o, L.n_valid);
  if (L.B * L.H == 0) return;
  LINAC_GPU_DISPATCH(q.dtype, T, dispatch_group<T>(ctx, a, L.B * L.H, q, k_cache, v_cache, o));
}

void attention_decode_step_cuda(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& pos, const RopeFreqs& rope, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& o) {
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, "attention_decode_step (GPU): dtypes must agree");
  LINAC_CHECK(!rope.defined() || L.D <= kRopeMaxDim, "attention_decode_step (GPU): head dim too large for RoPE");
  // The grid covers every slot a row may hold: all of them.
  Args a = decode_args(ctx, L, q, k_cache, v_cache, o, L.S);
  if (L.B * L.H == 0) return;
  a.pos = pos.data<int32_t>();
  a.window = static_cast<int>(L.window);
  PrepareArgs pa{};
  pa.H = a.H, pa.Hk = a.Hk, pa.D = a.D, pa.S = a.S, pa.window = a.window;
  pa.q_b = L.q_b, pa.k_b = L.k_b, pa.v_b = L.v_b;
  pa.rope = rope.defined();
  const cuda::RopeInvFreq freq = pa.rope ? cuda::rope_inv_freq_table(rope, L.D) : cuda::RopeInvFreq{};
  const size_t smem = static_cast<size_t>(L.D) * sizeof(float);
  LINAC_GPU_DISPATCH(q.dtype, T, {
    prepare_kernel<T><<<static_cast<unsigned>(L.B), kThreads, smem, cuda::stream_of(ctx)>>>(
        q.data<T>(), k.data<T>(), v.data<T>(), k_cache.data<T>(), v_cache.data<T>(), a.pos, pa, freq);
    LINAC_CUDA_LAUNCH_CHECK();
    dispatch_group<T>(ctx, a, L.B * L.H, q, k_cache, v_cache, o);
  });
}

void attention_cache_write_cuda(const Ctx& ctx, const Tensor& x_t, const Tensor& cache, int64_t slot) {
  const int64_t B = x_t.size(0), S = cache.size(1), row = x_t.size(1) * x_t.size(2);
  const size_t e = dtype_size(x_t.dtype);
  if (B * row == 0) return;
  // One row of H*D elements per sequence: a pitched 2-D copy on the stream.
  LINAC_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(cache.ptr) + static_cast<size_t>(slot * row) * e,
                                     static_cast<size_t>(S * row) * e, x_t.ptr, static_cast<size_t>(x_t.strides[0]) * e,
                                     static_cast<size_t>(row) * e, static_cast<size_t>(B), cudaMemcpyDeviceToDevice,
                                     cuda::stream_of(ctx)));
}

}  // namespace linac
