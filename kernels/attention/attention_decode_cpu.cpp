// CPU reference for attention decode (math in attention_decode.h): per (batch, head) the scores of
// the valid slots of its key/value head, their maximum, the log-sum-exp, then the weighted sum of
// the value rows; the decoding step row by row at each row's position.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_decode.h"

namespace linac {

template <class F>
void attention_decode_cpu(const AttentionDecodeLayout& L, const F* q, const F* k_cache, const F* v_cache, F* o) {
  const int64_t H = L.H, Hk = L.Hk, D = L.D, n = L.n_valid;
  const F scale = static_cast<F>(L.scale);
  std::vector<F> scores(static_cast<size_t>(n));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hk);
      const F* qh = q + b * L.q_b + h * D;
      F m = -std::numeric_limits<F>::infinity();
      for (int64_t s = 0; s < n; ++s) {
        const F* ks = k_cache + ((b * L.S + s) * Hk + g) * D;
        F dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * ks[d];
        scores[s] = scale * dot;
        m = std::max(m, scores[s]);
      }
      F l = 0;
      for (int64_t s = 0; s < n; ++s) l += std::exp(scores[s] - m);
      const F lse = m + std::log(l);
      F* oh = o + b * L.o_b + h * D;
      std::fill(oh, oh + D, F(0));
      for (int64_t s = 0; s < n; ++s) {
        const F p = std::exp(scores[s] - lse);
        const F* vs = v_cache + ((b * L.S + s) * Hk + g) * D;
        for (int64_t d = 0; d < D; ++d) oh[d] += p * vs[d];
      }
    }
}

// The step: each row rotated, written into its slot and attended over its valid slots, as the
// separate ops would (rope_apply_cpu, a row copy, attention_decode_cpu on a batch of one).
template <class F>
void attention_decode_step_cpu(const AttentionDecodeLayout& L, F* q, F* k, const F* v, const int32_t* pos,
                               const RopeFreqs& rope, F* k_cache, F* v_cache, F* o) {
  const int64_t row = L.Hk * L.D;
  for (int64_t b = 0; b < L.B; ++b) {
    const int64_t p = pos[b];
    F* qb = q + b * L.q_b;
    F* kb = k + b * L.k_b;
    if (rope.defined()) {
      rope_apply_cpu(qb, 1, 1, L.H, L.D, 0, 0, rope, p, false);
      rope_apply_cpu(kb, 1, 1, L.Hk, L.D, 0, 0, rope, p, false);
    }
    const int64_t slot = L.window > 0 ? p % L.window : p;
    F* kc = k_cache + b * L.S * row;
    F* vc = v_cache + b * L.S * row;
    std::copy(kb, kb + row, kc + slot * row);
    std::copy(v + b * L.v_b, v + b * L.v_b + row, vc + slot * row);
    AttentionDecodeLayout one = L;
    one.B = 1;
    one.n_valid = L.window > 0 ? std::min(p + 1, L.window) : p + 1;
    attention_decode_cpu(one, qb, kc, vc, o + b * L.o_b);
  }
}

template void attention_decode_cpu<float>(const AttentionDecodeLayout&, const float*, const float*, const float*,
                                          float*);
template void attention_decode_cpu<double>(const AttentionDecodeLayout&, const double*, const double*, const double*,
                                           double*);

template void attention_decode_step_cpu<float>(const AttentionDecodeLayout&, float*, float*, const float*,
                                               const int32_t*, const RopeFreqs&, float*, float*, float*);
template void attention_decode_step_cpu<double>(const AttentionDecodeLayout&, double*, double*, const double*,
                                                const int32_t*, const RopeFreqs&, double*, double*, double*);

}  // namespace linac
