// CPU references for GLA in its recurrent and fully parallel (quadratic) forms, forward and
// backward (math in gla.h). They exist to check the chunkwise form and the GPU against: plain
// loops, one (batch, head) pair per OpenMP task, no result depending on the thread count. Each
// backward differentiates its own form directly, including the gate:
//   recurrent: dg_t[i] = sum_j dS_t[i,j] alpha_t[i] S_{t-1}[i,j]  (from S_t = alpha_t S_{t-1} + ...)
//   parallel:  dL/da_t from every exp(a_t - a_s) factor (+ for the reader t, - for the writer s),
//              then dg_t = sum_{t'>=t} dL/da_t'
// so neither relies on the closed form (q*dq - k*dk) that the chunkwise backward uses.
#include <cmath>
#include <vector>

#include "gla/gla.h"

namespace linac {

namespace {

constexpr int64_t kParallelWork = int64_t{1} << 20;  // multiply-adds below which one thread is faster

// Pointers to the rows of one (b, h) pair.
template <class F>
struct Rows {
  int64_t b, h;
  const F* at(const F* base, const GlaLayout::Strides& s, int64_t t, int64_t D) const {
    return base + b * s.b + t * s.t + h * D;
  }
  F* at(F* base, const GlaLayout::Strides& s, int64_t t, int64_t D) const { return base + b * s.b + t * s.t + h * D; }
};

}  // namespace

template <class F>
void gla_fwd_recurrent_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                           F* s_final) {
  const int64_t T = L.T, Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * T * SS > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Rows<F> R{bh / L.H, bh % L.H};
    std::vector<F> S(static_cast<size_t>(SS), F(0));
    if (s0) S.assign(s0 + bh * SS, s0 + (bh + 1) * SS);
    for (int64_t t = 0; t < T; ++t) {
      const F *qt = R.at(q, L.q, t, Dk), *kt = R.at(k, L.k, t, Dk), *vt = R.at(v, L.v, t, Dv), *gt = R.at(g, L.g, t, Dk);
      for (int64_t i = 0; i < Dk; ++i) {
        const F a = std::exp(gt[i]);
        for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] = a * S[i * Dv + j] + kt[i] * vt[j];
      }
      F* ot = R.at(o, L.o, t, Dv);
      for (int64_t j = 0; j < Dv; ++j) {
        F acc = 0;
        for (int64_t i = 0; i < Dk; ++i) acc += qt[i] * S[i * Dv + j];
        ot[j] = scale * acc;
      }
    }
    if (s_final)
      for (int64_t e = 0; e < SS; ++e) s_final[bh * SS + e] = S[e];
  }
}

template <class F>
void gla_bwd_recurrent_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                           const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0) {
  const int64_t T = L.T, Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * T * SS > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Rows<F> R{bh / L.H, bh % L.H};
    // Every state S_0 .. S_T: the backward of the recurrence needs S_{t-1} at step t.
    std::vector<F> S(static_cast<size_t>((T + 1) * SS), F(0));
    if (s0)
      for (int64_t e = 0; e < SS; ++e) S[e] = s0[bh * SS + e];
    for (int64_t t = 0; t < T; ++t) {
      const F *kt = R.at(k, L.k, t, Dk), *vt = R.at(v, L.v, t, Dv), *gt = R.at(g, L.g, t, Dk);
      const F* prev = S.data() + t * SS;
      F* cur = S.data() + (t + 1) * SS;
      for (int64_t i = 0; i < Dk; ++i) {
        const F a = std::exp(gt[i]);
        for (int64_t j = 0; j < Dv; ++j) cur[i * Dv + j] = a * prev[i * Dv + j] + kt[i] * vt[j];
      }
    }
    std::vector<F> dS(static_cast<size_t>(SS), F(0));
    if (ds_final) dS.assign(ds_final + bh * SS, ds_final + (bh + 1) * SS);
    for (int64_t t = T - 1; t >= 0; --t) {
      const F *qt = R.at(q, L.q, t, Dk), *kt = R.at(k, L.k, t, Dk), *vt = R.at(v, L.v, t, Dv), *gt = R.at(g, L.g, t, Dk);
      const F* dot = R.at(dout, L.dout, t, Dv);
      const F* St = S.data() + (t + 1) * SS;
      const F* Sp = S.data() + t * SS;
      F *dqt = R.at(dq, L.dq, t, Dk), *dkt = R.at(dk, L.dk, t, Dk), *dvt = R.at(dv, L.dv, t, Dv), *dgt = R.at(dg, L.dg, t, Dk);
      for (int64_t i = 0; i < Dk; ++i) {
        F acc = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          acc += dot[j] * St[i * Dv + j];
          dS[i * Dv + j] += scale * qt[i] * dot[j];  // o_t = scale q_t S_t
        }
        dqt[i] = scale * acc;
      }
      for (int64_t j = 0; j < Dv; ++j) dvt[j] = 0;
      for (int64_t i = 0; i < Dk; ++i) {
        const F a = std::exp(gt[i]);
        F acc_k = 0, acc_g = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          const F d = dS[i * Dv + j];
          acc_k += d * vt[j];
          acc_g += d * Sp[i * Dv + j];
          dvt[j] += kt[i] * d;
          dS[i * Dv + j] = a * d;  // now the gradient of S_{t-1}
        }
        dkt[i] = acc_k;
        dgt[i] = a * acc_g;
      }
    }
    if (ds0)
      for (int64_t e = 0; e < SS; ++e) ds0[bh * SS + e] = dS[e];
  }
}

