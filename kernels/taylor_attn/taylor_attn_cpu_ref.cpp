// CPU Taylor attention in its quadratic and recurrent forms (math in taylor_attn.h): the ground
// truths the chunked form and the CUDA kernels are checked against. The quadratic form never
// builds the feature map (it evaluates kappa(u) directly, docs/based.md §2.4 / §6.2); the recurrent form
// never builds the T x T matrix (state updates token by token, docs/based.md §7.1, and its derivative).
// Documents: the quadratic form sums over s in [start, t]; the recurrent one empties its state at
// every document start (the reverse sweep after it).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_dot.h"
#include "taylor_attn/taylor_attn.h"
#include "taylor_attn/taylor_attn_cpu_common.h"

namespace linac {

namespace {

template <class Fl>
using Vec = std::vector<Fl>;

using taylor_cpu::Pair;

// u_ts = (q_t . k_s) / sqrt(F) on raw q, k.
template <class Fl>
Fl score(const TaylorAttnLayout& L, const Pair& p, const Fl* q, const Fl* k, int64_t t, int64_t s) {
  return dot(p.row(q, L.q, t, L.F), p.row(k, L.k, s, L.F), L.F) / static_cast<Fl>(std::sqrt(static_cast<double>(L.F)));
}

// Sum over s of phi(k_s) v~_s^T (the state after all tokens of the last document), for s_final.
template <class Fl>
void final_state(const TaylorAttnLayout& L, const Pair& p, const Fl* k, const Fl* v, Fl* S) {
  const int64_t R = taylor_attn_state_rows(L.F), W = L.Dv + 1;
  Vec<Fl> phi(static_cast<size_t>(R));
  std::fill(S, S + R * W, Fl(0));
  for (int64_t s = L.T > 0 ? L.start(p.b, L.T - 1) : 0; s < L.T; ++s) {
    taylor_feature_map_cpu(L.F, p.row(k, L.k, s, L.F), phi.data());
    const Fl* vs = p.row(v, L.v, s, L.Dv);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < L.Dv; ++j) S[r * W + j] += phi[r] * vs[j];
      S[r * W + L.Dv] += phi[r];
    }
  }
}

}  // namespace

template <class Fl>
void taylor_attn_fwd_quadratic_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                                   Fl* s_final) {
  const int64_t Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(L.F);
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    Vec<Fl> num(static_cast<size_t>(Dv));
    for (int64_t t = 0; t < L.T; ++t) {
      std::fill(num.begin(), num.end(), Fl(0));
      Fl d = 0;
      for (int64_t s = L.start(p.b, t); s <= t; ++s) {
        const Fl u = score(L, p, q, k, t, s), a = 1 + u + u * u / 2;
        const Fl* vs = p.row(v, L.v, s, Dv);
        for (int64_t j = 0; j < Dv; ++j) num[j] += a * vs[j];
        d += a;
      }
      d += static_cast<Fl>(L.eps);
      den[bh * L.T + t] = d;
      Fl* ot = p.row(o, L.o, t, Dv);
      for (int64_t j = 0; j < Dv; ++j) ot[j] = num[j] / d;
    }
    if (s_final) final_state(L, p, k, v, s_final + bh * R * W);
  }
}

template <class Fl>
void taylor_attn_bwd_quadratic_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                                   const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1;
  const Fl inv_sqrt_f = static_cast<Fl>(1 / std::sqrt(static_cast<double>(F)));
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    for (int64_t t = 0; t < L.T; ++t) {
      std::fill(p.row(dq, L.dq, t, F), p.row(dq, L.dq, t, F) + F, Fl(0));
      std::fill(p.row(dk, L.dk, t, F), p.row(dk, L.dk, t, F) + F, Fl(0));
      std::fill(p.row(dv, L.dv, t, Dv), p.row(dv, L.dv, t, Dv) + Dv, Fl(0));
    }
    Vec<Fl> g(static_cast<size_t>(W));
    for (int64_t t = 0; t < L.T; ++t) {
      taylor_attn_out_grad_cpu(Dv, p.row(o, L.o, t, Dv), den[bh * L.T + t], p.row(dout, L.dout, t, Dv), g.data());
      for (int64_t s = L.start(p.b, t); s <= t; ++s) {
        const Fl* vs = p.row(v, L.v, s, Dv);
        const Fl u = score(L, p, q, k, t, s), a = 1 + u + u * u / 2;
        const Fl P = dot(g.data(), vs, Dv) + g[Dv];  // g~_t . v~_s
        const Fl du = P * (1 + u) * inv_sqrt_f;      // dL/d(q_t . k_s)
        Fl* dqt = p.row(dq, L.dq, t, F);
        Fl* dks = p.row(dk, L.dk, s, F);
        const Fl *qt = p.row(q, L.q, t, F), *ks = p.row(k, L.k, s, F);
        for (int64_t i = 0; i < F; ++i) {
          dqt[i] += du * ks[i];
          dks[i] += du * qt[i];
        }
        Fl* dvs = p.row(dv, L.dv, s, Dv);
        for (int64_t j = 0; j < Dv; ++j) dvs[j] += a * g[j];
      }
    }
  }
}

