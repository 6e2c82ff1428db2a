// CPU reference for attention decode (math in attention_decode.h): per (batch, head) the scores of
// the valid slots of its key/value head, their maximum, the log-sum-exp, then the weighted sum of the value rows.
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

template void attention_decode_cpu<float>(const AttentionDecodeLayout&, const float*, const float*, const float*,
                                          float*);
template void attention_decode_cpu<double>(const AttentionDecodeLayout&, const double*, const double*, const double*,
                                           double*);

}  // namespace linac
