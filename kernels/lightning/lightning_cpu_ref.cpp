// Lightning Attention CPU references (math in lightning.h), the oracles of the block form: recurrent and quadratic forms,
// forward and backward, and the decode step. Plain loops over one (batch, head) slice at a time;
// every decay factor is exp of a non-positive exponent. With documents the recurrence zeroes the
// state at each document start and the quadratic form sums over the token's document only.
#include <cmath>
#include <vector>

#include "common/cpu_dot.h"
#include "lightning/lightning.h"

namespace linac {

namespace {

// Row t of head h of batch b in a [B,T,H,D] view.
template <class P>
P* row(P* base, const LightningLayout::Strides& s, int64_t b, int64_t t, int64_t h, int64_t D) {
  return base + b * s.b + t * s.t + h * D;
}

template <class F>
F* state_of(F* s, const LightningLayout& L, int64_t b, int64_t h) {
  return s ? s + (b * L.H + h) * L.Dk * L.Dv : nullptr;
}

// Token t > 0 starts a document: the recurrence forgets the state there.
bool restarts(const LightningLayout& L, int64_t b, int64_t t) { return t > 0 && L.doc_start(b, t) == t; }

// The first token of the row's last document (0 for an empty row).
int64_t last_doc_start(const LightningLayout& L, int64_t b) { return L.T > 0 ? L.doc_start(b, L.T - 1) : 0; }

}  // namespace

// ---- recurrent ---------------------------------------------------------------------------------

template <class F>
void lightning_fwd_recurrent_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, F* o, F* s_final) {
  const int64_t Dk = L.Dk, Dv = L.Dv;
  std::vector<F> S(static_cast<size_t>(Dk * Dv));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F lam = std::exp(-decay[h]);
      const F* init = state_of(s0, L, b, h);
      for (int64_t e = 0; e < Dk * Dv; ++e) S[e] = init ? init[e] : F(0);
      for (int64_t t = 0; t < L.T; ++t) {
        const F* qt = row(q, L.q, b, t, h, Dk);
        const F* kt = row(k, L.k, b, t, h, Dk);
        const F* vt = row(v, L.v, b, t, h, Dv);
        F* ot = row(o, L.o, b, t, h, Dv);
        const F keep = restarts(L, b, t) ? F(0) : lam;
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] = keep * S[i * Dv + j] + kt[i] * vt[j];
        for (int64_t j = 0; j < Dv; ++j) {
          F acc = 0;
          for (int64_t i = 0; i < Dk; ++i) acc += qt[i] * S[i * Dv + j];
          ot[j] = acc;
        }
      }
      if (F* fin = state_of(s_final, L, b, h))
        for (int64_t e = 0; e < Dk * Dv; ++e) fin[e] = S[e];
    }
}

// Differentiates the recurrence: the forward states S_t are kept, then the state gradient
// R_t = dL/dS_t runs backwards: R_t = lambda R_t+1 + q_t^T do_t (R_T-1 starts from ds_final;
// no lambda R_t+1 term where token t+1 starts a document).
template <class F>
void lightning_bwd_recurrent_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0) {
  const int64_t Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  std::vector<F> S(static_cast<size_t>(L.T * SS)), R(static_cast<size_t>(SS));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F lam = std::exp(-decay[h]);
      const F* init = state_of(s0, L, b, h);
      for (int64_t t = 0; t < L.T; ++t) {
        const F* kt = row(k, L.k, b, t, h, Dk);
        const F* vt = row(v, L.v, b, t, h, Dv);
        const bool restart = restarts(L, b, t);
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) {
            const F prev = restart ? F(0) : t > 0 ? S[(t - 1) * SS + i * Dv + j] : init ? init[i * Dv + j] : F(0);
            S[t * SS + i * Dv + j] = lam * prev + kt[i] * vt[j];
          }
      }
      const F* dsf = state_of(ds_final, L, b, h);
      for (int64_t e = 0; e < SS; ++e) R[e] = dsf ? dsf[e] : F(0);
      for (int64_t t = L.T - 1; t >= 0; --t) {
        const F* qt = row(q, L.q, b, t, h, Dk);
        const F* kt = row(k, L.k, b, t, h, Dk);
        const F* vt = row(v, L.v, b, t, h, Dv);
        const F* dot_ = row(dout, L.dout, b, t, h, Dv);
        if (t < L.T - 1) {
          const F keep = restarts(L, b, t + 1) ? F(0) : lam;
          for (int64_t e = 0; e < SS; ++e) R[e] *= keep;
        }
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) R[i * Dv + j] += qt[i] * dot_[j];
        F* dqt = row(dq, L.dq, b, t, h, Dk);
        F* dkt = row(dk, L.dk, b, t, h, Dk);
        F* dvt = row(dv, L.dv, b, t, h, Dv);
        for (int64_t i = 0; i < Dk; ++i) {
          F aq = 0, ak = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            aq += S[t * SS + i * Dv + j] * dot_[j];
            ak += R[i * Dv + j] * vt[j];
          }
          dqt[i] = aq, dkt[i] = ak;
        }
        for (int64_t j = 0; j < Dv; ++j) {
          F acc = 0;
          for (int64_t i = 0; i < Dk; ++i) acc += R[i * Dv + j] * kt[i];
          dvt[j] = acc;
        }
      }
      if (F* d0 = state_of(ds0, L, b, h))
        for (int64_t e = 0; e < SS; ++e) d0[e] = L.T > 0 ? lam * R[e] : R[e];
    }
}

