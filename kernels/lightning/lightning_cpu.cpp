// Lightning Attention CPU block form, the form the CPU trains with (math in lightning.h). It mirrors the CUDA
// kernels: a sequential scan over the blocks that records the state before each block, then an
// independent pass per block that combines the masked intra-block product with the recorded state.
// One pass routine serves o, dq, dk and dv:
//   out[i] = sum_j M(i,j) (X_i . Y_j) Z_j + r[i] (X_i St)
//   o : X = q,  Y = k,  Z = v,  St = S_n,     M lower (j <= i), r = a
//   dq: X = do, Y = v,  Z = k,  St = S_n^T,   M lower,          r = a
//   dv: X = k,  Y = q,  Z = do, St = R_n,     M upper (j >= i), r = c
//   dk: X = v,  Y = do, Z = q,  St = R_n^T,   M upper,          r = c
// with M(i,j) = exp(-s |i-j|) on its triangle and 0 elsewhere. With documents (lightning.h) the
// scan skips the rows outside the term's document and drops the carried state where a document
// starts; the pass narrows each row's triangle to its document and zeroes the state term of rows
// that do not continue (o, dq) or reach the end of (dk, dv) the state's document.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lightning/lightning.h"

namespace linac {

namespace {

using Strides = LightningLayout::Strides;

template <class P>
P* row(P* base, const Strides& s, int64_t b, int64_t t, int64_t h, int64_t D) {
  return base + b * s.b + t * s.t + h * D;
}

// Forward (rev = false): x = k, y = v, init = s0; states[n] = S_n, S_n+1 = g S_n + (c * K)^T V,
// final = S_N. Reverse: x = q, y = do, init = ds_final; states[n] = R_n (the gradient of the
// state after block n), R_n-1 = g R_n + (a * Q)^T dO, final = R_-1 = ds0. One (b, h) slice.
// Documents: the forward's rows are those whose document reaches the block's end, the reverse's
// those that continue the carried state's document; g is 0 where a document starts in the block.
template <class F>
void block_scan(const LightningLayout& L, bool rev, int64_t b, int64_t h, F s, const F* x, const Strides& xs,
                int64_t Dx, const F* y, const Strides& ys, int64_t Dy, const F* init, F* states, F* final_out) {
  const int64_t C = L.block, N = (L.T + C - 1) / C, SS = Dx * Dy;
  std::vector<F> S(static_cast<size_t>(SS));
  for (int64_t e = 0; e < SS; ++e) S[e] = init ? init[e] : F(0);
  for (int64_t step = 0; step < N; ++step) {
    const int64_t n = rev ? N - 1 - step : step, m = std::min(C, L.T - n * C);
    const int64_t t0 = n * C, last = t0 + m - 1, lim = std::max<int64_t>(t0, 1);
    std::copy(S.begin(), S.end(), states + n * SS);
    if (L.doc_start(b, last) < lim) {
      const F g = std::exp(-s * F(m));
      for (int64_t e = 0; e < SS; ++e) S[e] *= g;
    } else {
      std::fill(S.begin(), S.end(), F(0));
    }
    for (int64_t r = 0; r < m; ++r) {
      if (rev ? L.doc_start(b, t0 + r) >= lim : L.doc_end(b, t0 + r) <= last) continue;
      const F f = std::exp(-s * F(rev ? r + 1 : m - 1 - r));
      const F* xr = row(x, xs, b, n * C + r, h, Dx);
      const F* yr = row(y, ys, b, n * C + r, h, Dy);
      for (int64_t i = 0; i < Dx; ++i)
        for (int64_t j = 0; j < Dy; ++j) S[i * Dy + j] += f * xr[i] * yr[j];
    }
  }
  if (final_out) std::copy(S.begin(), S.end(), final_out);
}

struct PassArgs {
  bool upper;     // mask j >= i (dk, dv) instead of j <= i (o, dq); also picks r = c instead of a
  bool state_t;   // St read transposed: the state is [Dz][Dx] instead of [Dx][Dz]
  int64_t Dx, Dz;
};

// One block n of one (b, h) slice; St is the state recorded for block n.
template <class F>
void block_pass(const LightningLayout& L, const PassArgs& p, int64_t b, int64_t h, int64_t n, F s, const F* x,
                const Strides& xs, const F* y, const Strides& ys, const F* z, const Strides& zs, const F* St, F* out,
                const Strides& os) {
  const int64_t C = L.block, m = std::min(C, L.T - n * C), t0 = n * C;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t t = t0 + i;
    const F* xi = row(x, xs, b, t, h, p.Dx);
    F* oi = row(out, os, b, t, h, p.Dz);
    const bool carry = p.upper ? L.doc_end(b, t) >= t0 + m : L.doc_start(b, t) < std::max<int64_t>(t0, 1);
    if (carry) {
      const F r = std::exp(-s * F(p.upper ? m - 1 - i : i + 1));
      for (int64_t c = 0; c < p.Dz; ++c) {
        F acc = 0;
        for (int64_t d = 0; d < p.Dx; ++d) acc += xi[d] * (p.state_t ? St[c * p.Dx + d] : St[d * p.Dz + c]);
        oi[c] = r * acc;
      }
    } else {
      std::fill(oi, oi + p.Dz, F(0));
    }
    const int64_t j0 = p.upper ? i : std::max<int64_t>(0, L.doc_start(b, t) - t0);
    const int64_t j1 = p.upper ? std::min(m, L.doc_end(b, t) - t0) : i + 1;
    for (int64_t j = j0; j < j1; ++j) {
      const F* yj = row(y, ys, b, t0 + j, h, p.Dx);
      F dp = 0;
      for (int64_t d = 0; d < p.Dx; ++d) dp += xi[d] * yj[d];
      dp *= std::exp(-s * F(p.upper ? j - i : i - j));
      const F* zj = row(z, zs, b, t0 + j, h, p.Dz);
      for (int64_t c = 0; c < p.Dz; ++c) oi[c] += dp * zj[c];
    }
  }
}

template <class F>
F* state_of(F* s, const LightningLayout& L, int64_t b, int64_t h) {
  return s ? s + (b * L.H + h) * L.Dk * L.Dv : nullptr;
}

}  // namespace

