// CPU block-recurrent VQ-attention (docs/transformer_vq.md §3, with the stable mean cache), its
// backward (§4.1-§4.4), the decode step and the prefill handover (§5); math in vq_attn.h. Per
// (batch, head): a serial scan over blocks builds the cache (counts and per-code means of v over
// blocks <= n-2) that block n reads; every query then softmaxes jointly over its window (previous
// and present block) and the S cache entries. The backward rebuilds the same cache, collects the
// cache-value gradients per block and returns them to the values with a reverse sweep that lags
// two blocks. With document bounds each document [a, e) of a row is such a sequence of its own
// (blocks counted from a, the cache empty at a).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vq_attn/vq_attn_cpu_common.h"

namespace linac {

using vq_cpu::axpy;
using vq_cpu::row;

namespace {

// Counts N^(n) [R, S] and means Ubar^(n) [R, S, Dv] of one (b, h) pair's sequence [a, a + len):
// the state after absorbing its blocks 0..n-2, merged block by block as means (never as raw sums
// of v).
template <class F>
struct BlockCache {
  int64_t R, S, Dv;
  std::vector<F> N, U;

  BlockCache(const VqAttnLayout& L, const int32_t* z, const F* v, int64_t b, int64_t h, int64_t a, int64_t len)
      : R((len + L.Lb - 1) / L.Lb), S(L.S), Dv(L.Dv), N(static_cast<size_t>(R * S)), U(static_cast<size_t>(R * S * Dv)) {
    std::vector<F> n_run(static_cast<size_t>(S)), u_run(static_cast<size_t>(S * Dv));
    std::vector<F> cnt(static_cast<size_t>(S)), sum(static_cast<size_t>(S * Dv));
    for (int64_t n = 0; n < R; ++n) {
      if (n >= 2) {
        std::fill(cnt.begin(), cnt.end(), F(0));
        std::fill(sum.begin(), sum.end(), F(0));
        for (int64_t j = a + (n - 2) * L.Lb; j < a + (n - 1) * L.Lb; ++j) {
          const int32_t s = z[(b * L.T + j) * L.H + h];
          cnt[s] += 1;
          axpy(F(1), row(v, L.v, b, j, h, Dv), &sum[s * Dv], Dv);
        }
        for (int64_t s = 0; s < S; ++s) {
          if (cnt[s] == 0) continue;
          const F n_new = n_run[s] + cnt[s];
          for (int64_t e = 0; e < Dv; ++e)
            u_run[s * Dv + e] = n_run[s] / n_new * u_run[s * Dv + e] + sum[s * Dv + e] / n_new;
          n_run[s] = n_new;
        }
      }
      std::copy(n_run.begin(), n_run.end(), N.begin() + n * S);
      std::copy(u_run.begin(), u_run.end(), U.begin() + n * S * Dv);
    }
  }
  const F* counts(int64_t n) const { return &N[n * S]; }
  const F* means(int64_t n, int64_t s) const { return &U[(n * S + s) * Dv]; }
};

// The joint score row of query t of the sequence starting at a: window keys j0..t, then the S
// cache entries (-inf where empty).
template <class F>
struct BlockRow {
  const VqAttnLayout& L;
  std::vector<F> qu, qr, s;
  int64_t j0 = 0, nw = 0;

  explicit BlockRow(const VqAttnLayout& l)
      : L(l), qu(static_cast<size_t>(l.Dk)), qr(static_cast<size_t>(l.Dk)), s(static_cast<size_t>(2 * l.Lb + l.S)) {}

