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
// The decoding step (attention_decode_step) is one launch that reads each row's position on the
// device: every CTA rotates its q head and the new key (rope_math.cuh's rotation, as rope.cu) in
// shared memory and reads the new slot from there, one CTA writes the new key and value into the
// cache, and the last of a (batch, head)'s blocks to finish merges them (a counter per (batch,
// head), left at zero). The grid covers every slot of the cache; blocks past a row's valid slots
// return at once. Nothing launched depends on the positions, so a CUDA graph replays the step.
// As a dependent launch (cuda_common.cuh) a CTA reads the position, computes the sines and loads
// its first cached rows before dependent_wait(); only the new token's q, k and v, written by the
// product ahead, wait for it.
//
// The cache write (a prefill's keys and values) is pitched copies on the stream, no kernel.
#include <algorithm>

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

// The decoding step's extras: the new token's k and v rows (unrotated), the rotation, and the
// counters through which the slot blocks of a (batch, head) find the last of them to finish.
struct StepArgs {
  const void* k;
  const void* v;
  int64_t k_b, v_b;
  bool rope;
  int* done;  // [B*H], zero between steps
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

// Eight consecutive values of a key or value row as loaded, unconverted (bf16: 4 registers), so
// that several rows can be in flight per thread.
template <class T>
struct Raw8 {
  using Vec = std::conditional_t<sizeof(T) == 2, uint2, float4>;  // four values
  Vec v[2];
};
template <class T>
__device__ __forceinline__ void load_raw8(const T* p, Raw8<T>& r) {
  using Vec = typename Raw8<T>::Vec;
  r.v[0] = *reinterpret_cast<const Vec*>(p);
  r.v[1] = *reinterpret_cast<const Vec*>(p + 4);
}
template <class T>
__device__ __forceinline__ void unpack8(const Raw8<T>& r, float (&x)[8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (sizeof(T) == 2) {
      const float2 a = cuda::unpack_bf16(r.v[h].x), b = cuda::unpack_bf16(r.v[h].y);
      x[4 * h] = a.x, x[4 * h + 1] = a.y, x[4 * h + 2] = b.x, x[4 * h + 3] = b.y;
    } else {
      x[4 * h] = r.v[h].x, x[4 * h + 1] = r.v[h].y, x[4 * h + 2] = r.v[h].z, x[4 * h + 3] = r.v[h].w;
    }
  }
}

// o = the slot blocks of one (batch, head) merged in block order: rows [splits][D + 2] of
// (acc, m, l). One pass with a running maximum, so a thread's reads of every block (its acc value,
// m and l) are independent of each other and in flight together; read through L2 (another CTA of
// the step may have written them).
template <class T>
__device__ void merge_blocks(const float* rows, int splits, int D, T* o) {
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float m = -INFINITY, l = 0.f, a = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) {
      const float* row = rows + sp * (D + 2);
      const float m_sp = __ldcg(row + D), l_sp = __ldcg(row + D + 1), a_sp = __ldcg(row + d);
      const float m_new = fmaxf(m, m_sp), c = expf(m - m_new), c_sp = expf(m_sp - m_new);
      l = fmaf(l, c, l_sp * c_sp);
      a = fmaf(a, c, a_sp * c_sp);
      m = m_new;
    }
    o[d] = cuda::from_float<T>(a / l);
  }
}