template <class F>
void gla_fwd_parallel_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                          F* s_final) {
  const int64_t T = L.T, Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * T * T * (Dk + Dv) > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Rows<F> R{bh / L.H, bh % L.H};
    std::vector<F> a(static_cast<size_t>(T * Dk));  // global inclusive cumsum of g
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < Dk; ++i) a[t * Dk + i] = (t ? a[(t - 1) * Dk + i] : F(0)) + R.at(g, L.g, t, Dk)[i];
    for (int64_t t = 0; t < T; ++t) {
      const F* qt = R.at(q, L.q, t, Dk);
      F* ot = R.at(o, L.o, t, Dv);
      for (int64_t j = 0; j < Dv; ++j) ot[j] = 0;
      for (int64_t s = 0; s <= t; ++s) {  // only s <= t: the exponents of s > t are positive
        const F* ks = R.at(k, L.k, s, Dk);
        F p = 0;
        for (int64_t i = 0; i < Dk; ++i) p += qt[i] * ks[i] * std::exp(a[t * Dk + i] - a[s * Dk + i]);
        const F* vs = R.at(v, L.v, s, Dv);
        for (int64_t j = 0; j < Dv; ++j) ot[j] += scale * p * vs[j];
      }
      if (s0)
        for (int64_t i = 0; i < Dk; ++i) {
          const F w = scale * qt[i] * std::exp(a[t * Dk + i]);
          for (int64_t j = 0; j < Dv; ++j) ot[j] += w * s0[bh * SS + i * Dv + j];
        }
    }
    if (s_final && T > 0) {
      const F* aT = &a[(T - 1) * Dk];
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) {
          F acc = s0 ? std::exp(aT[i]) * s0[bh * SS + i * Dv + j] : F(0);
          for (int64_t s = 0; s < T; ++s)
            acc += R.at(k, L.k, s, Dk)[i] * std::exp(aT[i] - a[s * Dk + i]) * R.at(v, L.v, s, Dv)[j];
          s_final[bh * SS + i * Dv + j] = acc;
        }
    } else if (s_final) {
      for (int64_t e = 0; e < SS; ++e) s_final[bh * SS + e] = s0 ? s0[bh * SS + e] : F(0);
    }
  }
}