  void scores(const F* q, const F* khat, const F* cb, const F* u, const F* vr, const F* rho, const BlockCache<F>& c,
              int64_t b, int64_t h, int64_t t, int64_t a) {
    const int64_t n = (t - a) / L.Lb;
    j0 = a + std::max<int64_t>(0, (n - 1) * L.Lb);
    nw = t - j0 + 1;
    vq_cpu::biased_queries(row(q, L.q, b, t, h, L.Dk), u + h * L.Dk, vr + h * L.Dk, L.Dk, qu.data(), qr.data());
    for (int64_t j = j0; j <= t; ++j) {
      F sj = dot(qu.data(), row(khat, L.khat, b, j, h, L.Dk), L.Dk);
      if (t - j <= L.Lb) sj += dot(qr.data(), rho + (h * (L.Lb + 1) + t - j) * L.Dk, L.Dk);
      s[j - j0] = sj;
    }
    const F* N = c.counts(n);
    for (int64_t e = 0; e < L.S; ++e)
      s[nw + e] = N[e] > 0 ? dot(qu.data(), cb + e * L.Dk, L.Dk) + std::log(N[e]) : -std::numeric_limits<F>::infinity();
  }
  int64_t size() const { return nw + L.S; }
};

}  // namespace

template <class F>
void vq_attn_fwd_block_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                           const F* codebook, const F* u, const F* vr, const F* rho, F* o, F* lse) {
  BlockRow<F> r(L);
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F* cb = codebook + h * L.S * L.Dk;
      vq_cpu::for_each_document(L, b, [&](int64_t a, int64_t t_end) {
        const BlockCache<F> cache(L, z, v, b, h, a, t_end - a);
        for (int64_t t = a; t < t_end; ++t) {
          const int64_t n = (t - a) / L.Lb;
          r.scores(q, khat, cb, u, vr, rho, cache, b, h, t, a);
          const F m = *std::max_element(r.s.begin(), r.s.begin() + r.size());
          F d = 0;
          for (int64_t e = 0; e < r.size(); ++e) d += std::exp(r.s[e] - m);
          F* ot = row(o, L.o, b, t, h, L.Dv);
          std::fill(ot, ot + L.Dv, F(0));
          for (int64_t j = r.j0; j <= t; ++j) axpy(std::exp(r.s[j - r.j0] - m) / d, row(v, L.v, b, j, h, L.Dv), ot, L.Dv);
          for (int64_t e = 0; e < L.S; ++e)
            if (cache.counts(n)[e] > 0) axpy(std::exp(r.s[r.nw + e] - m) / d, cache.means(n, e), ot, L.Dv);
          lse[(b * L.T + t) * L.H + h] = m + std::log(d);
        }
      });
    }
}

template <class F>
void vq_attn_bwd_block_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                           const F* codebook, const F* u, const F* vr, const F* rho, const F* o, const F* lse,
                           const F* dout, F* dq, F* dkhat, F* dv, F* du, F* dvr, F* drho) {
  const int64_t Dk = L.Dk, Dv = L.Dv, S = L.S;
  const int64_t R = (L.T + L.Lb - 1) / L.Lb;
  std::fill(du, du + L.H * Dk, F(0));
  std::fill(dvr, dvr + L.H * Dk, F(0));
  std::fill(drho, drho + L.H * (L.Lb + 1) * Dk, F(0));
  BlockRow<F> r(L);
  std::vector<F> gqu(static_cast<size_t>(Dk)), gqr(static_cast<size_t>(Dk));
  std::vector<F> g_means(static_cast<size_t>(R * S * Dv)), carry(static_cast<size_t>(S * Dv));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F* cb = codebook + h * S * Dk;
      for (int64_t t = 0; t < L.T; ++t) {
        std::fill(row(dkhat, L.dkhat, b, t, h, Dk), row(dkhat, L.dkhat, b, t, h, Dk) + Dk, F(0));
        std::fill(row(dv, L.dv, b, t, h, Dv), row(dv, L.dv, b, t, h, Dv) + Dv, F(0));
      }
      vq_cpu::for_each_document(L, b, [&](int64_t a, int64_t t_end) {
        const BlockCache<F> cache(L, z, v, b, h, a, t_end - a);
        std::fill(g_means.begin(), g_means.end(), F(0));
        for (int64_t t = a; t < t_end; ++t) {
          const int64_t n = (t - a) / L.Lb;
          r.scores(q, khat, cb, u, vr, rho, cache, b, h, t, a);
          const F* do_t = row(dout, L.dout, b, t, h, Dv);
          const F delta = dot(do_t, row(o, L.o, b, t, h, Dv), Dv);
          const F lse_t = lse[(b * L.T + t) * L.H + h];
          std::fill(gqu.begin(), gqu.end(), F(0));
          std::fill(gqr.begin(), gqr.end(), F(0));
          for (int64_t j = r.j0; j <= t; ++j) {
            const F w = std::exp(r.s[j - r.j0] - lse_t);
            const F gs = w * (dot(do_t, row(v, L.v, b, j, h, Dv), Dv) - delta);
            axpy(gs, row(khat, L.khat, b, j, h, Dk), gqu.data(), Dk);
            if (t - j <= L.Lb) {
              axpy(gs, rho + (h * (L.Lb + 1) + t - j) * Dk, gqr.data(), Dk);
              axpy(gs, r.qr.data(), drho + (h * (L.Lb + 1) + t - j) * Dk, Dk);
            }
            axpy(gs, r.qu.data(), row(dkhat, L.dkhat, b, j, h, Dk), Dk);
            axpy(w, do_t, row(dv, L.dv, b, j, h, Dv), Dv);
          }
          for (int64_t e = 0; e < S; ++e) {
            if (!(cache.counts(n)[e] > 0)) continue;
            const F w = std::exp(r.s[r.nw + e] - lse_t);
            const F gs = w * (dot(do_t, cache.means(n, e), Dv) - delta);
            axpy(gs, cb + e * Dk, gqu.data(), Dk);
            axpy(w, do_t, &g_means[(n * S + e) * Dv], Dv);
          }
          F* dqt = row(dq, L.dq, b, t, h, Dk);
          for (int64_t i = 0; i < Dk; ++i) dqt[i] = gqu[i] + gqr[i];
          axpy(F(1), gqu.data(), du + h * Dk, Dk);
          axpy(F(1), gqr.data(), dvr + h * Dk, Dk);
        }
        // dv_j += sum_{n >= n(j)+2} g_means^(n)[z_j] / N^(n)[z_j]: carry holds that sum for block m.
        std::fill(carry.begin(), carry.end(), F(0));
        for (int64_t m = cache.R - 1; m >= 0; --m) {
          if (m + 2 < cache.R)
            for (int64_t e = 0; e < S; ++e) {
              const F N = cache.counts(m + 2)[e];
              if (N > 0) axpy(F(1) / N, &g_means[((m + 2) * S + e) * Dv], &carry[e * Dv], Dv);
            }
          for (int64_t j = a + m * L.Lb; j < std::min(t_end, a + (m + 1) * L.Lb); ++j)
            axpy(F(1), &carry[z[(b * L.T + j) * L.H + h] * Dv], row(dv, L.dv, b, j, h, Dv), Dv);
        }
      });
    }
}

