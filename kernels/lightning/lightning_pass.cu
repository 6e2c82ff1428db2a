// CUDA Lightning Attention block pass (math in lightning.h, contract in lightning_common.cuh):
//   out[i] = sum_j M(i,j) (X_i . Y_j) Z_j + r[i] (X_i St_n)        for the rows i of block n
// The forward runs it once (o), the backward three times (dq, dk, dv), see lightning.cu.
// Layout: X, Y [B, T, H, Dx], Z, out [B, T, H, Dz] (free batch/token strides); states
// [B*H, N, Dk, Dv] in T, read as [Dx][Dz] or (state_t) [Dz][Dx].
// Grid (N, B*H), 128 threads: warp w owns the 16 rows 16w.. of the block. The CTA makes the
// 64-wide slices of out one after another. For the first, per 64-wide slice of Dx it accumulates
// the scores X Y^T and X St on tensor cores (f32 accumulators) while the next slice's X, Y and
// state tiles load into the other of two shared-memory sets (cp.async); the last slice's spare set
// takes Z, then P. The scores are masked with the decay in registers, rounded to T into shared
// memory and multiplied by Z, visiting only the 16-token groups on the causal side of the diagonal
// (the decay factors from two 64-entry tables the CTA fills first). Later slices of out (Dz = 128)
// load only X, St and Z and reuse P: one CTA per slice would compute the scores once per slice.
// In bf16, 6 tiles and the tables (55.8 KB) and at most 128 registers keep four CTAs on an SM
// (f32, for tests, fits two).
// Documents (lightning.h; the kDocs instantiations): the same mask also zeroes the scores of pairs
// of two documents, and r[i] of rows outside the state's document. Each thread reads the bounds
// of its two rows: lower, columns j >= st(t0 + i) - t0 and the state term when st(t0 + i) <
// max(t0, 1); upper, columns j < en(t0 + i) - t0 and the state term when en(t0 + i) > t0 + m - 1.
// With `pre` (the dq and dk passes under a SiLU feature map, lightning.h) each output is rounded to
// T and multiplied by silu'(pre) before it is stored: what silu_bwd would make of the stored dq or
// dk, without their round trip through memory. The pre tile arrives by cp.async in the tile set the
// slice leaves free, while the scores are masked and multiplied: read from global memory in the
// store loop, its latency stalled the epilogue (the fused step ran 1% slower than the separate pass).
#include <type_traits>

#include "activation/sigmoid.cuh"
#include "lightning/lightning_common.cuh"

