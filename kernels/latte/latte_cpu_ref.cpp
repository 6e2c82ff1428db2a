// Latte CPU references, quadratic and recurrent forms (math in latte.h), forward, backward and the
// decode step; plain loops, float/double. The chunked form (the GPU's, and what the CPU trains with) is in latte_cpu.cpp.
// With documents (L.docs) the quadratic sums run over start[b,t] <= s <= t (and t >= s within
// s's document) and the recurrences restart at every document start.
#include "latte/latte_cpu_common.h"

namespace linac {

using namespace latte_cpu;

template <class F>
void latte_fwd_quadratic_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                             F* mu_final) {
  const int64_t La = L.La(), off = L.local ? 1 : 0;
  std::vector<F> pi(La);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h)
      for (int64_t t = 0; t < L.T; ++t) {
        softmax_row(row(a, L.a, bb, t, h, La), La, pi.data());
        F* yt = row(y, L.y, bb, t, h, L.Dv);
        for (int64_t j = 0; j < L.Dv; ++j) yt[j] = L.local ? pi[0] * row(local, L.local_s, bb, t, h, L.Dv)[j] : F(0);
        const int64_t s0 = L.doc_start(bb, t);
        for (int64_t l = 0; l < L.L; ++l) {
          F m = neg_inf<F>();
          for (int64_t s = s0; s <= t; ++s) m = std::max(m, row(b, L.b, bb, s, h, L.L)[l]);
          F sum = 0;
          for (int64_t s = s0; s <= t; ++s) sum += std::exp(row(b, L.b, bb, s, h, L.L)[l] - m);
          const F lse_tl = m + std::log(sum);
          lse_row(lse, L, bb, t, h)[l] = lse_tl;
          const bool last = t == L.T - 1 && mu_final;
          F* muf = last ? mu_final + ((bb * L.H + h) * L.L + l) * L.Dv : nullptr;
          if (last)
            for (int64_t j = 0; j < L.Dv; ++j) muf[j] = 0;
          for (int64_t s = s0; s <= t; ++s) {
            const F w = std::exp(row(b, L.b, bb, s, h, L.L)[l] - lse_tl);
            const F* vs = row(v, L.v, bb, s, h, L.Dv);
            for (int64_t j = 0; j < L.Dv; ++j) yt[j] += pi[off + l] * w * vs[j];
            if (last)
              for (int64_t j = 0; j < L.Dv; ++j) muf[j] += w * vs[j];
          }
        }
      }
}

template <class F>
void latte_bwd_quadratic_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F*,
                             const F* dy, F* da, F* db, F* dv, F* dlocal) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T;
  std::vector<F> lam(T * L.L), pi(T * La), gP(T * La);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      auto bv = [&](int64_t s, int64_t l) { return row(b, L.b, bb, s, h, L.L)[l]; };
      for (int64_t t = 0; t < T; ++t) {
        softmax_row(row(a, L.a, bb, t, h, La), La, &pi[t * La]);
        const int64_t s0 = L.doc_start(bb, t);
        for (int64_t l = 0; l < L.L; ++l) {
          F m = neg_inf<F>(), sum = 0;
          for (int64_t s = s0; s <= t; ++s) m = std::max(m, bv(s, l));
          for (int64_t s = s0; s <= t; ++s) sum += std::exp(bv(s, l) - m);
          lam[t * L.L + l] = m + std::log(sum);
        }
      }
      // gP_{t,l} = sum_{s<=t} exp(b_s - lse_t) (gy_t . v_s), then the softmax backward.
      for (int64_t t = 0; t < T; ++t) {
        const F* gy = row(dy, L.dy, bb, t, h, L.Dv);
        if (L.local) {
          gP[t * La] = dot(gy, row(local, L.local_s, bb, t, h, L.Dv), L.Dv);
          F* dl = row(dlocal, L.dlocal, bb, t, h, L.Dv);
          for (int64_t j = 0; j < L.Dv; ++j) dl[j] = pi[t * La] * gy[j];
        }
        for (int64_t l = 0; l < L.L; ++l) {
          F s_ = 0;
          for (int64_t s = L.doc_start(bb, t); s <= t; ++s)
            s_ += std::exp(bv(s, l) - lam[t * L.L + l]) * dot(gy, row(v, L.v, bb, s, h, L.Dv), L.Dv);
          gP[t * La + off + l] = s_;
        }
        softmax_bwd_row(&pi[t * La], &gP[t * La], La, row(da, L.da, bb, t, h, La));
      }
      for (int64_t s = 0; s < T; ++s) {
        const F* vs = row(v, L.v, bb, s, h, L.Dv);
        F* dvs = row(dv, L.dv, bb, s, h, L.Dv);
        F* dbs = row(db, L.db, bb, s, h, L.L);
        for (int64_t j = 0; j < L.Dv; ++j) dvs[j] = 0;
        for (int64_t l = 0; l < L.L; ++l) dbs[l] = 0;
        for (int64_t t = s; t < T && L.doc_start(bb, t) <= s; ++t) {  // t in s's document
          const F* gy = row(dy, L.dy, bb, t, h, L.Dv);
          const F gyv = dot(gy, vs, L.Dv);
          for (int64_t l = 0; l < L.L; ++l) {
            const F c = pi[t * La + off + l] * std::exp(bv(s, l) - lam[t * L.L + l]);
            for (int64_t j = 0; j < L.Dv; ++j) dvs[j] += c * gy[j];
            dbs[l] += c * (gyv - gP[t * La + off + l]);
          }
        }
      }
    }
}

