// Latte CPU chunked form (the form the CPU trains with; math in latte.h, docs/latte.md §3 and §4.2), forward and backward;
// plain loops, float/double. Per chunk f..e the products exp(b_s - lse_t) are factorised at the
// reference lse_f as exp(lse_f - lse_t) * exp(b_s - lse_f); a chunk whose lse grows by more than
// kMaxGrowth forms them directly (docs/latte.md §3.3: the second factor would overflow f32 near 88).
#include "latte/latte_cpu_common.h"

namespace linac {

using namespace latte_cpu;

namespace {

constexpr double kMaxGrowth = 60.0;

// exp(b_s - lse_t) for s <= t in one chunk, in the factorised form unless the chunk's lse grows
// too much. lam: the (b, h) slice's lse rows [T, L]; bcol(s, l) reads b.
template <class F, class BCol>
struct ChunkProducts {
  const F* lam;
  int64_t L, f;
  bool direct;
  BCol bcol;
  F operator()(int64_t t, int64_t s, int64_t l) const {
    if (direct) return std::exp(bcol(s, l) - lam[t * L + l]);
    const F ref = lam[f * L + l];
    return std::exp(ref - lam[t * L + l]) * std::exp(bcol(s, l) - ref);
  }
};

template <class F>
bool needs_direct(const F* lam, int64_t L, int64_t f, int64_t e) {
  F growth = 0;
  for (int64_t l = 0; l < L; ++l) growth = std::max(growth, lam[e * L + l] - lam[f * L + l]);
  return growth > F(kMaxGrowth);
}

// mu at the start of every chunk of one (b, h) slice (mu_start [N, L, Dv]) and after the last
// token (mu_end [L, Dv]): mu_e = exp(lse_{f-1} - lse_e) mu_{f-1} + sum_s exp(b_s - lse_e) v_s.
template <class F, class BCol, class VRow>
void chunk_states(const F* lam, int64_t T, int64_t L, int64_t Dv, int64_t C, BCol bcol, VRow vrow, F* mu_start,
                  F* mu_end) {
  std::vector<F> mu(L * Dv, F(0));
  for (int64_t f = 0, n = 0; f < T; f += C, ++n) {
    const int64_t e = std::min(T, f + C) - 1;
    std::copy(mu.begin(), mu.end(), mu_start + n * L * Dv);
    for (int64_t l = 0; l < L; ++l) {
      const F keep = f == 0 ? F(0) : std::exp(lam[(f - 1) * L + l] - lam[e * L + l]);
      for (int64_t j = 0; j < Dv; ++j) mu[l * Dv + j] *= keep;
      for (int64_t s = f; s <= e; ++s) {
        const F w = std::exp(bcol(s, l) - lam[e * L + l]);
        const F* vs = vrow(s);
        for (int64_t j = 0; j < Dv; ++j) mu[l * Dv + j] += w * vs[j];
      }
    }
  }
  if (mu_end) std::copy(mu.begin(), mu.end(), mu_end);
}

// dec_{t,l} = exp(lse_{f-1} - lse_t), 0 in the first chunk.
template <class F>
F decay_to(const F* lam, int64_t L, int64_t f, int64_t t, int64_t l) {
  return f == 0 ? F(0) : std::exp(lam[(f - 1) * L + l] - lam[t * L + l]);
}

}  // namespace

template <class F>
void latte_fwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, F* y, F* lse,
                           F* mu_final) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T, C = L.chunk, N = (T + C - 1) / C;
  std::vector<F> lam(T * L.L), mu_start(N * L.L * L.Dv), pi(La);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      auto bcol = [&](int64_t s, int64_t l) { return row(b, L.b, bb, s, h, L.L)[l]; };
      auto vrow = [&](int64_t s) { return row(v, L.v, bb, s, h, L.Dv); };
      for (int64_t t = 0; t < T; ++t)
        for (int64_t l = 0; l < L.L; ++l) {
          const F prev = t == 0 ? neg_inf<F>() : lam[(t - 1) * L.L + l];
          lse_row(lse, L, bb, t, h)[l] = lam[t * L.L + l] = logaddexp(prev, bcol(t, l));
        }
      chunk_states(lam.data(), T, L.L, L.Dv, C, bcol, vrow, mu_start.data(),
                   mu_final ? mu_final + (bb * L.H + h) * L.L * L.Dv : nullptr);
      for (int64_t f = 0, n = 0; f < T; f += C, ++n) {
        const int64_t e = std::min(T, f + C) - 1;
        const ChunkProducts<F, decltype(bcol)> P{lam.data(), L.L, f, needs_direct(lam.data(), L.L, f, e), bcol};
        const F* mu_prev = &mu_start[n * L.L * L.Dv];
        for (int64_t t = f; t <= e; ++t) {
          softmax_row(row(a, L.a, bb, t, h, La), La, pi.data());
          F* yt = row(y, L.y, bb, t, h, L.Dv);
          for (int64_t j = 0; j < L.Dv; ++j) yt[j] = L.local ? pi[0] * row(local, L.local_s, bb, t, h, L.Dv)[j] : F(0);
          for (int64_t l = 0; l < L.L; ++l) {
            const F wd = pi[off + l] * decay_to(lam.data(), L.L, f, t, l);
            for (int64_t j = 0; j < L.Dv; ++j) yt[j] += wd * mu_prev[l * L.Dv + j];
          }
          for (int64_t s = f; s <= t; ++s) {
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
template <class F>
void latte_bwd_chunked_cpu(const LatteLayout& L, const F* a, const F* b, const F* v, const F* local, const F* lse,
                           const F* dy, F* da, F* db, F* dv, F* dlocal) {
  const int64_t La = L.La(), off = L.local ? 1 : 0, T = L.T, C = L.chunk, N = (T + C - 1) / C, S = L.L * L.Dv;
  std::vector<F> lam(T * L.L), mu_start(N * S), pi(C * La), gP(C * La), R(S), r(L.L);
  for (int64_t bb = 0; bb < L.B; ++bb)
    for (int64_t h = 0; h < L.H; ++h) {
      auto bcol = [&](int64_t s, int64_t l) { return row(b, L.b, bb, s, h, L.L)[l]; };
      auto vrow = [&](int64_t s) { return row(v, L.v, bb, s, h, L.Dv); };
      auto gyrow = [&](int64_t t) { return row(dy, L.dy, bb, t, h, L.Dv); };
      for (int64_t t = 0; t < T; ++t) std::copy_n(lse_row(lse, L, bb, t, h), L.L, &lam[t * L.L]);
      chunk_states(lam.data(), T, L.L, L.Dv, C, bcol, vrow, mu_start.data(), static_cast<F*>(nullptr));
      std::fill(R.begin(), R.end(), F(0));
      std::fill(r.begin(), r.end(), F(0));
      for (int64_t n = N - 1; n >= 0; --n) {
        const int64_t f = n * C, e = std::min(T, f + C) - 1;
        const ChunkProducts<F, decltype(bcol)> P{lam.data(), L.L, f, needs_direct(lam.data(), L.L, f, e), bcol};
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
            gPt[off + l] = decay_to(lam.data(), L.L, f, t, l) * dot(gy, &mu_prev[l * L.Dv], L.Dv);
          for (int64_t s = f; s <= t; ++s) {
            const F M = dot(gy, vrow(s), L.Dv);
            for (int64_t l = 0; l < L.L; ++l) gPt[off + l] += P(t, s, l) * M;
          }
          softmax_bwd_row(pit, gPt, La, row(da, L.da, bb, t, h, La));
        }
        // dv_s = E R + sum_{t>=s} sum_l pi P gy_t;  db_{s,l} = E (v_s . R_l - r_l) + sum_{t>=s} pi P (M_ts - gP_t).
        for (int64_t s = f; s <= e; ++s) {
          const F* vs = vrow(s);
          F* dvs = row(dv, L.dv, bb, s, h, L.Dv);
          F* dbs = row(db, L.db, bb, s, h, L.L);
          for (int64_t j = 0; j < L.Dv; ++j) dvs[j] = 0;
          for (int64_t l = 0; l < L.L; ++l) {
            const F E = std::exp(bcol(s, l) - lam[e * L.L + l]);
            for (int64_t j = 0; j < L.Dv; ++j) dvs[j] += E * R[l * L.Dv + j];
            dbs[l] = E * (dot(vs, &R[l * L.Dv], L.Dv) - r[l]);
          }
          for (int64_t t = s; t <= e; ++t) {
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
        // Move the states to f - 1: every factor exp(lse_{f-1} - lse_t) <= 1.
        for (int64_t l = 0; l < L.L; ++l) {
          const F keep = std::exp(lam[(f - 1) * L.L + l] - lam[e * L.L + l]);
          r[l] *= keep;
          for (int64_t j = 0; j < L.Dv; ++j) R[l * L.Dv + j] *= keep;
          for (int64_t t = f; t <= e; ++t) {
            const F w = std::exp(lam[(f - 1) * L.L + l] - lam[t * L.L + l]) * pi[(t - f) * La + off + l];
            r[l] += w * gP[(t - f) * La + off + l];
            const F* gy = gyrow(t);
            for (int64_t j = 0; j < L.Dv; ++j) R[l * L.Dv + j] += w * gy[j];
          }
        }
      }
    }
}

#define LINAC_LATTE_CHUNKED_INSTANTIATE(F)                                                                        \
  template void latte_fwd_chunked_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, F*, F*, F*); \
  template void latte_bwd_chunked_cpu<F>(const LatteLayout&, const F*, const F*, const F*, const F*, const F*,   \
                                         const F*, F*, F*, F*, F*);
LINAC_LATTE_CHUNKED_INSTANTIATE(float)
LINAC_LATTE_CHUNKED_INSTANTIATE(double)
#undef LINAC_LATTE_CHUNKED_INSTANTIATE

}  // namespace linac
