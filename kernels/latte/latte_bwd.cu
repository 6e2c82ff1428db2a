// CUDA Latte backward (math in latte.h, spec §5.2), per group of sequences that fits ctx.workspace:
//   chunk terms + state scan again -> S[n] = mu at each chunk start
//   grad_p  per chunk: gP_{t,l} = dec_{t,l} (gy_t . mu_prev_l) + sum_{s<=t} exp(b_{s,l} - lse_{t,l}) (gy_t . v_s),
//           gP_{t,0} = gy_t . local_t; da (softmax backward), dlocal = pi_0 gy; the reverse terms
//           U[n] = sum_t exp(lse_{f-1} - lse_t) pi_{t,l} [gy_t | gP_{t,l}] (the extra column is r's)
//   reverse state scan -> S[n] = [R | r] at each chunk's end
//   grad_bv per chunk, with E_{s,l} = exp(b_{s,l} - lse_{e,l}) and P = exp(b_{s,l} - lse_{t,l}):
//           dv_s = sum_l E_{s,l} R_l + sum_{t>=s} A_{t,s} gy_t
//           db_{s,l} = E_{s,l} (v_s . R_l - r_l) + sum_{t>=s} pi_{t,l} P (gy_t . v_s - gP_{t,l})
// Every exponent is <= 0. Shared memory is f32; the carve of each kernel is listed at its smem().
#include "latte/latte_common.cuh"