// ---- quadratic -----------------------------------------------------------------------------------

template <class F>
void lightning_fwd_quadratic_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, F* o, F* s_final) {
  const int64_t Dk = L.Dk, Dv = L.Dv, T = L.T;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F s = decay[h];
      const F* init = state_of(s0, L, b, h);
      for (int64_t t = 0; t < T; ++t) {
        const F* qt = row(q, L.q, b, t, h, Dk);
        F* ot = row(o, L.o, b, t, h, Dv);
        const int64_t lo = L.doc_start(b, t);
        for (int64_t j = 0; j < Dv; ++j) ot[j] = 0;
        for (int64_t u = lo; u <= t; ++u) {
          const F p = std::exp(-s * F(t - u)) * dot(qt, row(k, L.k, b, u, h, Dk), Dk);
          const F* vu = row(v, L.v, b, u, h, Dv);
          for (int64_t j = 0; j < Dv; ++j) ot[j] += p * vu[j];
        }
        if (init && lo == 0) {
          const F a = std::exp(-s * F(t + 1));
          for (int64_t i = 0; i < Dk; ++i)
            for (int64_t j = 0; j < Dv; ++j) ot[j] += a * qt[i] * init[i * Dv + j];
        }
      }
      if (F* fin = state_of(s_final, L, b, h)) {
        const int64_t lo = last_doc_start(L, b);
        const F g = std::exp(-s * F(T));
        for (int64_t e = 0; e < Dk * Dv; ++e) fin[e] = init && lo == 0 ? g * init[e] : F(0);
        for (int64_t u = lo; u < T; ++u) {
          const F c = std::exp(-s * F(T - 1 - u));
          const F* ku = row(k, L.k, b, u, h, Dk);
          const F* vu = row(v, L.v, b, u, h, Dv);
          for (int64_t i = 0; i < Dk; ++i)
            for (int64_t j = 0; j < Dv; ++j) fin[i * Dv + j] += c * ku[i] * vu[j];
        }
      }
    }
}