namespace {

// One token of the recurrent form for one (batch, head): updates lse[L], mu[L, Dv] in place and
// writes y (docs/latte.md §5). The decay 1 - omega is taken as exp(lse - lse'), never 1 - omega (§8.4).
template <class F>
void recurrent_token(int64_t L, int64_t Dv, bool with_local, const F* a, const F* b, const F* v, const F* local,
                     F* lse, F* mu, F* y, F* pi) {
  const int64_t La = with_local ? L + 1 : L, off = with_local ? 1 : 0;
  softmax_row(a, La, pi);
  for (int64_t j = 0; j < Dv; ++j) y[j] = with_local ? pi[0] * local[j] : F(0);
  for (int64_t l = 0; l < L; ++l) {
    const F lse_new = logaddexp(lse[l], b[l]);
    const F omega = std::exp(b[l] - lse_new), keep = std::exp(lse[l] - lse_new);
    lse[l] = lse_new;
    F* m = mu + l * Dv;
    for (int64_t j = 0; j < Dv; ++j) {
      m[j] = keep * m[j] + omega * v[j];
      y[j] += pi[off + l] * m[j];
    }
  }
}

}  // namespace

template <class F>
void latte_fwd_recurrent_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                             F* mu_final) {
  std::vector<F> lam(L.L), mu(L.L * L.Dv), pi(L.La());
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      std::fill(lam.begin(), lam.end(), neg_inf<F>());
      std::fill(mu.begin(), mu.end(), F(0));
      for (int64_t t = 0; t < L.T; ++t) {
        if (t > 0 && L.doc_start(bb, t) == t) {  // a document starts: a fresh state
          std::fill(lam.begin(), lam.end(), neg_inf<F>());
          std::fill(mu.begin(), mu.end(), F(0));
        }
        recurrent_token(L.L, L.Dv, L.local, row(a, L.a, bb, t, h, L.La()), row(b, L.b, bb, t, h, L.L),
                        row(v, L.v, bb, t, h, L.Dv), L.local ? row(local, L.local_s, bb, t, h, L.Dv) : nullptr,
                        lam.data(), mu.data(), row(y, L.y, bb, t, h, L.Dv), pi.data());
        std::copy(lam.begin(), lam.end(), lse_row(lse, L, bb, t, h));
      }
      if (mu_final) std::copy(mu.begin(), mu.end(), mu_final + (bb * L.H + h) * L.L * L.Dv);
    }
}

