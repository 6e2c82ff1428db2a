// CUDA attention forward (math in attention.h), FlashAttention-2 style: the kernels of GPUs other
// than Hopper, of head dims 80/96/112 and of f32; bf16 at D = 64/128 on a Hopper GPU goes to
// attention_fwd_sm90.cu instead (attention_gpu_kernels).
//
// bf16: one CTA per (batch, head, block of BR = 128 queries), 8 warps of 16 query rows each; the
// grid's x is the query head's index in its group, y batch * Hk + key/value head, z the query
// block, so a group's query heads run side by side on the same K/V tiles (shared through L2) and
// no CTA divides by the group size (at D = 64, capped at 128 registers, that division cost a
// spill). Q stays in registers as mma A fragments; K/V tiles of BC keys stream through shared
// memory with cp.async double buffering. Per tile: S = Q K^T (mma), online softmax in f32 on the
// accumulators (running max m, running sum l; exp2 with the scale folded in), then O += P V with
// P reused from the S accumulators as bf16 A fragments. Only lse = m * scale + log l is saved.
// Key blocks that the causal/window/document mask empties are never visited (with documents a
// query block starts at its first query's document); the mask itself is applied only on tiles
// that straddle its edge, a document start or the key tail.
// Layout: q/o [B,T,H,D] and k/v [B,T,Hk,D] with free batch/token strides, lse [B,H,T] f32.
#include "attention/attention_common.cuh"

namespace linac {
namespace attn {
namespace {

template <int D>
struct FwdCfg {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int BR = 16 * kWarps;  // queries per CTA
  static constexpr int BC = 64;           // keys per tile
  static constexpr int kMinBlocks = D == 64 ? 2 : 1;
  static constexpr size_t kSmem = static_cast<size_t>(BR + 4 * BC) * kRowBytes<D>;
};

// kBand: per-warp group skipping (group_visible); kDocs (with kBand): document bounds.
template <int D, bool kBand, bool kDocs>
__global__ void __launch_bounds__(FwdCfg<D>::kThreads, FwdCfg<D>::kMinBlocks)
    fwd_bf16_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                    bf16_t* __restrict__ o, float* __restrict__ lse, const Args a) {
  using C = FwdCfg<D>;
  constexpr int BR = C::BR, BC = C::BC, NT = C::kThreads;
  constexpr uint32_t kTile = BC * kRowBytes<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sK0 = sQ + BR * kRowBytes<D>, sV0 = sK0 + 2 * kTile;

  const int bhk = blockIdx.y, b = bhk / a.Hk, hk = bhk % a.Hk;
  const int h = hk * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
  const int q0 = (cdiv(a.T, BR) - 1 - static_cast<int>(blockIdx.z)) * BR;  // longest causal rows first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int2 kr = key_blocks<kDocs>(a, b, q0, BR, BC);
  const bf16_t* k_head = head_rows<D>(k, a.k, b, hk);
  const bf16_t* v_head = head_rows<D>(v, a.v, b, hk);
  auto load_kv = [&](int kb, int buf) {
    load_kv_block<BC, D, NT>(a, sK0 + buf * kTile, sV0 + buf * kTile, k_head, v_head, kb);
  };

  load_rows<BR, D, NT>(sQ, head_rows<D>(q, a.q, b, h), a.q.t, q0, a.T);
  load_kv(kr.x, 0);
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[D / 16][4];
  lds_a_rows<D>(sQ, warp * 16, qf);

  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
  // Documents: the starts of this thread's rows. Per tile the warp takes those of its first row
  // (for its groups) and of its last (a tile with keys before it needs the mask) from lanes 0 and
  // 28 rather than keeping them in registers.
  int doc_row[2];
  if constexpr (kDocs) {
    doc_row[0] = doc_start_of(a, b, row0);
    doc_row[1] = doc_start_of(a, b, row0 + 8);
  }

  for (int kb = kr.x; kb <= kr.y; ++kb) {
    const int k0 = kb * BC, buf = double_buffer_step(kb, kr.x, kr.y, load_kv);
    const uint32_t sK = sK0 + buf * kTile, sV = sV0 + buf * kTile;

    const unsigned vis =  // bit np: key group np is visible to this warp's rows
        kBand ? key_groups_visible<BC / 16, kDocs>(a, q0 + warp * 16, k0, kDocs ? doc_row[0] : 0) : ~0u;
    float s[BC / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        if (!(vis >> np & 1u)) continue;
        uint32_t bf[4];
        lds_b_nk<D>(sK, np * 16, kk, bf);
        mma_bf16(s[2 * np], qf[kk], bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], qf[kk], bf[2], bf[3]);
      }

    bool masked = k0 + BC > a.T || tile_needs_mask(a, q0, BR, k0, BC);
    if constexpr (kDocs) masked |= __shfl_sync(0xffffffffu, doc_row[1], 28) > k0;
    if (masked) {
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = row0 + 8 * (e >> 1), sk = k0 + 8 * nt + 2 * tq + (e & 1);
          if (sk >= a.T || !allowed(a, t, sk)) s[nt][e] = -INFINITY;
          if constexpr (kDocs)
            if (sk < doc_row[e >> 1]) s[nt][e] = -INFINITY;
        }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row whose keys so far are all masked keeps m = -inf; exp2 against 0 then gives P = 0.
      const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
      const float alpha = fast_exp2(m[r] * a.scale_log2 - base);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt) {
        s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], a.scale_log2, -base));
        s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], a.scale_log2, -base));
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        acc[dt][2 * r] *= alpha;
        acc[dt][2 * r + 1] *= alpha;
      }
    }

    mma_rows_times_tile<D, BC>(acc, s, vis, sV);  // O += P V
  }

  bf16_t* ob = o + b * a.o.b + h * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int t = row0 + 8 * r;
    if (t >= a.T) continue;
    const float inv = 1.f / sum;
    bf16_t* orow = ob + int64_t{t} * a.o.t + 2 * tq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8) = pack_bf16(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
    if (tq == 0) lse[(int64_t{b} * a.H + h) * a.T + t] = m[r] * a.scale + logf(sum);
  }
}

