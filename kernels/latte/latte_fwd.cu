// CUDA Latte forward (math in latte.h), per group of sequences that fits ctx.workspace:
//   lse scan (chunk-local, carries) -> chunk terms (final lse, U) -> state scan (S, mu_final) ->
//   output: per chunk, y_t = pi_0 local_t + sum_l pi_{t,l} dec_{t,l} mu_prev_l + sum_{s<=t} A_{t,s} v_s,
//   A_{t,s} = sum_l pi_{t,l} exp(b_{s,l} - lse_{t,l}), dec_{t,l} = exp(lse_{f-1,l} - lse_{t,l}).
// On tensor cores: A = Qt Kt^T (or formed directly, latte_common.cuh), y = A V + (pi * dec) mu_prev.
// Documents: A masked to s >= the first row of t's document, dec = 0 for rows whose document starts
// in the chunk (latte_common.cuh).
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

// Shared memory of the output kernel: f32 lse, b [64][L] and pi [64][La]; tiles of T: V [64][Dp],
// mu_prev [Lp][Dp], Qt, Kt, pi * dec [64][Lp], A [64][64].
template <class T>
struct OutputSmem {
  float *lam, *bq, *pi;
  T *V, *mu, *Qt, *Kt, *PD, *At;
  int* sd;
  size_t bytes;
  __host__ __device__ OutputSmem(unsigned char* base, const Args& a) {
    SmemCarve c{base};
    lam = c.take<float>(kC * a.L), bq = c.take<float>(kC * a.L), pi = c.take<float>(kC * a.La);
    V = c.take<T>(kC * ld_of<T>(a.Dp)), mu = c.take<T>(a.Lp * ld_of<T>(a.Dp));
    Qt = c.take<T>(kC * ld_of<T>(a.Lp)), Kt = c.take<T>(kC * ld_of<T>(a.Lp)), PD = c.take<T>(kC * ld_of<T>(a.Lp));
    At = c.take<T>(kC * ld_of<T>(kC)), sd = c.take<int>(doc_ints(a));
    bytes = c.bytes;
  }
};

template <class T, bool kDocs>
__global__ void __launch_bounds__(kThreads) output_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as,
                                                         const T* __restrict__ b, LatteLayout::Strides bs,
                                                         const T* __restrict__ v, LatteLayout::Strides vs,
                                                         const T* __restrict__ local, LatteLayout::Strides ls,
                                                         const float* __restrict__ lse, const float* __restrict__ S,
                                                         T* __restrict__ y, LatteLayout::Strides ys) {
  extern __shared__ __align__(16) unsigned char smem[];
  const OutputSmem<T> sm(smem, a);
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  const int ldd = ld_of<T>(a.Dp), ldl = ld_of<T>(a.Lp), ldc = ld_of<T>(kC);
  // One RowBatch at a time: each is one memory round trip, and several in flight at once would
  // cost the registers that keep three CTAs on an SM (measured slower).
  store_lse_rows(lse, a, bb, h, f, rows, sm.lam);
  store_head_rows<kMaxL>(b, bs, bb, h, f, rows, a.L, sm.bq);
  store_head_rows<kMaxL + 1>(av, as, bb, h, f, rows, a.La, sm.pi);
  rows_of<kMaxDv>(v, vs, bb, h, f, rows, a.Dv, a.Dp).store_rows(sm.V, ldd);
  store_state(state_of(S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd, a), sm.mu, ldd, a, 1);
  const ChunkDocs<kDocs> dc = load_docs<kDocs>(a, bb, f, rows, sm.sd);
  __syncthreads();
  softmax_rows(sm.pi, rows, a.La);
  __syncthreads();
  const bool direct = factor_tiles(a, rows, sm.lam, sm.bq, sm.pi, dc, sm.Qt, sm.Kt);
  const float* lam_prev = lse + ((static_cast<int64_t>(bb) * a.T + f - 1) * a.H + h) * a.L;  // valid for n > 0
  for_rows(kC, a.Lp, [&](int t, int l) {
    const bool ok = n > 0 && t < rows && l < a.L && dc.carried(t);
    sm.PD[t * ldl + l] =
        cuda::from_float<T>(ok ? sm.pi[t * a.La + a.off + l] * expf(lam_prev[l] - sm.lam[t * a.L + l]) : 0.f);
  });
  __syncthreads();
  form_A(a, rows, direct, sm.Qt, sm.Kt, sm.lam, sm.bq, sm.pi, dc, sm.At);
  __syncthreads();
  T* yc = y + bb * ys.b + static_cast<int64_t>(f) * ys.t + static_cast<int64_t>(h) * a.Dv;
  const T* lc = a.off ? local + bb * ls.b + static_cast<int64_t>(f) * ls.t + static_cast<int64_t>(h) * a.Dv : nullptr;
  const bool vy = vec_pairs(yc, ys.t), vl = a.off && vec_pairs(lc, ls.t);
  for_tiles<2>(kC, a.Dp, [&](int m0, int n0, int ntv) {
    float acc[2][4] = {};
    warp_mma<T, false, true, 2>(acc, sm.At, ldc, m0, 0, sm.V, ldd, 0, n0, m0 / 16 + 1, ntv);
    if (n > 0) warp_mma<T, false, true, 2>(acc, sm.PD, ldl, m0, 0, sm.mu, ldd, 0, n0, a.Lp / 16, ntv);
    each_acc_pair(acc, m0, n0, ntv, [&](int t, int j, float x0, float x1) {  // Dv % 4 == 0: j < Dv has j + 1
      if (t >= rows || j >= a.Dv) return;
      if (a.off) {
        const T* lp = lc + t * static_cast<int>(ls.t) + j;
        const float2 l2 = vl ? sm80::load2f(lp) : make_float2(cuda::to_float(lp[0]), cuda::to_float(lp[1]));
        const float p0 = sm.pi[t * a.La];
        x0 = fmaf(p0, l2.x, x0), x1 = fmaf(p0, l2.y, x1);
      }
      store_pair(yc + t * static_cast<int>(ys.t) + j, x0, x1, vy);
    });
  });
}

}  // namespace
}  // namespace latte_cuda