template <class F>
void vq_attn_step_cpu(const VqStepLayout& L, const F* q, const F* khat, const int32_t* z, const F* v, const F* codebook,
                      const F* u, const F* vr, const F* rho, F* ring_khat, F* ring_v, int32_t* ring_z, F* counts,
                      F* means, const int32_t* pos, F* o) {
  const int64_t Dk = L.Dk, Dv = L.Dv, S = L.S, Lb = L.Lb;
  std::vector<F> qu(static_cast<size_t>(Dk)), qr(static_cast<size_t>(Dk)), s(static_cast<size_t>(Lb + 1 + S));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const int64_t bh = b * L.H + h, p = pos[b];
      const int64_t n_ring = std::min(p, Lb);  // ring entries p-n_ring..p-1
      const F* cb = codebook + h * S * Dk;
      const F* kh_rows = ring_khat + bh * Lb * Dk;
      const F* v_rows = ring_v + bh * Lb * Dv;
      F* N = counts + bh * S;
      F* U = means + bh * S * Dv;
      const F* kt = khat + b * L.khat + h * Dk;
      const F* vt = v + b * L.v + h * Dv;
      vq_cpu::biased_queries(q + b * L.q + h * Dk, u + h * Dk, vr + h * Dk, Dk, qu.data(), qr.data());
      // s[d] for distance d = 0..n_ring (d = 0: the token itself; -inf for slots emptied by a
      // document start), then the cache.
      auto key_at = [&](int64_t d) { return d == 0 ? kt : kh_rows + ((p - d) % Lb) * Dk; };
      auto value_at = [&](int64_t d) { return d == 0 ? vt : v_rows + ((p - d) % Lb) * Dv; };
      auto present = [&](int64_t d) { return d == 0 || ring_z[bh * Lb + (p - d) % Lb] >= 0; };
      for (int64_t d = 0; d <= n_ring; ++d)
        s[d] = present(d) ? dot(qu.data(), key_at(d), Dk) + dot(qr.data(), rho + (h * (Lb + 1) + d) * Dk, Dk)
                          : -std::numeric_limits<F>::infinity();
      for (int64_t e = 0; e < S; ++e)
        s[n_ring + 1 + e] =
            N[e] > 0 ? dot(qu.data(), cb + e * Dk, Dk) + std::log(N[e]) : -std::numeric_limits<F>::infinity();
      const F m = *std::max_element(s.begin(), s.begin() + n_ring + 1 + S);
      F den = 0;
      for (int64_t e = 0; e < n_ring + 1 + S; ++e) den += std::exp(s[e] - m);
      F* ob = o + b * L.o + h * Dv;
      std::fill(ob, ob + Dv, F(0));
      for (int64_t d = 0; d <= n_ring; ++d)
        if (present(d)) axpy(std::exp(s[d] - m) / den, value_at(d), ob, Dv);
      for (int64_t e = 0; e < S; ++e)
        if (N[e] > 0) axpy(std::exp(s[n_ring + 1 + e] - m) / den, U + e * Dv, ob, Dv);
      // The token at p - Lb leaves the window; the new token takes its slot.
      const int64_t slot = p % Lb;
      if (p >= Lb && ring_z[bh * Lb + slot] >= 0) {
        const int32_t ze = ring_z[bh * Lb + slot];
        N[ze] += 1;
        const F* ve = v_rows + slot * Dv;
        for (int64_t e = 0; e < Dv; ++e) U[ze * Dv + e] += (ve[e] - U[ze * Dv + e]) / N[ze];
      }
      std::copy(kt, kt + Dk, ring_khat + (bh * Lb + slot) * Dk);
      std::copy(vt, vt + Dv, ring_v + (bh * Lb + slot) * Dv);
      ring_z[bh * Lb + slot] = z[bh];
    }
}