// Closed-form gradients of the quadratic form (docs/transnormer.md §4.1) plus the s0 / s_final terms.
template <class F>
void lightning_bwd_quadratic_cpu(const LightningLayout& L, const F* q, const F* k, const F* v, const F* decay,
                                 const F* s0, const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* ds0) {
  const int64_t Dk = L.Dk, Dv = L.Dv, T = L.T;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F s = decay[h];
      const F* init = state_of(s0, L, b, h);
      const F* dsf = state_of(ds_final, L, b, h);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < Dk; ++i) row(dq, L.dq, b, t, h, Dk)[i] = row(dk, L.dk, b, t, h, Dk)[i] = 0;
        for (int64_t j = 0; j < Dv; ++j) row(dv, L.dv, b, t, h, Dv)[j] = 0;
      }
      for (int64_t t = 0; t < T; ++t) {
        const F* qt = row(q, L.q, b, t, h, Dk);
        const F* dot_ = row(dout, L.dout, b, t, h, Dv);
        F* dqt = row(dq, L.dq, b, t, h, Dk);
        const int64_t lo = L.doc_start(b, t);
        for (int64_t u = lo; u <= t; ++u) {
          const F d = std::exp(-s * F(t - u));
          const F* ku = row(k, L.k, b, u, h, Dk);
          const F* vu = row(v, L.v, b, u, h, Dv);
          const F dp = d * dot(dot_, vu, Dv), p = d * dot(qt, ku, Dk);
          F* dku = row(dk, L.dk, b, u, h, Dk);
          F* dvu = row(dv, L.dv, b, u, h, Dv);
          for (int64_t i = 0; i < Dk; ++i) dqt[i] += dp * ku[i], dku[i] += dp * qt[i];
          for (int64_t j = 0; j < Dv; ++j) dvu[j] += p * dot_[j];
        }
        if (init && lo == 0) {
          const F a = std::exp(-s * F(t + 1));
          for (int64_t i = 0; i < Dk; ++i) dqt[i] += a * dot(init + i * Dv, dot_, Dv);
        }
      }
      const int64_t last_lo = last_doc_start(L, b);
      if (dsf)
        for (int64_t u = last_lo; u < T; ++u) {
          const F c = std::exp(-s * F(T - 1 - u));
          const F* ku = row(k, L.k, b, u, h, Dk);
          const F* vu = row(v, L.v, b, u, h, Dv);
          F* dku = row(dk, L.dk, b, u, h, Dk);
          F* dvu = row(dv, L.dv, b, u, h, Dv);
          for (int64_t i = 0; i < Dk; ++i) dku[i] += c * dot(dsf + i * Dv, vu, Dv);
          for (int64_t j = 0; j < Dv; ++j)
            for (int64_t i = 0; i < Dk; ++i) dvu[j] += c * ku[i] * dsf[i * Dv + j];
        }
      if (F* d0 = state_of(ds0, L, b, h)) {
        const F g = std::exp(-s * F(T));
        for (int64_t e = 0; e < Dk * Dv; ++e) d0[e] = dsf && last_lo == 0 ? g * dsf[e] : F(0);
        for (int64_t t = 0; t < T && L.doc_start(b, t) == 0; ++t) {
          const F a = std::exp(-s * F(t + 1));
          const F* qt = row(q, L.q, b, t, h, Dk);
          const F* dot_ = row(dout, L.dout, b, t, h, Dv);
          for (int64_t i = 0; i < Dk; ++i)
            for (int64_t j = 0; j < Dv; ++j) d0[i * Dv + j] += a * qt[i] * dot_[j];
        }
      }
    }
}

// ---- decode step ---------------------------------------------------------------------------------

template <class F>
void lightning_step_cpu(const LightningStepLayout& L, const F* q, const F* k, const F* v, const F* decay, F* state,
                        F* o) {
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const F lam = std::exp(-decay[h]);
      const F* qb = q + b * L.q + h * L.Dk;
      const F* kb = k + b * L.k + h * L.Dk;
      const F* vb = v + b * L.v + h * L.Dv;
      F* ob = o + b * L.o + h * L.Dv;
      F* S = state + (b * L.H + h) * L.Dk * L.Dv;
      for (int64_t j = 0; j < L.Dv; ++j) {
        F acc = 0;
        for (int64_t i = 0; i < L.Dk; ++i) {
          F& sij = S[i * L.Dv + j];
          sij = lam * sij + kb[i] * vb[j];
          acc += qb[i] * sij;
        }
        ob[j] = acc;
      }
    }
}

#define LINAC_LIGHTNING_INSTANTIATE(F)                                                                              \
  template void lightning_fwd_recurrent_cpu<F>(const LightningLayout&, const F*, const F*, const F*, const F*,      \
                                               const F*, F*, F*);                                                   \
  template void lightning_bwd_recurrent_cpu<F>(const LightningLayout&, const F*, const F*, const F*, const F*,      \
                                               const F*, const F*, const F*, F*, F*, F*, F*);                       \
  template void lightning_fwd_quadratic_cpu<F>(const LightningLayout&, const F*, const F*, const F*, const F*,      \
                                               const F*, F*, F*);                                                   \
  template void lightning_bwd_quadratic_cpu<F>(const LightningLayout&, const F*, const F*, const F*, const F*,      \
                                               const F*, const F*, const F*, F*, F*, F*, F*);                       \
  template void lightning_step_cpu<F>(const LightningStepLayout&, const F*, const F*, const F*, const F*, F*, F*);
LINAC_LIGHTNING_INSTANTIATE(float)
LINAC_LIGHTNING_INSTANTIATE(double)
#undef LINAC_LIGHTNING_INSTANTIATE

}  // namespace linac