// Shared memory: per group its running max and sum, then its D accumulators; the step adds the
// (cos, sin) of its position [D] (f32) and its rotated q, rotated k and v rows [3 D] (T).
// kStep: q, k, v are the new token's q (unrotated, a [B, H, D] view of qkv) and the caches; the
// CTA rotates q and the new k itself, reads the new slot from shared memory rather than from the
// cache, and the CTA whose block holds that slot, for the first query head of the key/value head,
// writes it into the cache. The blocks of a (batch, head) count themselves done in StepArgs::done;
// the last one merges them (merge_blocks, in block order) and zeroes its counter.
template <class T, int G, bool kStep, bool kWide>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const T* __restrict__ q, T* __restrict__ k, T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ partial, const Args p, const StepArgs st,
                  const __grid_constant__ cuda::RopeInvFreq freq) {
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
  const int64_t slot_stride = int64_t{p.Hk} * p.D;
  const int64_t row0 = (int64_t{b} * p.S * p.Hk + g) * p.D + d0;
  // The step's new slot is read from shared memory: it is not in the cache yet.
  const int new_slot = kStep ? (p.window > 0 ? p.pos[b] % p.window : p.pos[b]) : -1;

  // Group `group` visits slots s_begin + group + kGroups * round. kWide (small grids, where each
  // CTA's latency is the kernel's): the key and value rows of up to 4 rounds are loaded before any
  // is used, so their latencies overlap; otherwise one round at a time, fewer registers, more CTAs
  // per SM. The arithmetic is the same either way.
  constexpr int kRounds = (kSplit + kGroups - 1) / kGroups;
  constexpr int kBatch = !kWide ? 1 : kRounds < 4 ? kRounds : 4;
  Raw8<T> kr[kBatch], vr[kBatch];
  auto load_batch = [&](int round0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int s = s_begin + group + kGroups * (round0 + j);
      if (s < s_end && dims && s != new_slot) {
        load_raw8(k + row0 + s * slot_stride, kr[j]);
        load_raw8(v + row0 + s * slot_stride, vr[j]);
      } else {
        kr[j] = vr[j] = Raw8<T>{};
      }
    }
  };
  // Before the wait (cuda_common.cuh): the cache's other slots were written by earlier steps.
  load_batch(0);

  const T* q_row = q + b * p.q_b + h * p.D;
  T* k_s = nullptr;
  T* v_s = nullptr;
  if constexpr (kStep) {
    const int pos = p.pos[b], half = p.D / 2;
    float* cs = s_acc + kGroups * p.D;
    T* q_s = reinterpret_cast<T*>(cs + p.D);
    k_s = q_s + p.D;
    v_s = k_s + p.D;
    if (st.rope)
      for (int i = threadIdx.x; i < half; i += kThreads) {
        float sn, c;
        sincosf(static_cast<float>(pos) * freq.v[i], &sn, &c);
        cs[i] = c, cs[half + i] = sn;
      }
    cuda::dependent_wait();
    cuda::dependent_release();
    const T* k_new = static_cast<const T*>(st.k) + b * st.k_b + g * p.D;
    const T* v_new = static_cast<const T*>(st.v) + b * st.v_b + g * p.D;
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += kThreads) {
      const float q1 = cuda::to_float(q_row[i]), q2 = cuda::to_float(q_row[i + half]);
      const float k1 = cuda::to_float(k_new[i]), k2 = cuda::to_float(k_new[i + half]);
      const float2 qr = st.rope ? cuda::rope_rotate(q1, q2, cs[i], cs[half + i]) : make_float2(q1, q2);
      const float2 kr = st.rope ? cuda::rope_rotate(k1, k2, cs[i], cs[half + i]) : make_float2(k1, k2);
      q_s[i] = cuda::from_float<T>(qr.x), q_s[i + half] = cuda::from_float<T>(qr.y);
      k_s[i] = cuda::from_float<T>(kr.x), k_s[i + half] = cuda::from_float<T>(kr.y);
    }
    for (int i = threadIdx.x; i < p.D; i += kThreads) v_s[i] = v_new[i];
    __syncthreads();
    if (split == new_slot / kSplit && h % (p.H / p.Hk) == 0) {
      const int64_t at = (int64_t{b} * p.S + new_slot) * slot_stride + g * p.D;
      for (int i = threadIdx.x; i < p.D; i += kThreads) k[at + i] = k_s[i], v[at + i] = v_s[i];
    }
    q_row = q_s;
  } else {
    cuda::dependent_wait();
    cuda::dependent_release();
  }

  float qf[8] = {}, acc[8] = {};
  if (dims) load8(q_row + d0, qf);
  float m = -INFINITY, l = 0.f;
