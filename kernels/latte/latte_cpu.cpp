// Latte CPU chunked form (the form the CPU trains with; math in latte.h, docs/latte.md §3 and §4.2), forward and backward;
// plain loops, float/double. Per chunk f..e the products exp(b_s - lse_t) are factorised at the
// reference lse_r, r = max(f, start[b,t]) the first row of t's document in the chunk (f without
// documents), as exp(lse_r - lse_t) * exp(b_s - lse_r); a chunk where some document's lse grows by
// more than kMaxGrowth forms them directly (docs/latte.md §3.3: the second factor would overflow
// f32 near 88). With documents (§3.4) only pairs s, t of one document are formed, the carried
// state reaches the rows whose document began before the chunk, and the chunk states flow on only
// within one document.
#include "latte/latte_cpu_common.h"

namespace linac {

using namespace latte_cpu;

namespace {

constexpr double kMaxGrowth = 60.0;

// One row's documents: first(t) = start[b,t]. Without documents (kDocs false: the stream form,
// compiled apart so that its loops carry no test) first(t) = 0.
template <bool kDocs>
struct Docs {
  const int32_t* start;  // the row's starts [T]
  int64_t first(int64_t t) const {
    if constexpr (kDocs) return start[t];
    return 0;
  }
  // The first row of t's document within the chunk starting at f.
  int64_t ref(int64_t f, int64_t t) const {
    if constexpr (kDocs) return std::max(f, first(t));
    return f;
  }
  // Whether row t takes the state carried into the chunk starting at f (its document began earlier).
  bool carried(int64_t f, int64_t t) const {
    if constexpr (kDocs) return f > 0 && first(t) < f;
    return f > 0;
  }
};
template <bool kDocs>
Docs<kDocs> row_docs(const LatteLayout& L, int64_t bb) {
  return {kDocs ? L.docs.start + bb * L.T : nullptr};
}

// exp(b_s - lse_t) for first(t) <= s <= t in one chunk, in the factorised form unless the chunk's
// lse grows too much. lam: the (b, h) slice's lse rows [T, L]; bcol(s, l) reads b.
template <class F, class BCol, bool kDocs>
struct ChunkProducts {
  const F* lam;
  int64_t L, f;
  bool direct;
  BCol bcol;
  Docs<kDocs> docs;
  F operator()(int64_t t, int64_t s, int64_t l) const {
    if (direct) return std::exp(bcol(s, l) - lam[t * L + l]);
    const F ref = lam[docs.ref(f, t) * L + l];
    return std::exp(ref - lam[t * L + l]) * std::exp(bcol(s, l) - ref);
  }
};

// Whether some document's lse grows by more than kMaxGrowth inside the chunk f..e (lse is
// non-decreasing within a document, so without documents the last row tells).
template <class F, bool kDocs>
bool needs_direct(const F* lam, int64_t L, int64_t f, int64_t e, const Docs<kDocs>& docs) {
  F growth = 0;
  for (int64_t t = kDocs ? f : e; t <= e; ++t)
    for (int64_t l = 0; l < L; ++l) growth = std::max(growth, lam[t * L + l] - lam[docs.ref(f, t) * L + l]);
  return growth > F(kMaxGrowth);
}

// mu at the start of every chunk of one (b, h) slice (mu_start [N, L, Dv]) and after the last
// token (mu_end [L, Dv]): mu_e = exp(lse_{f-1} - lse_e) mu_{f-1} + sum_s exp(b_s - lse_e) v_s, the
// first term only when e's document began before the chunk, the sum over s in e's document.
template <class F, class BCol, class VRow, bool kDocs>
void chunk_states(const F* lam, int64_t T, int64_t L, int64_t Dv, int64_t C, BCol bcol, VRow vrow,
                  const Docs<kDocs>& docs, F* mu_start, F* mu_end) {
  std::vector<F> mu(L * Dv, F(0));
  for (int64_t f = 0, n = 0; f < T; f += C, ++n) {
    const int64_t e = std::min(T, f + C) - 1;
    std::copy(mu.begin(), mu.end(), mu_start + n * L * Dv);
    for (int64_t l = 0; l < L; ++l) {
      const F keep = docs.carried(f, e) ? std::exp(lam[(f - 1) * L + l] - lam[e * L + l]) : F(0);
      for (int64_t j = 0; j < Dv; ++j) mu[l * Dv + j] *= keep;
      for (int64_t s = docs.ref(f, e); s <= e; ++s) {
        const F w = std::exp(bcol(s, l) - lam[e * L + l]);
        const F* vs = vrow(s);
        for (int64_t j = 0; j < Dv; ++j) mu[l * Dv + j] += w * vs[j];
      }
    }
  }
  if (mu_end) std::copy(mu.begin(), mu.end(), mu_end);
}

// dec_{t,l} = exp(lse_{f-1} - lse_t) for rows that take the carried state, else 0.
template <class F, bool kDocs>
F decay_to(const F* lam, int64_t L, int64_t f, int64_t t, int64_t l, const Docs<kDocs>& docs) {
  return docs.carried(f, t) ? std::exp(lam[(f - 1) * L + l] - lam[t * L + l]) : F(0);
}

template <class F, bool kDocs>
void fwd_chunked(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse, F* mu_final) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T, C = L.chunk, N = (T + C - 1) / C;
  std::vector<F> lam(T * L.L), mu_start(N * L.L * L.Dv), pi(La);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      auto bcol = [&](int64_t s, int64_t l) { return row(b, L.b, bb, s, h, L.L)[l]; };
      auto vrow = [&](int64_t s) { return row(v, L.v, bb, s, h, L.Dv); };
      const Docs<kDocs> docs = row_docs<kDocs>(L, bb);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t l = 0; l < L.L; ++l) {
          const F prev = docs.first(t) == t ? neg_inf<F>() : lam[(t - 1) * L.L + l];
          lse_row(lse, L, bb, t, h)[l] = lam[t * L.L + l] = logaddexp(prev, bcol(t, l));
        }
      chunk_states(lam.data(), T, L.L, L.Dv, C, bcol, vrow, docs, mu_start.data(),
                   mu_final ? mu_final + (bb * L.H + h) * L.L * L.Dv : nullptr);
      for (int64_t f = 0, n = 0; f < T; f += C, ++n) {
        const int64_t e = std::min(T, f + C) - 1;
        const bool direct = needs_direct(lam.data(), L.L, f, e, docs);
        const ChunkProducts<F, decltype(bcol), kDocs> P{lam.data(), L.L, f, direct, bcol, docs};
        const F* mu_prev = &mu_start[n * L.L * L.Dv];
        for (int64_t t = f; t <= e; ++t) {
          softmax_row(row(a, L.a, bb, t, h, La), La, pi.data());
          F* yt = row(y, L.y, bb, t, h, L.Dv);
          for (int64_t j = 0; j < L.Dv; ++j) yt[j] = L.local ? pi[0] * row(local, L.local_s, bb, t, h, L.Dv)[j] : F(0);
          for (int64_t l = 0; l < L.L; ++l) {
            const F wd = pi[off + l] * decay_to(lam.data(), L.L, f, t, l, docs);
            for (int64_t j = 0; j < L.Dv; ++j) yt[j] += wd * mu_prev[l * L.Dv + j];
          }
          for (int64_t s = docs.ref(f, t); s <= t; ++s) {
            F A = 0;
            for (int64_t l = 0; l < L.L; ++l) A += pi[off + l] * P(t, s, l);
            const F* vs = vrow(s);
            for (int64_t j = 0; j < L.Dv; ++j) yt[j] += A * vs[j];
          }
        }
      }
    }
}