template <int D>
void launch_fwd_bf16(const Ctx& ctx, const Args& a, int B, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& o, const Tensor& lse) {
  using C = FwdCfg<D>;
  // Windowed attention and documents skip the key groups outside each warp's band
  // (group_visible); the other masks keep the kernel without that bookkeeping, which would cost
  // D = 64 a register spill.
  auto kernel = a.doc_start   ? fwd_bf16_kernel<D, true, true>
                : a.window > 0 ? fwd_bf16_kernel<D, true, false>
                               : fwd_bf16_kernel<D, false, false>;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  LINAC_CHECK(int64_t{B} * a.Hk <= 65535, "attention (GPU): batch * key/value heads must not exceed 65535");
  const dim3 grid(static_cast<unsigned>(a.H / a.Hk), static_cast<unsigned>(B * a.Hk),
                  static_cast<unsigned>(cdiv(a.T, C::BR)));
  kernel<<<grid, C::kThreads, C::kSmem, cuda::stream_of(ctx)>>>(q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(),
                                                                o.data<bf16_t>(), lse.data<float>(), a);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace attn

void attention_fwd_cuda(const Ctx& ctx, const AttentionLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& o, const Tensor& lse) {
  LINAC_CHECK(attention_gpu_head_dim_ok(L.D),
              "attention (GPU): head dim must be a multiple of 16 from 64 to 128, got " + std::to_string(L.D));
  LINAC_CHECK(lse.dtype == DType::F32, "attention (GPU): lse must be f32");
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype, "attention (GPU): dtypes must agree");
  if (L.B * L.T * L.H == 0) return;
  const attn::Args a = attn::make_args(L);
  const int B = static_cast<int>(L.B), D = static_cast<int>(L.D);
  if (q.dtype == DType::F32) {
    attn::fwd_f32(ctx, a, B, D, q.data<float>(), k.data<float>(), v.data<float>(), o.data<float>(), lse.data<float>());
    return;
  }
  LINAC_CHECK(q.dtype == DType::BF16, "attention (GPU): activations must be bf16 or f32");
  attn::check_bf16_rows(q, L.q, "q");
  attn::check_bf16_rows(k, L.k, "k");
  attn::check_bf16_rows(v, L.v, "v");
  attn::check_bf16_rows(o, L.o, "o");
#if LINAC_WITH_SM90A
  if (attn::use_sm90(L)) return attn::fwd_sm90(ctx, a, L, q, k, v, o, lse);
#endif
  attn::with_head_dim(D, [&](auto d) { attn::launch_fwd_bf16<decltype(d)::value>(ctx, a, B, q, k, v, o, lse); });
}

}  // namespace linac