// docs/latte.md §4.1: the forward again (keeping mu_t for gP), then the reverse recurrences (reset
// to zero past each document's last token)
//   G_l <- exp(lse_t - lse_t+1) G_l + pi_{t,l} gy_t,   g_l <- exp(lse_t - lse_t+1) g_l + pi_{t,l} gP_{t,l}
//   dv_t = sum_l omega_{t,l} G_l,   db_{t,l} = omega_{t,l} (v_t . G_l - g_l).
template <class F>
void latte_bwd_recurrent_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F*,
                             const F* dy, F* da, F* db, F* dv, F* dlocal) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T, S = L.L * L.Dv;
  std::vector<F> lam(T * L.L), mus(T * S), pi(T * La), gP(La), G(S), g(L.L), y(L.Dv), lam_run(L.L), mu_run(S);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      std::fill(lam_run.begin(), lam_run.end(), neg_inf<F>());
      std::fill(mu_run.begin(), mu_run.end(), F(0));
      for (int64_t t = 0; t < T; ++t) {
        if (t > 0 && L.doc_start(bb, t) == t) {
          std::fill(lam_run.begin(), lam_run.end(), neg_inf<F>());
          std::fill(mu_run.begin(), mu_run.end(), F(0));
        }
        recurrent_token(L.L, L.Dv, L.local, row(a, L.a, bb, t, h, La), row(b, L.b, bb, t, h, L.L),
                        row(v, L.v, bb, t, h, L.Dv), L.local ? row(local, L.local_s, bb, t, h, L.Dv) : nullptr,
                        lam_run.data(), mu_run.data(), y.data(), &pi[t * La]);
        std::copy(lam_run.begin(), lam_run.end(), &lam[t * L.L]);
        std::copy(mu_run.begin(), mu_run.end(), &mus[t * S]);
      }
      std::fill(G.begin(), G.end(), F(0));
      std::fill(g.begin(), g.end(), F(0));
      for (int64_t t = T - 1; t >= 0; --t) {
        const F* gy = row(dy, L.dy, bb, t, h, L.Dv);
        const F* vt = row(v, L.v, bb, t, h, L.Dv);
        const F* pit = &pi[t * La];
        if (L.local) {
          gP[0] = dot(gy, row(local, L.local_s, bb, t, h, L.Dv), L.Dv);
          F* dl = row(dlocal, L.dlocal, bb, t, h, L.Dv);
          for (int64_t j = 0; j < L.Dv; ++j) dl[j] = pit[0] * gy[j];
        }
        for (int64_t l = 0; l < L.L; ++l) gP[off + l] = dot(gy, &mus[t * S + l * L.Dv], L.Dv);
        softmax_bwd_row(pit, gP.data(), La, row(da, L.da, bb, t, h, La));
        F* dvt = row(dv, L.dv, bb, t, h, L.Dv);
        F* dbt = row(db, L.db, bb, t, h, L.L);
        for (int64_t j = 0; j < L.Dv; ++j) dvt[j] = 0;
        for (int64_t l = 0; l < L.L; ++l) {
          // The reverse state stays within the document: nothing flows back across a start.
          const bool last = t == T - 1 || L.doc_start(bb, t + 1) == t + 1;
          const F decay = last ? F(0) : std::exp(lam[t * L.L + l] - lam[(t + 1) * L.L + l]);
          F* Gl = &G[l * L.Dv];
          for (int64_t j = 0; j < L.Dv; ++j) Gl[j] = decay * Gl[j] + pit[off + l] * gy[j];
          g[l] = decay * g[l] + pit[off + l] * gP[off + l];
          const F omega = std::exp(row(b, L.b, bb, t, h, L.L)[l] - lam[t * L.L + l]);
          for (int64_t j = 0; j < L.Dv; ++j) dvt[j] += omega * Gl[j];
          dbt[l] = omega * (dot(vt, Gl, L.Dv) - g[l]);
        }
      }
    }
}

template <class F>
void latte_step_cpu(const LatteStepLayout& L, const F* a, const F* b, const F* v, const F* local, F* lse_state,
                    F* mu_state, F* y) {
  const int64_t La = L.local ? L.L + 1 : L.L;
  std::vector<F> pi(La);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      const int64_t bh = bb * L.H + h;
      recurrent_token(L.L, L.Dv, L.local, a + bb * L.a + h * La, b + bb * L.b + h * L.L, v + bb * L.v + h * L.Dv,
                      L.local ? local + bb * L.local_s + h * L.Dv : nullptr, lse_state + bh * L.L,
                      mu_state + bh * L.L * L.Dv, y + bb * L.y + h * L.Dv, pi.data());
    }
}

#define LINAC_LATTE_CPU_INSTANTIATE(F)                                                                              \
  template void latte_fwd_quadratic_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, F*, F*, F*); \
  template void latte_fwd_recurrent_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, F*, F*, F*); \
  template void latte_bwd_quadratic_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, const F*,   \
                                           const F*, F*, F*, F*, F*);                                               \
  template void latte_bwd_recurrent_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, const F*,   \
                                           const F*, F*, F*, F*, F*);                                               \
  template void latte_step_cpu<F>(const LatteStepLayout&, const F*, const F*, const F*, const F*, F*, F*, F*);
LINAC_LATTE_CPU_INSTANTIATE(float)
LINAC_LATTE_CPU_INSTANTIATE(double)
#undef LINAC_LATTE_CPU_INSTANTIATE

}  // namespace linac