// docs/latte.md §4.2, chunks in reverse with the states R_l, r_l at the chunk's end e.
template <class F, bool kDocs>
void bwd_chunked(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse, const F* dy,
                 F* da, F* db, F* dv, F* dlocal) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T, C = L.chunk, N = (T + C - 1) / C, S = L.L * L.Dv;
  std::vector<F> lam(T * L.L), mu_start(N * S), pi(C * La), gP(C * La), R(S), r(L.L);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      auto bcol = [&](int64_t s, int64_t l) { return row(b, L.b, bb, s, h, L.L)[l]; };
      auto vrow = [&](int64_t s) { return row(v, L.v, bb, s, h, L.Dv); };
      auto gyrow = [&](int64_t t) { return row(dy, L.dy, bb, t, h, L.Dv); };
      const Docs<kDocs> docs = row_docs<kDocs>(L, bb);
      for (int64_t t = 0; t < T; ++t) std::copy_n(lse_row(lse, L, bb, t, h), L.L, &lam[t * L.L]);
      chunk_states(lam.data(), T, L.L, L.Dv, C, bcol, vrow, docs, mu_start.data(), static_cast<F*>(nullptr));
      std::fill(R.begin(), R.end(), F(0));
      std::fill(r.begin(), r.end(), F(0));
      for (int64_t n = N - 1; n >= 0; --n) {
        const int64_t f = n * C, e = std::min(T, f + C) - 1;
        const bool direct = needs_direct(lam.data(), L.L, f, e, docs);
        const ChunkProducts<F, decltype(bcol), kDocs> P{lam.data(), L.L, f, direct, bcol, docs};
        const F* mu_prev = &mu_start[n * S];
        // gP_{t,l} = dec (gy_t . mu_prev_l) + sum_{s<=t} P(t,s,l) (gy_t . v_s); softmax backward.
        for (int64_t t = f; t <= e; ++t) {
          F* pit = &pi[(t - f) * La];
          F* gPt = &gP[(t - f) * La];
          const F* gy = gyrow(t);
          softmax_row(row(a, L.a, bb, t, h, La), La, pit);
          if (L.local) {
            gPt[0] = dot(gy, row(local, L.local_s, bb, t, h, L.Dv), L.Dv);
            F* dl = row(dlocal, L.dlocal, bb, t, h, L.Dv);
            for (int64_t j = 0; j < L.Dv; ++j) dl[j] = pit[0] * gy[j];
          }
          for (int64_t l = 0; l < L.L; ++l)
            gPt[off + l] = decay_to(lam.data(), L.L, f, t, l, docs) * dot(gy, &mu_prev[l * L.Dv], L.Dv);
          for (int64_t s = docs.ref(f, t); s <= t; ++s) {
            const F M = dot(gy, vrow(s), L.Dv);
            for (int64_t l = 0; l < L.L; ++l) gPt[off + l] += P(t, s, l) * M;
          }
          softmax_bwd_row(pit, gPt, La, row(da, L.da, bb, t, h, La));
        }
        // dv_s = E R + sum_{t>=s} sum_l pi P gy_t;  db_{s,l} = E (v_s . R_l - r_l) + sum_{t>=s} pi P (M_ts - gP_t),
        // E = 0 for s before e's document (the states R, r hold later rows of e's document only), t
        // within s's document.
        for (int64_t s = f; s <= e; ++s) {
          const F* vs = vrow(s);
          F* dvs = row(dv, L.dv, bb, s, h, L.Dv);
          F* dbs = row(db, L.db, bb, s, h, L.L);
          for (int64_t j = 0; j < L.Dv; ++j) dvs[j] = 0;
          const bool in_last = s >= docs.first(e);
          for (int64_t l = 0; l < L.L; ++l) {
            const F E = in_last ? std::exp(bcol(s, l) - lam[e * L.L + l]) : F(0);
            for (int64_t j = 0; j < L.Dv; ++j) dvs[j] += E * R[l * L.Dv + j];
            dbs[l] = E * (dot(vs, &R[l * L.Dv], L.Dv) - r[l]);
          }
          for (int64_t t = s; t <= e && docs.first(t) <= s; ++t) {
            const F* gy = gyrow(t);
            const F M = dot(gy, vs, L.Dv);
            for (int64_t l = 0; l < L.L; ++l) {
              const F c = pi[(t - f) * La + off + l] * P(t, s, l);
              for (int64_t j = 0; j < L.Dv; ++j) dvs[j] += c * gy[j];
              dbs[l] += c * (M - gP[(t - f) * La + off + l]);
            }
          }
        }
        if (f == 0) break;
        // Move the states to f - 1: every factor exp(lse_{f-1} - lse_t) <= 1; only rows of f - 1's
        // document (those whose document began before the chunk) reach it.
        for (int64_t l = 0; l < L.L; ++l) {
          const F keep = docs.carried(f, e) ? std::exp(lam[(f - 1) * L.L + l] - lam[e * L.L + l]) : F(0);
          r[l] *= keep;
          for (int64_t j = 0; j < L.Dv; ++j) R[l * L.Dv + j] *= keep;
          for (int64_t t = f; t <= e && docs.carried(f, t); ++t) {
            const F w = std::exp(lam[(f - 1) * L.L + l] - lam[t * L.L + l]) * pi[(t - f) * La + off + l];
            r[l] += w * gP[(t - f) * La + off + l];
            const F* gy = gyrow(t);
            for (int64_t j = 0; j < L.Dv; ++j) R[l * L.Dv + j] += w * gy[j];
          }
        }
      }
    }
}

}  // namespace

template <class F>
void latte_fwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                           F* mu_final) {
  (L.docs.defined() ? fwd_chunked<F, true> : fwd_chunked<F, false>)(L, a, b, v, local, y, lse, mu_final);
}

template <class F>
void latte_bwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse,
                           const F* dy, F* da, F* db, F* dv, F* dlocal) {
  (L.docs.defined() ? bwd_chunked<F, true> : bwd_chunked<F, false>)(L, a, b, v, local, lse, dy, da, db, dv, dlocal);
}

#define LINAC_LATTE_CHUNKED_INSTANTIATE(F)                                                                        \
  template void latte_fwd_chunked_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, F*, F*, F*); \
  template void latte_bwd_chunked_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, const F*,   \
                                         const F*, F*, F*, F*, F*);
LINAC_LATTE_CHUNKED_INSTANTIATE(float)
LINAC_LATTE_CHUNKED_INSTANTIATE(double)
#undef LINAC_LATTE_CHUNKED_INSTANTIATE

}  // namespace linac