template <class F>
void lightning_fwd_block_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                             const F* s0, F* o, F* s_final) {
  const int64_t N = (L.T + L.block - 1) / L.block, SS = L.Dk * L.Dv;
  std::vector<F> states(static_cast<size_t>(N * SS));
  const PassArgs po{false, false, L.Dk, L.Dv};
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      block_scan(L, false, b, h, decay[h], k, L.k, L.Dk, v, L.v, L.Dv, state_of(s0, L, b, h), states.data(),
                 state_of(s_final, L, b, h));
      for (int64_t n = 0; n < N; ++n)
        block_pass(L, po, b, h, n, decay[h], q, L.q, k, L.k, v, L.v, states.data() + n * SS, o, L.o);
    }
}

template <class F>
void lightning_bwd_block_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                             const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0) {
  const int64_t N = (L.T + L.block - 1) / L.block, SS = L.Dk * L.Dv;
  std::vector<F> S(static_cast<size_t>(N * SS)), R(static_cast<size_t>(N * SS));
  const PassArgs pq{false, true, L.Dv, L.Dk}, pv{true, false, L.Dk, L.Dv}, pk{true, true, L.Dv, L.Dk};
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F s = decay[h];
      block_scan(L, false, b, h, s, k, L.k, L.Dk, v, L.v, L.Dv, state_of(s0, L, b, h), S.data(),
                 static_cast<F*>(nullptr));
      block_scan(L, true, b, h, s, q, L.q, L.Dk, dout, L.dout, L.Dv, state_of(ds_final, L, b, h), R.data(),
                 state_of(ds0, L, b, h));
      for (int64_t n = 0; n < N; ++n) {
        block_pass(L, pq, b, h, n, s, dout, L.dout, v, L.v, k, L.k, S.data() + n * SS, dq, L.dq);
        block_pass(L, pv, b, h, n, s, k, L.k, q, L.q, dout, L.dout, R.data() + n * SS, dv, L.dv);
        block_pass(L, pk, b, h, n, s, v, L.v, dout, L.dout, q, L.q, R.data() + n * SS, dk, L.dk);
      }
    }
}

template void lightning_fwd_block_cpu<float>(const LightningLayout&, const float*, const float*, const float*,
                                             const float*, const float*, float*, float*);
template void lightning_fwd_block_cpu<double>(const LightningLayout&, const double*, const double*, const double*,
                                              const double*, const double*, double*, double*);
template void lightning_bwd_block_cpu<float>(const LightningLayout&, const float*, const float*, const float*,
                                             const float*, const float*, const float*, const float*, float*, float*,
                                             float*, float*);
template void lightning_bwd_block_cpu<double>(const LightningLayout&, const double*, const double*, const double*,
                                              const double*, const double*, const double*, const double*, double*,
                                              double*, double*, double*);

}  // namespace linac