namespace linac {
namespace lightning_cuda {
namespace {

using sm80::ld_of;
using sm80::tile_bytes;

template <class T>
struct PassCfg {
  // Two sets of X, Y, St tiles; Z and P take the set the last slice leaves free.
  static constexpr int LD = ld_of<T>(kW), kTile = tile_bytes<T>(kC, kW);
  // After the tiles, the block's decay factors: exp(-s d) for the distances d < 64 and r[i].
  static constexpr int kTables = 2 * kC * sizeof(float), kSmem = 6 * kTile + kTables;
};

template <class T, bool kUpper, bool kStateT, bool kDocs, bool kSilu>
__global__ void __launch_bounds__(128, sizeof(T) == 2 ? 4 : 2)
    pass_kernel(int Dx, int Dz, const T* __restrict__ x, LightningLayout::Strides xs, const T* __restrict__ y,
                LightningLayout::Strides ys, const T* __restrict__ z, LightningLayout::Strides zs,
                const T* __restrict__ states, T* __restrict__ out, LightningLayout::Strides os,
                const T* __restrict__ pre, LightningLayout::Strides ps, Args a) {
  using C = PassCfg<T>;
  constexpr int LD = C::LD;
  extern __shared__ __align__(16) unsigned char smem[];
  // Tile `which` (0: X or Z, 1: Y or P, 2: St) of set i.
  auto tile = [&](int i, int which) { return reinterpret_cast<T*>(smem + (3 * i + which) * C::kTile); };
  const int n = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
  const int64_t t0 = static_cast<int64_t>(n) * kC;
  const int m = min(kC, a.T - n * kC), warp = threadIdx.x >> 5, m0 = 16 * warp;
  const float s = a.decay[h];
  const T* state = states + (static_cast<int64_t>(bh) * a.N + n) * a.Dk * a.Dv;
  const sm80::Frag f;
  // The epilogue's decay factors, one exp per thread instead of two per score element (the
  // exps cost about what the block's matmuls do); the slice loop's barriers publish them.
  float* dist_decay = reinterpret_cast<float*>(smem + 6 * C::kTile);  // [d] = exp(-s d)
  float* row_decay = dist_decay + kC;                                 // [i] = r[i]
  {
    const int i = threadIdx.x & (kC - 1);
    if (threadIdx.x < kC)
      dist_decay[i] = __expf(-s * static_cast<float>(i));
    else
      row_decay[i] =
          kUpper ? (i < m ? __expf(-s * static_cast<float>(m - 1 - i)) : 0.f) : __expf(-s * static_cast<float>(i + 1));
  }

  // Lower mask: this warp's rows see keys 0 .. 16w+15 only.
  const int score_tiles = kUpper ? 8 : 2 * (warp + 1);
  const int ns = cdiv(Dx, kW);
  T* P = tile(ns & 1, 1);  // the masked scores, once the first slice of out has made them
  // The 64-wide slices of out one after another: the first makes the scores (and P) along with its
  // state term, the others only their state terms. Each slice's loop pipelines over Dx as above.
  auto out_slice = [&](auto with_scores, int z0) {
    constexpr bool scores = decltype(with_scores)::value;
    const int vz = min(kW, Dz - z0);
    float sc[8][4], acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = acc[nt][e] = 0.f;
    auto load_slice = [&](int d0, T* Xs, T* Ys, T* Sts) {
      const int vd = min(kW, Dx - d0);
      sm80::load_tile<T, kC, kW, 128>(Xs, LD, x + b * xs.b + t0 * xs.t + h * Dx + d0, xs.t, m, vd);
      if constexpr (scores)
        sm80::load_tile<T, kC, kW, 128>(Ys, LD, y + b * ys.b + t0 * ys.t + h * Dx + d0, ys.t, m, vd);
      if constexpr (kStateT)
        sm80::load_tile<T, kW, kW, 128>(Sts, LD, state + static_cast<int64_t>(z0) * Dx + d0, Dx, vz, vd);
      else
        sm80::load_tile<T, kW, kW, 128>(Sts, LD, state + static_cast<int64_t>(d0) * Dz + z0, Dz, vd, vz);
    };
    // Slice sl + 1 loads while slice sl multiplies; the last iteration loads Z into the free set.
    load_slice(0, tile(0, 0), tile(0, 1), tile(0, 2));
    sm80::cp_async_commit();
    for (int sl = 0; sl < ns; ++sl) {
      const int nb = (sl + 1) & 1;
      if (sl + 1 < ns)
        load_slice((sl + 1) * kW, tile(nb, 0), tile(nb, 1), tile(nb, 2));
      else
        sm80::load_tile<T, kC, kW, 128>(tile(nb, 0), LD, z + b * zs.b + t0 * zs.t + h * Dz + z0, zs.t, m, vz);
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();
      __syncthreads();
      const int ks = cdiv(min(kW, Dx - sl * kW), 16);
      if constexpr (scores)
        sm80::warp_mma<T, false, false, 8>(sc, tile(sl & 1, 0), LD, m0, 0, tile(sl & 1, 1), LD, 0, 0, ks, score_tiles);
      sm80::warp_mma<T, false, !kStateT, 8>(acc, tile(sl & 1, 0), LD, m0, 0, tile(sl & 1, 2), LD, 0, 0, ks);
      __syncthreads();  // the next iteration loads into the other set
    }
    // The SiLU pre-activations of the outputs load into the set left free (Z and P take the other)
    // while the scores are masked and multiplied by Z.
    T* pre_tile = tile((ns + 1) & 1, 0);
    if constexpr (kSilu) {
      sm80::load_tile<T, kC, kW, 128>(pre_tile, LD, pre + b * ps.b + t0 * ps.t + h * Dz + z0, ps.t, m, vz);
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();
    } else {
      sm80::cp_async_wait<0>();
    }
    __syncthreads();
    T* Z = tile(ns & 1, 0);
    // Documents, per row of this thread (hf): the first (lower) or one past the last (upper) column.
    [[maybe_unused]] int bound[2] = {0, 0};
    [[maybe_unused]] bool carry[2] = {true, true};
    if constexpr (kDocs) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = min(f.row(m0, 2 * hf), m - 1);  // rows past m are never stored
        const int64_t bt = static_cast<int64_t>(b) * a.T + t0 + i;
        const int64_t edge = kUpper ? a.doc_end[bt] : a.doc_start[bt];
        bound[hf] = static_cast<int>(edge - t0);
        carry[hf] = kUpper ? edge >= t0 + m : edge < max(t0, int64_t{1});
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = f.row(m0, e), j = f.col(0, nt, e);
        float r = row_decay[i];
        if constexpr (kDocs)
          if (!carry[e >> 1]) r = 0.f;
        acc[nt][e] *= r;
        if constexpr (!scores) continue;
        const int dist = kUpper ? j - i : i - j;
        bool pair = dist >= 0;
        if constexpr (kDocs) pair = pair && (kUpper ? j < bound[e >> 1] : j >= bound[e >> 1]);
        sc[nt][e] = pair ? sc[nt][e] * dist_decay[pair ? dist : 0] : 0.f;
      }
    if constexpr (scores) {
      // The later slices' loops load no Y, so P (the Y tile of the set they leave last) stays.
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          sm80::store2(P + f.row(m0, 2 * hf) * LD + f.col(0, nt, 0), sc[nt][2 * hf], sc[nt][2 * hf + 1]);
      __syncwarp();  // each warp reads back only its own 16 rows of P
    }
    // Causal side of the diagonal: keys 0 .. 16w+15 (lower) or 16w .. 63 (upper).
    const int k0 = kUpper ? m0 : 0, ksteps = kUpper ? 4 - warp : warp + 1;
    sm80::warp_mma<T, false, true, 8>(acc, P, LD, m0, k0, Z, LD, k0, 0, ksteps);
    T* ob = out + b * os.b + t0 * os.t + h * Dz + z0;
    if constexpr (kSilu) {
      sm80::cp_async_wait<0>();
      __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = f.row(m0, 2 * hf), c = f.col(0, nt, 0);
        if (i >= m || c >= vz) continue;
        float o0 = acc[nt][2 * hf], o1 = acc[nt][2 * hf + 1];
        if constexpr (kSilu) {
          const float2 p = sm80::load2f(pre_tile + i * LD + c);
          o0 = cuda::rounded<T>(o0) * cuda::silu_grad(p.x);
          o1 = cuda::rounded<T>(o1) * cuda::silu_grad(p.y);
        }
        sm80::store2(ob + i * os.t + c, o0, o1);
      }
  };
  out_slice(std::true_type{}, 0);
  for (int z0 = kW; z0 < Dz; z0 += kW) {
    __syncthreads();  // every warp has read Z before the next slice loads over it
    out_slice(std::false_type{}, z0);
  }
}

template <class T, bool kUpper, bool kStateT, bool kDocs, bool kSilu>
void launch(const Ctx& ctx, const Args& a, int B, int Dx, int Dz, const T* x, LightningLayout::Strides xs, const T* y,
            LightningLayout::Strides ys, const T* z, LightningLayout::Strides zs, const T* states, T* out,
            LightningLayout::Strides os, const T* pre, LightningLayout::Strides ps) {
  auto kernel = pass_kernel<T, kUpper, kStateT, kDocs, kSilu>;
  constexpr int smem = PassCfg<T>::kSmem;
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(B * a.H));
  kernel<<<grid, 128, smem, cuda::stream_of(ctx)>>>(Dx, Dz, x, xs, y, ys, z, zs, states, out, os, pre, ps, a);
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void launch_pass(const Ctx& ctx, const Args& a, int B, bool upper, bool state_t, int Dx, int Dz, const T* x,
                 LightningLayout::Strides xs, const T* y, LightningLayout::Strides ys, const T* z,
                 LightningLayout::Strides zs, const T* states, T* out, LightningLayout::Strides os, const T* pre,
                 LightningLayout::Strides ps) {
  // Only the dq and dk passes (the transposed states) ever take the SiLU derivative.
  LINAC_CHECK(!pre || state_t, "lightning (GPU): the SiLU derivative is for the dq and dk passes");
  auto pick = [&](auto docs) {
    constexpr bool kDocs = decltype(docs)::value;
    if (state_t)
      return upper ? (pre ? launch<T, true, true, kDocs, true> : launch<T, true, true, kDocs, false>)
                   : (pre ? launch<T, false, true, kDocs, true> : launch<T, false, true, kDocs, false>);
    return upper ? launch<T, true, false, kDocs, false> : launch<T, false, false, kDocs, false>;
  };
  auto fn = a.doc_start ? pick(std::true_type{}) : pick(std::false_type{});
  fn(ctx, a, B, Dx, Dz, x, xs, y, ys, z, zs, states, out, os, pre, ps);
}

template void launch_pass<float>(const Ctx&, const Args&, int, bool, bool, int, int, const float*,
                                 LightningLayout::Strides, const float*, LightningLayout::Strides, const float*,
                                 LightningLayout::Strides, const float*, float*, LightningLayout::Strides,
                                 const float*, LightningLayout::Strides);
template void launch_pass<bf16_t>(const Ctx&, const Args&, int, bool, bool, int, int, const bf16_t*,
                                  LightningLayout::Strides, const bf16_t*, LightningLayout::Strides, const bf16_t*,
                                  LightningLayout::Strides, const bf16_t*, bf16_t*, LightningLayout::Strides,
                                  const bf16_t*, LightningLayout::Strides);

}  // namespace lightning_cuda
}  // namespace linac