namespace linac {
namespace latte_cuda {
namespace {

constexpr int kThreads = 256;

// lse [C][L], b (then the reverse coefficients) [C][L], pi [C][La], V [C][Dv], gy [C][Dv],
// mu_prev [L][Dv], M = gy v^T [C][C], gP [C][La].
size_t grad_p_smem(const Args& a) {
  return sizeof(float) * (2 * kC * a.L + 2 * kC * a.La + 2 * kC * a.Dv + a.L * a.Dv + kC * kC);
}

template <class T>
__global__ void __launch_bounds__(kThreads) grad_p_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as,
                                                         const T* __restrict__ b, LatteLayout::Strides bs,
                                                         const T* __restrict__ v, LatteLayout::Strides vs,
                                                         const T* __restrict__ local, LatteLayout::Strides ls,
                                                         const float* __restrict__ lse, const T* __restrict__ dy,
                                                         LatteLayout::Strides dys, const float* __restrict__ S,
                                                         float* __restrict__ gP, float* __restrict__ U,
                                                         T* __restrict__ da, LatteLayout::Strides das,
                                                         T* __restrict__ dlocal, LatteLayout::Strides dls) {
  extern __shared__ float sm[];
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  float* lam = sm;
  float* bq = lam + kC * a.L;
  float* pi = bq + kC * a.L;
  float* gPs = pi + kC * a.La;
  float* V = gPs + kC * a.La;
  float* GY = V + kC * a.Dv;
  float* mu = GY + kC * a.Dv;
  float* M = mu + a.L * a.Dv;
  load_lse(lam, lse, a, bb, h, f, rows);
  load_rows(bq, b, bs, bb, h, f, rows, a.L);
  load_rows(pi, av, as, bb, h, f, rows, a.La);
  load_rows(V, v, vs, bb, h, f, rows, a.Dv);
  load_rows(GY, dy, dys, bb, h, f, rows, a.Dv);
  const float* Sn = S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for (int i = threadIdx.x; i < a.L * a.Dv; i += blockDim.x) mu[i] = Sn[(i / a.Dv) * a.Wd + i % a.Dv];
  __syncthreads();
  softmax_rows(pi, rows, a.La);
  for (int i = threadIdx.x; i < rows * kC; i += blockDim.x) {
    const int t = i / kC, s = i % kC;
    float acc = 0.f;
    if (s <= t)
      for (int j = 0; j < a.Dv; ++j) acc = fmaf(GY[t * a.Dv + j], V[s * a.Dv + j], acc);
    M[i] = acc;
  }
  __syncthreads();
  const float* lam_prev = lse + ((static_cast<int64_t>(bb) * a.T + f - 1) * a.H + h) * a.L;  // valid for n > 0
  for (int i = threadIdx.x; i < rows * a.La; i += blockDim.x) {
    const int t = i / a.La, c = i % a.La;
    float acc = 0.f;
    if (c < a.off) {
      const T* lt = local + bb * ls.b + static_cast<int64_t>(f + t) * ls.t + static_cast<int64_t>(h) * a.Dv;
      for (int j = 0; j < a.Dv; ++j) acc = fmaf(GY[t * a.Dv + j], cuda::to_float(lt[j]), acc);
    } else {
      const int l = c - a.off;
      if (n > 0) {
        for (int j = 0; j < a.Dv; ++j) acc = fmaf(GY[t * a.Dv + j], mu[l * a.Dv + j], acc);
        acc *= expf(lam_prev[l] - lam[t * a.L + l]);
      }
      for (int s = 0; s <= t; ++s) acc = fmaf(expf(bq[s * a.L + l] - lam[t * a.L + l]), M[t * kC + s], acc);
    }
    gPs[i] = acc;
  }
  __syncthreads();
  float* gPg = gP + (static_cast<int64_t>(bh) * a.T + f) * a.La;
  for (int t = threadIdx.x; t < rows; t += blockDim.x) {
    const float* p = pi + t * a.La;
    const float* g = gPs + t * a.La;
    float dot = 0.f;
    for (int c = 0; c < a.La; ++c) dot = fmaf(p[c], g[c], dot);
    T* dat = da + bb * das.b + static_cast<int64_t>(f + t) * das.t + static_cast<int64_t>(h) * a.La;
    for (int c = 0; c < a.La; ++c) {
      dat[c] = cuda::from_float<T>(p[c] * (g[c] - dot));
      gPg[t * a.La + c] = g[c];
    }
  }
  if (a.off)
    for (int i = threadIdx.x; i < rows * a.Dv; i += blockDim.x) {
      const int t = i / a.Dv, j = i % a.Dv;
      dlocal[bb * dls.b + static_cast<int64_t>(f + t) * dls.t + static_cast<int64_t>(h) * a.Dv + j] =
          cuda::from_float<T>(pi[t * a.La] * GY[i]);
    }
  if (n == 0) return;  // the reverse scan never reads chunk 0's terms
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
    const int t = i / a.L, l = i % a.L;
    bq[i] = expf(lam_prev[l] - lam[i]) * pi[t * a.La + a.off + l];
  }
  __syncthreads();
  float* Un = U + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for (int i = threadIdx.x; i < a.L * a.Wd; i += blockDim.x) {
    const int l = i / a.Wd, j = i % a.Wd;
    float acc = 0.f;
    if (j < a.Dv)
      for (int t = 0; t < rows; ++t) acc = fmaf(bq[t * a.L + l], GY[t * a.Dv + j], acc);
    else
      for (int t = 0; t < rows; ++t) acc = fmaf(bq[t * a.L + l], gPs[t * a.La + a.off + l], acc);
    Un[l * a.Wd + j] = acc;
  }
}

// lse [C][L], b (then E) [C][L], pi [C][La], gP [C][La], V [C][Dv], gy [C][Dv], [R | r] [L][Wd],
// A [C][C], M = gy v^T [C][C].
size_t grad_bv_smem(const Args& a) {
  return sizeof(float) * (2 * kC * a.L + 2 * kC * a.La + 2 * kC * a.Dv + a.L * a.Wd + 2 * kC * kC);
}

template <class T>
__global__ void __launch_bounds__(kThreads) grad_bv_kernel(Args a, const T* __restrict__ av, LatteLayout::Strides as,
                                                          const T* __restrict__ b, LatteLayout::Strides bs,
                                                          const T* __restrict__ v, LatteLayout::Strides vs,
                                                          const float* __restrict__ lse, const T* __restrict__ dy,
                                                          LatteLayout::Strides dys, const float* __restrict__ S,
                                                          const float* __restrict__ gP, T* __restrict__ db,
                                                          LatteLayout::Strides dbs, T* __restrict__ dv,
                                                          LatteLayout::Strides dvs) {
  extern __shared__ float sm[];
  const int n = blockIdx.x, bh = blockIdx.y, bb = bh / a.H, h = bh % a.H;
  const int f = n * kC, rows = min(kC, a.T - f);
  float* lam = sm;
  float* bq = lam + kC * a.L;
  float* pi = bq + kC * a.L;
  float* gPs = pi + kC * a.La;
  float* V = gPs + kC * a.La;
  float* GY = V + kC * a.Dv;
  float* R = GY + kC * a.Dv;
  float* A = R + a.L * a.Wd;
  float* M = A + kC * kC;
  load_lse(lam, lse, a, bb, h, f, rows);
  load_rows(bq, b, bs, bb, h, f, rows, a.L);
  load_rows(pi, av, as, bb, h, f, rows, a.La);
  load_rows(V, v, vs, bb, h, f, rows, a.Dv);
  load_rows(GY, dy, dys, bb, h, f, rows, a.Dv);
  const float* Sn = S + (static_cast<int64_t>(bh) * a.N + n) * a.L * a.Wd;
  for (int i = threadIdx.x; i < a.L * a.Wd; i += blockDim.x) R[i] = Sn[i];
  const float* gPg = gP + (static_cast<int64_t>(bh) * a.T + f) * a.La;
  for (int i = threadIdx.x; i < rows * a.La; i += blockDim.x) gPs[i] = gPg[i];
  __syncthreads();
  softmax_rows(pi, rows, a.La);
  for (int i = threadIdx.x; i < rows * kC; i += blockDim.x) {
    const int t = i / kC, s = i % kC;
    float acc = 0.f;
    if (s <= t)
      for (int j = 0; j < a.Dv; ++j) acc = fmaf(GY[t * a.Dv + j], V[s * a.Dv + j], acc);
    M[i] = acc;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kC; i += blockDim.x) {
    const int t = i / kC, s = i % kC;
    float acc = 0.f;
    if (s <= t)
      for (int l = 0; l < a.L; ++l) acc = fmaf(pi[t * a.La + a.off + l], expf(bq[s * a.L + l] - lam[t * a.L + l]), acc);
    A[i] = acc;
  }
  const float* lam_e = lam + (rows - 1) * a.L;
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) {
    const int s = i / a.L, l = i % a.L;
    float vR = 0.f;
    for (int j = 0; j < a.Dv; ++j) vR = fmaf(V[s * a.Dv + j], R[l * a.Wd + j], vR);
    float acc = expf(bq[i] - lam_e[l]) * (vR - R[l * a.Wd + a.Dv]);
    for (int t = s; t < rows; ++t)
      acc = fmaf(pi[t * a.La + a.off + l] * expf(bq[i] - lam[t * a.L + l]), M[t * kC + s] - gPs[t * a.La + a.off + l],
                 acc);
    db[bb * dbs.b + static_cast<int64_t>(f + s) * dbs.t + static_cast<int64_t>(h) * a.L + l] = cuda::from_float<T>(acc);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * a.L; i += blockDim.x) bq[i] = expf(bq[i] - lam_e[i % a.L]);
  __syncthreads();
  for (int i = threadIdx.x; i < rows * a.Dv; i += blockDim.x) {
    const int s = i / a.Dv, j = i % a.Dv;
    float acc = 0.f;
    for (int l = 0; l < a.L; ++l) acc = fmaf(bq[s * a.L + l], R[l * a.Wd + j], acc);
    for (int t = s; t < rows; ++t) acc = fmaf(A[t * kC + s], GY[t * a.Dv + j], acc);
    dv[bb * dvs.b + static_cast<int64_t>(f + s) * dvs.t + static_cast<int64_t>(h) * a.Dv + j] = cuda::from_float<T>(acc);
  }
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
  const Args ar = make_args(L);
  const int per = group_size(ctx, L);
  const int64_t lse_seq = L.T * L.H * L.L;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Workspace w = carve(ctx, ar, B);
    float* lsep = lse.data<float>() + b0 * lse_seq;
    const dim3 grid(ar.N, B * ar.H);
    LINAC_GPU_DISPATCH(a.dtype, T, {
      const T* ap = at_batch(a.data<T>(), b0, L.a.b);
      const T* bp = at_batch(b.data<T>(), b0, L.b.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      const T* dyp = at_batch(dy.data<T>(), b0, L.dy.b);
      const T* lp = L.local ? at_batch(local.data<T>(), b0, L.local_s.b) : nullptr;
      T* dlp = L.local ? at_batch(dlocal.data<T>(), b0, L.dlocal.b) : nullptr;
      launch_chunk_terms<T>(ctx, ar, B, bp, L.b, vp, L.v, lsep, nullptr, w.U);
      launch_state_scan(ctx, ar, B, false, ar.Dv, lsep, w.U, w.S, nullptr);
      const size_t smem_p = grad_p_smem(ar);
      LINAC_CUDA_CHECK(cudaFuncSetAttribute(grad_p_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem_p)));
      grad_p_kernel<T><<<grid, kThreads, smem_p, cuda::stream_of(ctx)>>>(
          ar, ap, L.a, bp, L.b, vp, L.v, lp, L.local_s, lsep, dyp, L.dy, w.S, w.gP, w.U,
          at_batch(da.data<T>(), b0, L.da.b), L.da, dlp, L.dlocal);
      LINAC_CUDA_LAUNCH_CHECK();
      launch_state_scan(ctx, ar, B, true, ar.Wd, lsep, w.U, w.S, nullptr);
      const size_t smem_bv = grad_bv_smem(ar);
      LINAC_CUDA_CHECK(cudaFuncSetAttribute(grad_bv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem_bv)));
      grad_bv_kernel<T><<<grid, kThreads, smem_bv, cuda::stream_of(ctx)>>>(
          ar, ap, L.a, bp, L.b, vp, L.v, lsep, dyp, L.dy, w.S, w.gP, at_batch(db.data<T>(), b0, L.db.b), L.db,
          at_batch(dv.data<T>(), b0, L.dv.b), L.dv);
      LINAC_CUDA_LAUNCH_CHECK();
    });
  }
}

}  // namespace linac
