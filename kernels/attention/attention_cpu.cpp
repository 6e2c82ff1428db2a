// CPU reference for attention (math in attention.h). One (batch, head) pair per OpenMP task, in the
// backward one (batch, key/value head) pair, whose task sums dk and dv over its group of query
// heads; within it plain loops over queries and their allowed keys, so no result depends on the
// thread count.
// Small problems (gradient checks call the forward thousands of times) stay on one thread: a
// parallel region costs more than they do.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention.h"
#include "common/cpu_dot.h"

namespace linac {

namespace {
constexpr int64_t kParallelWork = int64_t{1} << 22;  // multiply-adds below which one thread is faster

}  // namespace

template <class F>
void attention_fwd_cpu(const AttentionLayout& L, const F* q, const F* k, const F* v, F* o, F* lse) {
  const int64_t B = L.B, T = L.T, H = L.H, D = L.D;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (B * H * T * T * D > kParallelWork)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, g = h / L.group();
    std::vector<F> s_row(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const F* qt = q + b * L.q.b + t * L.q.t + h * D;
      const int64_t lo = L.key_lo(b, t), hi = L.key_hi(t);
      F m = -std::numeric_limits<F>::infinity();
      for (int64_t s = lo; s <= hi; ++s) {
        s_row[s - lo] = scale * dot(qt, k + b * L.k.b + s * L.k.t + g * D, D);
        m = std::max(m, s_row[s - lo]);
      }
      F l = 0;
      for (int64_t s = lo; s <= hi; ++s) l += std::exp(s_row[s - lo] - m);
      const F lse_t = m + std::log(l);
      lse[bh * T + t] = lse_t;
      F* ot = o + b * L.o.b + t * L.o.t + h * D;
      std::fill(ot, ot + D, F(0));
      for (int64_t s = lo; s <= hi; ++s) {
        const F p = std::exp(s_row[s - lo] - lse_t);
        const F* vs = v + b * L.v.b + s * L.v.t + g * D;
        for (int64_t d = 0; d < D; ++d) ot[d] += p * vs[d];
      }
    }
  }
}

template <class F>
void attention_bwd_cpu(const AttentionLayout& L, const F* q, const F* k, const F* v, const F* o, const F* lse,
                       const F* dout, F* dq, F* dk, F* dv) {
  const int64_t B = L.B, T = L.T, H = L.H, Hk = L.Hk, D = L.D, G = L.group();
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (B * H * T * T * D > kParallelWork)
  for (int64_t bg = 0; bg < B * Hk; ++bg) {
    const int64_t b = bg / Hk, g = bg % Hk;
    for (int64_t s = 0; s < T; ++s) {
      std::fill_n(dk + b * L.dk.b + s * L.dk.t + g * D, D, F(0));
      if (!L.accumulate_dv) std::fill_n(dv + b * L.dv.b + s * L.dv.t + g * D, D, F(0));
    }
    for (int64_t h = g * G; h < (g + 1) * G; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const F* qt = q + b * L.q.b + t * L.q.t + h * D;
        const F* go = dout + b * L.dout.b + t * L.dout.t + h * D;
        const F delta = dot(go, o + b * L.o.b + t * L.o.t + h * D, D);
        const F lse_t = lse[(b * H + h) * T + t];
        F* dqt = dq + b * L.dq.b + t * L.dq.t + h * D;
        std::fill(dqt, dqt + D, F(0));
        for (int64_t s = L.key_lo(b, t); s <= L.key_hi(t); ++s) {
          const F* ks = k + b * L.k.b + s * L.k.t + g * D;
          const F* vs = v + b * L.v.b + s * L.v.t + g * D;
          F* dks = dk + b * L.dk.b + s * L.dk.t + g * D;
          F* dvs = dv + b * L.dv.b + s * L.dv.t + g * D;
          const F p = std::exp(scale * dot(qt, ks, D) - lse_t);
          const F ds = p * (dot(go, vs, D) - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            dqt[d] += ds * ks[d];
            dks[d] += ds * qt[d];
            dvs[d] += p * go[d];
          }
        }
      }
    }
  }
}

template void attention_fwd_cpu<float>(const AttentionLayout&, const float*, const float*, const float*, float*,
                                       float*);
template void attention_fwd_cpu<double>(const AttentionLayout&, const double*, const double*, const double*, double*,
                                        double*);
template void attention_bwd_cpu<float>(const AttentionLayout&, const float*, const float*, const float*, const float*,
                                       const float*, const float*, float*, float*, float*);
template void attention_bwd_cpu<double>(const AttentionLayout&, const double*, const double*, const double*,
                                        const double*, const double*, const double*, double*, double*, double*);

}  // namespace linac