template <class Fl>
void taylor_attn_fwd_recurrent_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                                   Fl* s_final) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(F);
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    Vec<Fl> S(static_cast<size_t>(R * W), Fl(0)), phik(static_cast<size_t>(R)), phiq(static_cast<size_t>(R));
    Vec<Fl> ot(static_cast<size_t>(W));
    for (int64_t t = 0; t < L.T; ++t) {
      if (L.doc_start && L.start(p.b, t) == t) std::fill(S.begin(), S.end(), Fl(0));
      taylor_feature_map_cpu(F, p.row(k, L.k, t, F), phik.data());
      taylor_feature_map_cpu(F, p.row(q, L.q, t, F), phiq.data());
      const Fl* vt = p.row(v, L.v, t, Dv);
      std::fill(ot.begin(), ot.end(), Fl(0));
      for (int64_t r = 0; r < R; ++r) {  // S += phi(k) v~^T, then o~ = S^T phi(q) (inclusive)
        Fl* Sr = &S[r * W];
        for (int64_t j = 0; j < Dv; ++j) Sr[j] += phik[r] * vt[j];
        Sr[Dv] += phik[r];
        for (int64_t j = 0; j < W; ++j) ot[j] += phiq[r] * Sr[j];
      }
      const Fl d = ot[Dv] + static_cast<Fl>(L.eps);
      den[bh * L.T + t] = d;
      Fl* orow = p.row(o, L.o, t, Dv);
      for (int64_t j = 0; j < Dv; ++j) orow[j] = ot[j] / d;
    }
    if (s_final) std::copy(S.begin(), S.end(), s_final + bh * R * W);
  }
}

// The recurrence's derivative: dL/dphi(q^_t) = S_t g~_t with the inclusive S_t (forward sweep);
// dS_t = sum_{t' >= t} phi(q^_t') g~_t'^T (backward sweep) gives dL/dphi(k^_t) = dS_t v~_t and
// dv~_t = dS_t^T phi(k^_t).
template <class Fl>
void taylor_attn_bwd_recurrent_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                                   const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(F);
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    Vec<Fl> S(static_cast<size_t>(R * W), Fl(0)), phi(static_cast<size_t>(R)), G(static_cast<size_t>(R));
    Vec<Fl> g(static_cast<size_t>(W)), vt(static_cast<size_t>(W)), dvt(static_cast<size_t>(W));
    auto load = [&](int64_t t) {
      taylor_attn_out_grad_cpu(Dv, p.row(o, L.o, t, Dv), den[bh * L.T + t], p.row(dout, L.dout, t, Dv), g.data());
      std::copy(p.row(v, L.v, t, Dv), p.row(v, L.v, t, Dv) + Dv, vt.begin());
      vt[Dv] = 1;
    };
    for (int64_t t = 0; t < L.T; ++t) {
      if (L.doc_start && L.start(p.b, t) == t) std::fill(S.begin(), S.end(), Fl(0));
      load(t);
      taylor_feature_map_cpu(F, p.row(k, L.k, t, F), phi.data());
      for (int64_t r = 0; r < R; ++r) {
        Fl* Sr = &S[r * W];
        for (int64_t j = 0; j < W; ++j) Sr[j] += phi[r] * vt[j];
        G[r] = dot(Sr, g.data(), W);
      }
      Fl* dqt = p.row(dq, L.dq, t, F);
      std::fill(dqt, dqt + F, Fl(0));
      taylor_feature_map_grad_cpu(F, p.row(q, L.q, t, F), G.data(), dqt);
    }
    std::fill(S.begin(), S.end(), Fl(0));
    for (int64_t t = L.T - 1; t >= 0; --t) {
      if (L.doc_start && t + 1 < L.T && L.start(p.b, t + 1) == t + 1) std::fill(S.begin(), S.end(), Fl(0));
      load(t);
      taylor_feature_map_cpu(F, p.row(q, L.q, t, F), phi.data());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < W; ++j) S[r * W + j] += phi[r] * g[j];
      taylor_feature_map_cpu(F, p.row(k, L.k, t, F), phi.data());
      std::fill(dvt.begin(), dvt.end(), Fl(0));
      for (int64_t r = 0; r < R; ++r) {
        G[r] = dot(&S[r * W], vt.data(), W);
        for (int64_t j = 0; j < W; ++j) dvt[j] += phi[r] * S[r * W + j];
      }
      Fl* dkt = p.row(dk, L.dk, t, F);
      std::fill(dkt, dkt + F, Fl(0));
      taylor_feature_map_grad_cpu(F, p.row(k, L.k, t, F), G.data(), dkt);
      std::copy(dvt.begin(), dvt.begin() + Dv, p.row(dv, L.dv, t, Dv));
    }
  }
}

#define LINAC_TAYLOR_REF(Fl)                                                                                         \
  template void taylor_attn_fwd_quadratic_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*, Fl*,    \
                                                  Fl*, Fl*);                                                         \
  template void taylor_attn_fwd_recurrent_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*, Fl*,    \
                                                  Fl*, Fl*);                                                         \
  template void taylor_attn_bwd_quadratic_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*,         \
                                                  const Fl*, const Fl*, const Fl*, Fl*, Fl*, Fl*);                   \
  template void taylor_attn_bwd_recurrent_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*,         \
                                                  const Fl*, const Fl*, const Fl*, Fl*, Fl*, Fl*);
LINAC_TAYLOR_REF(float)
LINAC_TAYLOR_REF(double)
#undef LINAC_TAYLOR_REF

}  // namespace linac