template <class F>
void gla_bwd_parallel_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                          const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0) {
  const int64_t T = L.T, Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * T * T * (Dk + Dv) > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Rows<F> R{bh / L.H, bh % L.H};
    std::vector<F> a(static_cast<size_t>(T * Dk)), da(static_cast<size_t>(T * Dk), F(0));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < Dk; ++i) a[t * Dk + i] = (t ? a[(t - 1) * Dk + i] : F(0)) + R.at(g, L.g, t, Dk)[i];
    std::vector<F> dS0(static_cast<size_t>(SS), F(0));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < Dk; ++i) R.at(dq, L.dq, t, Dk)[i] = R.at(dk, L.dk, t, Dk)[i] = 0;
      for (int64_t j = 0; j < Dv; ++j) R.at(dv, L.dv, t, Dv)[j] = 0;
    }
    for (int64_t t = 0; t < T; ++t) {
      const F *qt = R.at(q, L.q, t, Dk), *dot = R.at(dout, L.dout, t, Dv);
      F* dqt = R.at(dq, L.dq, t, Dk);
      for (int64_t s = 0; s <= t; ++s) {
        const F *ks = R.at(k, L.k, s, Dk), *vs = R.at(v, L.v, s, Dv);
        F* dks = R.at(dk, L.dk, s, Dk);
        F dp = 0, p = 0;
        for (int64_t j = 0; j < Dv; ++j) dp += dot[j] * vs[j];
        for (int64_t i = 0; i < Dk; ++i) {
          const F e = std::exp(a[t * Dk + i] - a[s * Dk + i]);
          const F c = scale * dp * e;
          dqt[i] += c * ks[i];
          dks[i] += c * qt[i];
          da[t * Dk + i] += c * qt[i] * ks[i];  // t reads through exp(a_t - a_s) ...
          da[s * Dk + i] -= c * qt[i] * ks[i];  // ... that s wrote
          p += qt[i] * ks[i] * e;
        }
        F* dvs = R.at(dv, L.dv, s, Dv);
        for (int64_t j = 0; j < Dv; ++j) dvs[j] += scale * p * dot[j];
      }
      for (int64_t i = 0; i < Dk; ++i) {  // the initial-state term scale (q_t * exp(a_t)) S_0
        const F e = scale * std::exp(a[t * Dk + i]);
        F w = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          if (s0) w += dot[j] * s0[bh * SS + i * Dv + j];
          dS0[i * Dv + j] += e * qt[i] * dot[j];
        }
        dqt[i] += e * w;
        da[t * Dk + i] += e * qt[i] * w;
      }
    }
    if (ds_final && T > 0) {
      // S_T = exp(a_T) S_0 + sum_s (k_s * exp(a_T - a_s))^T v_s
      const F* dsf = ds_final + bh * SS;
      const F* aT = &a[(T - 1) * Dk];
      for (int64_t i = 0; i < Dk; ++i) {
        const F e0 = std::exp(aT[i]);
        for (int64_t j = 0; j < Dv; ++j) {
          const F s0v = s0 ? s0[bh * SS + i * Dv + j] : F(0);
          dS0[i * Dv + j] += e0 * dsf[i * Dv + j];
          da[(T - 1) * Dk + i] += dsf[i * Dv + j] * e0 * s0v;
        }
      }
      for (int64_t s = 0; s < T; ++s) {
        const F *ks = R.at(k, L.k, s, Dk), *vs = R.at(v, L.v, s, Dv);
        F *dks = R.at(dk, L.dk, s, Dk), *dvs = R.at(dv, L.dv, s, Dv);
        for (int64_t i = 0; i < Dk; ++i) {
          const F e = std::exp(aT[i] - a[s * Dk + i]);
          F w = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            w += dsf[i * Dv + j] * vs[j];
            dvs[j] += ks[i] * e * dsf[i * Dv + j];
          }
          dks[i] += e * w;
          da[(T - 1) * Dk + i] += ks[i] * e * w;
          da[s * Dk + i] -= ks[i] * e * w;
        }
      }
    } else if (ds_final) {
      for (int64_t e = 0; e < SS; ++e) dS0[e] += ds_final[bh * SS + e];
    }
    F* run = da.data();  // reverse cumsum of dL/da into dg, reusing row T-1 as the running sum
    for (int64_t t = T - 1; t >= 0; --t)
      for (int64_t i = 0; i < Dk; ++i) {
        if (t < T - 1) run[t * Dk + i] += run[(t + 1) * Dk + i];
        R.at(dg, L.dg, t, Dk)[i] = run[t * Dk + i];
      }
    if (ds0)
      for (int64_t e = 0; e < SS; ++e) ds0[bh * SS + e] = dS0[e];
  }
}

#define LINAC_GLA_REF(F)                                                                                           \
  template void gla_fwd_recurrent_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*, F*,  \
                                         F*);                                                                      \
  template void gla_bwd_recurrent_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*,      \
                                         const F*, const F*, F*, F*, F*, F*, F*);                                  \
  template void gla_fwd_parallel_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*, F*,   \
                                        F*);                                                                       \
  template void gla_bwd_parallel_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*,       \
                                        const F*, const F*, F*, F*, F*, F*, F*);
LINAC_GLA_REF(float)
LINAC_GLA_REF(double)
#undef LINAC_GLA_REF

}  // namespace linac