// The prefill handover: per (b, h) the state vq_attn_step_cpu leaves after tokens 0..T-1, built
// from the prompt at once. The row's last document starts at a (0 without bounds): the tokens of
// [a, T - Lb) enter the cache in order with the step's own update, those of [max(a, T - Lb), T)
// take their ring slots by document position, and every other slot is absent (z = -1).
template <class F>
void vq_attn_state_prefill_cpu(const VqAttnLayout& L, const F* khat, const int32_t* z, const F* v, F* ring_khat,
                               F* ring_v, int32_t* ring_z, F* counts, F* means) {
  const int64_t Dk = L.Dk, Dv = L.Dv, S = L.S, Lb = L.Lb, T = L.T;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const int64_t bh = b * L.H + h;
      const int64_t a = L.docs.defined() ? L.docs.start[b * T + T - 1] : 0;
      F* N = counts + bh * S;
      F* U = means + bh * S * Dv;
      std::fill(N, N + S, F(0));
      std::fill(U, U + S * Dv, F(0));
      for (int64_t t = a; t < T - Lb; ++t) {
        const int32_t ze = z[(b * T + t) * L.H + h];
        N[ze] += 1;
        const F* vt = v + b * L.v.b + t * L.v.t + h * Dv;
        for (int64_t e = 0; e < Dv; ++e) U[ze * Dv + e] += (vt[e] - U[ze * Dv + e]) / N[ze];
      }
      std::fill(ring_z + bh * Lb, ring_z + (bh + 1) * Lb, -1);
      for (int64_t t = std::max(a, T - Lb); t < T; ++t) {
        const int64_t slot = (t - a) % Lb;
        const F* kt = khat + b * L.khat.b + t * L.khat.t + h * Dk;
        const F* vt = v + b * L.v.b + t * L.v.t + h * Dv;
        std::copy(kt, kt + Dk, ring_khat + (bh * Lb + slot) * Dk);
        std::copy(vt, vt + Dv, ring_v + (bh * Lb + slot) * Dv);
        ring_z[bh * Lb + slot] = z[(b * T + t) * L.H + h];
      }
    }
}

#define LINAC_VQ_ATTN_BLOCK(F)                                                                                        \
  template void vq_attn_fwd_block_cpu<F>(const VqAttnLayout&, const F*, const F*, const int32_t*, const F*, const F*, \
                                         const F*, const F*, const F*, F*, F*);                                       \
  template void vq_attn_bwd_block_cpu<F>(const VqAttnLayout&, const F*, const F*, const int32_t*, const F*, const F*, \
                                         const F*, const F*, const F*, const F*, const F*, const F*, F*, F*, F*, F*,  \
                                         F*, F*);                                                                     \
  template void vq_attn_step_cpu<F>(const VqStepLayout&, const F*, const F*, const int32_t*, const F*, const F*,      \
                                    const F*, const F*, const F*, F*, F*, int32_t*, F*, F*, const int32_t*, F*);      \
  template void vq_attn_state_prefill_cpu<F>(const VqAttnLayout&, const F*, const int32_t*, const F*, F*, F*,         \
                                             int32_t*, F*, F*);
LINAC_VQ_ATTN_BLOCK(float)
LINAC_VQ_ATTN_BLOCK(double)
#undef LINAC_VQ_ATTN_BLOCK

}  // namespace linac
