// CPU reference for greedy_pick (math in greedy_pick.h): per row the first maximum, then the
// log-sum-exp in double from left to right.
#include <cmath>

#include "greedy_pick/greedy_pick.h"

namespace linac {

template <class F>
void greedy_pick_cpu(const F* logits, int64_t B, int64_t V, int32_t* id, double* logprob) {
  for (int64_t b = 0; b < B; ++b) {
    const F* row = logits + b * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    id[b] = static_cast<int32_t>(best);
    if (!logprob) continue;
    const double m = static_cast<double>(row[best]);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - m);
    logprob[b] = -std::log(z);
  }
}

template void greedy_pick_cpu<float>(const float*, int64_t, int64_t, int32_t*, double*);
template void greedy_pick_cpu<double>(const double*, int64_t, int64_t, int32_t*, double*);

}  // namespace linac