#pragma unroll
  for (int round0 = 0; round0 < kRounds; round0 += kBatch) {
    if (round0 > 0) load_batch(round0);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int s = s_begin + group + kGroups * (round0 + j);
      const bool valid = s < s_end;
      float kf[8], vf[8];
      if (kStep && valid && dims && s == new_slot) {
        load8(k_s + d0, kf);
        load8(v_s + d0, vf);
      } else {
        unpack8(kr[j], kf);
        unpack8(vr[j], vf);
      }
      // Every lane of the warp reaches the butterfly's shuffles.
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(qf[i], kf[i], dot);
      dot = cuda::lanes_sum<G>(dot);
      if (!valid) continue;
      const float score = dot * p.scale, m_new = fmaxf(m, score);
      const float alpha = expf(m - m_new), w = expf(score - m_new);
      l = l * alpha + w;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, vf[i], acc[i] * alpha);
      m = m_new;
    }
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
  float* rows = partial + int64_t{bh} * p.splits * (p.D + 2);
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    float a = 0.f;
    for (int g = 0; g < kGroups; ++g) a += expf(s_m[g] - m_all) * s_acc[g * p.D + d];
    if (splits == 1)
      o[b * p.o_b + h * p.D + d] = cuda::from_float<T>(a / l_all);
    else
      rows[split * (p.D + 2) + d] = a;
  }
  if (splits > 1 && threadIdx.x == 0) rows[split * (p.D + 2) + p.D] = m_all, rows[split * (p.D + 2) + p.D + 1] = l_all;
  if constexpr (kStep) {
    if (splits == 1) return;
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(st.done + bh, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    merge_blocks(rows, splits, p.D, o + b * p.o_b + h * p.D);
    if (threadIdx.x == 0) st.done[bh] = 0;
  }
}

// attention_decode's merge of the slot blocks of one (batch, head) (with one block decode_kernel wrote o).
template <class T>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const float* __restrict__ partial, T* __restrict__ o, const Args p) {
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int splits = (valid_slots(p, b) + kSplit - 1) / kSplit;
  if (splits == 1) return;
  merge_blocks(partial + int64_t{bh} * p.splits * (p.D + 2), splits, p.D, o + b * p.o_b + h * p.D);
}

// kStep: q is the new token's q, k and v the caches (StepArgs has the rest).
template <class T, int G, bool kStep>
void launch(const Ctx& ctx, const Args& a, const StepArgs& st, const cuda::RopeInvFreq& freq, int64_t BH,
            const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o) {
  constexpr int kGroups = kWarps * 32 / G;
  size_t smem = static_cast<size_t>(kGroups) * (a.D + 2) * sizeof(float);
  if (kStep) smem += a.D * sizeof(float) + 3 * a.D * sizeof(T);
  float* partial = static_cast<float*>(ctx.workspace);
  auto stream = cuda::stream_of(ctx);
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>(a.splits));
  // A grid of a few CTAs per SM (batch 1) keeps several rounds of loads in flight per thread; a
  // larger one hides latency with more resident CTAs instead.
  static const int64_t sms = gpu_sm_count();
  auto kernel = BH * a.splits <= 8 * sms ? decode_kernel<T, G, kStep, true> : decode_kernel<T, G, kStep, false>;
  cuda::launch_dependent(ctx, kernel, grid, dim3(kThreads), smem, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(),
                         partial, a, st, freq);
  if (kStep || a.splits == 1) return;
  combine_kernel<T><<<static_cast<unsigned>(BH), kThreads, 0, stream>>>(partial, o.data<T>(), a);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T, bool kStep>
