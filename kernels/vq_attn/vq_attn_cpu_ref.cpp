// CPU quadratic VQ-attention (docs/transformer_vq.md §2), the test oracle of the block form: every query scores
// every earlier key; keys more than one block back use the codeword C_{z_j} (a constant: no
// gradient reaches khat_j from there, docs/transformer_vq.md §4.2), the others khat_j. Math in vq_attn.h.
// With document bounds a query scores only its own document's keys, blocks counted from the
// document's first token a: the masks of vq_attn.h written out, key by key.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vq_attn/vq_attn_cpu_common.h"

namespace linac {

using vq_cpu::axpy;
using vq_cpu::row;

namespace {

// Scores of query t against keys a..t (a: the first token of t's document, 0 without bounds),
// and whether each key is in the uncompressed window.
template <class F>
struct QuadraticRow {
  const VqAttnLayout& L;
  std::vector<F> qu, qr, s;  // s[j] for j in a..t
  int64_t a = 0;

  explicit QuadraticRow(const VqAttnLayout& l)
      : L(l), qu(static_cast<size_t>(l.Dk)), qr(static_cast<size_t>(l.Dk)), s(static_cast<size_t>(l.T)) {}

  bool in_window(int64_t t, int64_t j) const { return (j - a) / L.Lb >= (t - a) / L.Lb - 1; }
  const F* key(const F* khat, const int32_t* z, const F* cb, int64_t b, int64_t h, int64_t t, int64_t j) const {
    return in_window(t, j) ? row(khat, L.khat, b, j, h, L.Dk) : cb + z[(b * L.T + j) * L.H + h] * L.Dk;
  }
  void scores(const F* q, const F* khat, const int32_t* z, const F* cb, const F* u, const F* vr, const F* rho,
              int64_t b, int64_t h, int64_t t) {
    a = L.docs.defined() ? L.docs.start[b * L.T + t] : 0;
    vq_cpu::biased_queries(row(q, L.q, b, t, h, L.Dk), u + h * L.Dk, vr + h * L.Dk, L.Dk, qu.data(), qr.data());
    for (int64_t j = a; j <= t; ++j) {
      s[j] = dot(qu.data(), key(khat, z, cb, b, h, t, j), L.Dk);
      if (t - j <= L.Lb) s[j] += dot(qr.data(), rho + (h * (L.Lb + 1) + t - j) * L.Dk, L.Dk);
    }
  }
};

}  // namespace

template <class F>
void vq_attn_fwd_quadratic_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                               const F* codebook, const F* u, const F* vr, const F* rho, F* o, F* lse) {
  QuadraticRow<F> r(L);
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F* cb = codebook + h * L.S * L.Dk;
      for (int64_t t = 0; t < L.T; ++t) {
        r.scores(q, khat, z, cb, u, vr, rho, b, h, t);
        const F m = *std::max_element(r.s.begin() + r.a, r.s.begin() + t + 1);
        F d = 0;
        for (int64_t j = r.a; j <= t; ++j) d += std::exp(r.s[j] - m);
        F* ot = row(o, L.o, b, t, h, L.Dv);
        std::fill(ot, ot + L.Dv, F(0));
        for (int64_t j = r.a; j <= t; ++j) axpy(std::exp(r.s[j] - m) / d, row(v, L.v, b, j, h, L.Dv), ot, L.Dv);
        lse[(b * L.T + t) * L.H + h] = m + std::log(d);
      }
    }
}

template <class F>
void vq_attn_bwd_quadratic_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                               const F* codebook, const F* u, const F* vr, const F* rho, const F* o, const F* lse,
                               const F* dout, F* dq, F* dkhat, F* dv, F* du, F* dvr, F* drho) {
  const int64_t Dk = L.Dk, Dv = L.Dv;
  std::fill(du, du + L.H * Dk, F(0));
  std::fill(dvr, dvr + L.H * Dk, F(0));
  std::fill(drho, drho + L.H * (L.Lb + 1) * Dk, F(0));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h)
      for (int64_t t = 0; t < L.T; ++t) {
        std::fill(row(dkhat, L.dkhat, b, t, h, Dk), row(dkhat, L.dkhat, b, t, h, Dk) + Dk, F(0));
        std::fill(row(dv, L.dv, b, t, h, Dv), row(dv, L.dv, b, t, h, Dv) + Dv, F(0));
      }
  QuadraticRow<F> r(L);
  std::vector<F> gqu(static_cast<size_t>(Dk)), gqr(static_cast<size_t>(Dk));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F* cb = codebook + h * L.S * Dk;
      for (int64_t t = 0; t < L.T; ++t) {
        r.scores(q, khat, z, cb, u, vr, rho, b, h, t);
        const F* do_t = row(dout, L.dout, b, t, h, Dv);
        const F delta = dot(do_t, row(o, L.o, b, t, h, Dv), Dv);
        const F lse_t = lse[(b * L.T + t) * L.H + h];
        std::fill(gqu.begin(), gqu.end(), F(0));
        std::fill(gqr.begin(), gqr.end(), F(0));
        for (int64_t j = r.a; j <= t; ++j) {
          const F w = std::exp(r.s[j] - lse_t);
          const F* vj = row(v, L.v, b, j, h, Dv);
          const F gs = w * (dot(do_t, vj, Dv) - delta);
          axpy(gs, r.key(khat, z, cb, b, h, t, j), gqu.data(), Dk);
          if (t - j <= L.Lb) {
            axpy(gs, rho + (h * (L.Lb + 1) + t - j) * Dk, gqr.data(), Dk);
            axpy(gs, r.qr.data(), drho + (h * (L.Lb + 1) + t - j) * Dk, Dk);
          }
          if (r.in_window(t, j)) axpy(gs, r.qu.data(), row(dkhat, L.dkhat, b, j, h, Dk), Dk);
          axpy(w, do_t, row(dv, L.dv, b, j, h, Dv), Dv);
        }
        F* dqt = row(dq, L.dq, b, t, h, Dk);
        for (int64_t i = 0; i < Dk; ++i) dqt[i] = gqu[i] + gqr[i];
        axpy(F(1), gqu.data(), du + h * Dk, Dk);
        axpy(F(1), gqr.data(), dvr + h * Dk, Dk);
      }
    }
}

#define LINAC_VQ_ATTN_QUADRATIC(F)                                                                                  \
  template void vq_attn_fwd_quadratic_cpu<F>(const VqAttnLayout&, const F*, const F*, const int32_t*, const F*,   \
                                             const F*, const F*, const F*, const F*, F*, F*);                     \
  template void vq_attn_bwd_quadratic_cpu<F>(const VqAttnLayout&, const F*, const F*, const int32_t*, const F*,   \
                                             const F*, const F*, const F*, const F*, const F*, const F*, const F*, \
                                             F*, F*, F*, F*, F*, F*);
LINAC_VQ_ATTN_QUADRATIC(float)
LINAC_VQ_ATTN_QUADRATIC(double)
#undef LINAC_VQ_ATTN_QUADRATIC

}  // namespace linac