void latte_fwd_cuda(const Ctx& ctx, const LatteLayout& L, const Tensor& a, const Tensor& b, const Tensor& v,
                    const Tensor& local, const Tensor& y, const Tensor& lse, const Tensor& mu_final) {
  using namespace latte_cuda;
  for (const Tensor* t : {&b, &v, &local, &y})
    LINAC_CHECK(!t->defined() || t->dtype == a.dtype, "latte (GPU): activation dtypes must agree");
  if (L.B * L.T * L.H == 0) return;
  const Args a0 = make_args(L);
  const int per = group_size(ctx, L);
  const int64_t lse_seq = L.T * L.H * L.L, mu_seq = L.H * L.L * L.Dv;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Args ar = group_args(a0, L, b0);
    Workspace w = carve(ctx, ar, B);
    use_saved_states(w, L, ar, b0);
    float* lsep = lse.data<float>() + b0 * lse_seq;
    float* mufp = mu_final.defined() ? mu_final.data<float>() + b0 * mu_seq : nullptr;
    LINAC_GPU_DISPATCH(a.dtype, T, {
      const T* ap = at_batch(a.data<T>(), b0, L.a.b);
      const T* bp = at_batch(b.data<T>(), b0, L.b.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      const T* lp = L.local ? at_batch(local.data<T>(), b0, L.local_s.b) : nullptr;
      launch_lse_scan<T>(ctx, ar, B, bp, L.b, lsep, w.carry);
      launch_chunk_terms<T>(ctx, ar, B, bp, L.b, vp, L.v, lsep, true, w.carry, w.U);
      launch_state_scan(ctx, ar, B, false, ar.Dv, w.carry, w.U, w.S, mufp);
      const size_t smem = OutputSmem<T>(nullptr, ar).bytes;
      with_docs(ar, [&](auto docs) {
        constexpr bool kD = decltype(docs)::value;
        LINAC_CUDA_CHECK(cudaFuncSetAttribute(output_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
        output_kernel<T, kD><<<dim3(ar.N, B * ar.H), kThreads, smem, cuda::stream_of(ctx)>>>(
            ar, ap, L.a, bp, L.b, vp, L.v, lp, L.local_s, lsep, w.S, at_batch(y.data<T>(), b0, L.y.b), L.y);
        LINAC_CUDA_LAUNCH_CHECK();
      });
    });
  }
}

}  // namespace linac