void dispatch_group(const Ctx& ctx, const Args& a, const StepArgs& st, const cuda::RopeInvFreq& freq, int64_t BH,
                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o) {
  const int lanes = a.D / 8;
  if (lanes <= 1)
    launch<T, 1, kStep>(ctx, a, st, freq, BH, q, k, v, o);
  else if (lanes <= 2)
    launch<T, 2, kStep>(ctx, a, st, freq, BH, q, k, v, o);
  else if (lanes <= 4)
    launch<T, 4, kStep>(ctx, a, st, freq, BH, q, k, v, o);
  else if (lanes <= 8)
    launch<T, 8, kStep>(ctx, a, st, freq, BH, q, k, v, o);
  else if (lanes <= 16)
    launch<T, 16, kStep>(ctx, a, st, freq, BH, q, k, v, o);
  else
    launch<T, 32, kStep>(ctx, a, st, freq, BH, q, k, v, o);
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
  LINAC_GPU_DISPATCH(q.dtype, T,
                     (dispatch_group<T, false>(ctx, a, StepArgs{}, cuda::RopeInvFreq{}, L.B * L.H, q, k_cache, v_cache, o)));
}

void attention_decode_step_cuda(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& pos, const RopeFreqs& rope, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& o, const Tensor& done) {
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, "attention_decode_step (GPU): dtypes must agree");
  LINAC_CHECK(!rope.defined() || L.D <= kRopeMaxDim, "attention_decode_step (GPU): head dim too large for RoPE");
  LINAC_CHECK(done.dtype == DType::I32 && done.numel() >= L.B * L.H && done.device == Device::CUDA,
              "attention_decode_step (GPU): the block counters must be int32 [B, H] on the GPU");
  // The grid covers every slot a row may hold: all of them.
  Args a = decode_args(ctx, L, q, k_cache, v_cache, o, L.S);
  if (L.B * L.H == 0) return;
  a.pos = pos.data<int32_t>();
  a.window = static_cast<int>(L.window);
  const StepArgs st{k.ptr, v.ptr, L.k_b, L.v_b, rope.defined(), done.data<int32_t>()};
  const cuda::RopeInvFreq freq = rope.defined() ? cuda::rope_inv_freq_table(rope, L.D) : cuda::RopeInvFreq{};
  LINAC_GPU_DISPATCH(q.dtype, T, (dispatch_group<T, true>(ctx, a, st, freq, L.B * L.H, q, k_cache, v_cache, o)));
}

void attention_cache_write_cuda(const Ctx& ctx, const Tensor& x, const Tensor& cache, int64_t slot) {
  const int64_t B = x.size(0), n = x.size(1), S = cache.size(1);
  const size_t e = dtype_size(x.dtype), width = static_cast<size_t>(x.size(2) * x.size(3)) * e;
  if (B * n == 0 || width == 0) return;
  char* const dst = static_cast<char*>(cache.ptr);
  const char* const src = static_cast<const char*>(x.ptr);
  const size_t src_b = static_cast<size_t>(x.strides[0]) * e, src_t = static_cast<size_t>(x.strides[1]) * e,
               dst_b = static_cast<size_t>(S) * width;
  // A pitched 2-D copy on the stream; one row's pitch is never stepped over, but may not be below the width.
  auto copy = [&](char* to, size_t to_pitch, const char* from, size_t from_pitch, int64_t rows) {
    if (rows == 1) to_pitch = from_pitch = width;
    LINAC_CUDA_CHECK(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, width, static_cast<size_t>(rows),
                                       cudaMemcpyDeviceToDevice, cuda::stream_of(ctx)));
  };
  // Tokens [i, i + len) go to slots [s, s + len): one run, or two where they wrap around the ring.
  // A run is copied token by token (B rows each) or sequence by sequence (len tokens each),
  // whichever takes fewer copies: a prompt at batch 1 is one copy, not one per token.
  for (int64_t i = 0; i < n;) {
    const int64_t s = (slot + i) % S, len = std::min(n - i, S - s);
    if (len <= B) {
      for (int64_t j = 0; j < len; ++j)
        copy(dst + static_cast<size_t>(s + j) * width, dst_b, src + static_cast<size_t>(i + j) * src_t, src_b, B);
    } else {
      for (int64_t b = 0; b < B; ++b)
        copy(dst + static_cast<size_t>(b) * dst_b + static_cast<size_t>(s) * width, width,
             src + static_cast<size_t>(b) * src_b + static_cast<size_t>(i) * src_t, src_t, len);
    }
    i += len;
  }
}

}  // namespace linac
