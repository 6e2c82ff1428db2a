// CPU vector quantizer and codebook statistics (docs/transformer_vq.md §1.2-§1.3; math in vq_attn.h). The CUDA
// kernels follow the same orders: distances ||k||^2 - 2 k.C_s + ||C_s||^2 clamped at 0 with the
// first minimum winning, and per-code sums over tokens in (b, t) order.
#include <algorithm>

#include "vq_attn/vq_attn_cpu_common.h"

namespace linac {

using vq_cpu::row;

template <class F>
void vq_quantize_cpu(const VqQuantLayout& L, const F* k, const F* codebook, int32_t* z, F* khat, F* err) {
  const int64_t Dk = L.Dk;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t t = 0; t < L.T; ++t)
      for (int64_t h = 0; h < L.H; ++h) {
        const F* kt = row(k, L.k, b, t, h, Dk);
        const F* cb = codebook + h * L.S * Dk;
        const F kk = dot(kt, kt, Dk);
        int32_t best = 0;
        F best_d = 0;
        for (int64_t s = 0; s < L.S; ++s) {
          const F* c = cb + s * Dk;
          const F d = std::max(F(0), kk - 2 * dot(kt, c, Dk) + dot(c, c, Dk));
          if (s == 0 || d < best_d) best = static_cast<int32_t>(s), best_d = d;
        }
        const int64_t i = (b * L.T + t) * L.H + h;
        z[i] = best;
        const F* c = cb + best * Dk;
        std::copy(c, c + Dk, row(khat, L.khat, b, t, h, Dk));
        if (err) {
          F e = 0;
          for (int64_t d = 0; d < Dk; ++d) e += (kt[d] - c[d]) * (kt[d] - c[d]);
          err[i] = e;
        }
      }
}

template <class F>
void vq_code_stats_cpu(const VqQuantLayout& L, const F* k, const int32_t* z, F* sums, F* counts) {
  std::fill(sums, sums + L.H * L.S * L.Dk, F(0));
  std::fill(counts, counts + L.H * L.S, F(0));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t t = 0; t < L.T; ++t)
      for (int64_t h = 0; h < L.H; ++h) {
        const int32_t s = z[(b * L.T + t) * L.H + h];
        counts[h * L.S + s] += 1;
        vq_cpu::axpy(F(1), row(k, L.k, b, t, h, L.Dk), sums + (h * L.S + s) * L.Dk, L.Dk);
      }
}

template <class F>
void vq_ema_update_cpu(int64_t H, int64_t S, int64_t Dk, const F* sums, const F* counts, F* c_sum, F* c_count,
                       double gamma) {
  const F g = static_cast<F>(gamma), rest = static_cast<F>(1 - gamma);
  for (int64_t i = 0; i < H * S * Dk; ++i) c_sum[i] = g * c_sum[i] + rest * sums[i];
  for (int64_t i = 0; i < H * S; ++i) c_count[i] = g * c_count[i] + rest * counts[i];
}

template <class F>
void vq_codebook_from_stats_cpu(int64_t H, int64_t S, int64_t Dk, const F* c_sum, const F* c_count, F* codebook) {
  for (int64_t i = 0; i < H * S * Dk; ++i) codebook[i] = c_sum[i] / std::max(c_count[i / Dk], F(0.01));
}

#define LINAC_VQ_QUANT(F)                                                                                        \
  template void vq_quantize_cpu<F>(const VqQuantLayout&, const F*, const F*, int32_t*, F*, F*);                \
  template void vq_code_stats_cpu<F>(const VqQuantLayout&, const F*, const int32_t*, F*, F*);                  \
  template void vq_ema_update_cpu<F>(int64_t, int64_t, int64_t, const F*, const F*, F*, F*, double);           \
  template void vq_codebook_from_stats_cpu<F>(int64_t, int64_t, int64_t, const F*, const F*, F*);
LINAC_VQ_QUANT(float)
LINAC_VQ_QUANT(double)
#undef LINAC_VQ_QUANT

}  // namespace linac
