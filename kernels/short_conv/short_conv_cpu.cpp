// CPU reference for the short gated convolution (math in short_conv.h). The forward and the decode
// step both gather the W inputs a token sees into a window and call the same conv_window(), so
// stepping reproduces the forward bit for bit.
#include <cmath>
#include <vector>

#include "activation/sigmoid.h"
#include "short_conv/short_conv.h"

namespace linac {

namespace {

template <class F>
F activation(F c, bool silu) {
  return silu ? c * sigmoid(c) : c;
}

template <class F>
F activation_grad(F c, bool silu) {
  return silu ? silu_grad(c) : F(1);
}

// c = sum_j h[j] * window[j] in ascending j (window[W-1] is the current token).
template <class F>
F conv_window(const F* h, const F* window, int64_t W) {
  F c = 0;
  for (int64_t j = 0; j < W; ++j) c += h[j] * window[j];
  return c;
}

// ã[b, s, ch]: the biased input, 0 in the left padding (s < lo: before the sequence, or before
// the document of the token that reads it).
template <class F>
F biased_input(const ShortConvLayout& L, const F* a, const F* ba, int64_t b, int64_t s, int64_t ch, int64_t lo) {
  if (s < lo) return F(0);
  return a[b * L.a.b + s * L.a.t + ch] + (ba ? ba[ch] : F(0));
}

// The first token that token t of row b may read.
int64_t first_readable(const ShortConvLayout& L, int64_t b, int64_t t) {
  return L.doc_start ? L.doc_start[b * L.T + t] : 0;
}

}  // namespace

template <class F>
void short_conv_fwd_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg, F* z) {
  const int64_t W = L.W;
  F window[kShortConvMaxWidth];
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t t = 0; t < L.T; ++t) {
      const int64_t lo = first_readable(L, b, t);
      for (int64_t ch = 0; ch < L.C; ++ch) {
        for (int64_t j = 0; j < W; ++j) window[j] = biased_input(L, a, ba, b, t - W + 1 + j, ch, lo);
        const F c = conv_window(h + ch * W, window, W);
        const F gate = g[b * L.g.b + t * L.g.t + ch] + (bg ? bg[ch] : F(0));
        z[b * L.z.b + t * L.z.t + ch] = activation(c, L.silu) * gate;
      }
    }
}

template <class F>
void short_conv_bwd_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg,
                        const F* dz, F* da, F* dg, F* dh, F* dba, F* dbg) {
  const int64_t T = L.T, C = L.C, W = L.W;
  std::vector<F> dc(static_cast<size_t>(T * C));
  F window[kShortConvMaxWidth];
  for (int64_t b = 0; b < L.B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t lo = first_readable(L, b, t);
      for (int64_t ch = 0; ch < C; ++ch) {
        for (int64_t j = 0; j < W; ++j) window[j] = biased_input(L, a, ba, b, t - W + 1 + j, ch, lo);
        const F c = conv_window(h + ch * W, window, W);
        const F gate = g[b * L.g.b + t * L.g.t + ch] + (bg ? bg[ch] : F(0));
        const F dzv = dz[b * L.dz.b + t * L.dz.t + ch];
        const F dgv = activation(c, L.silu) * dzv;
        const F dcv = dzv * gate * activation_grad(c, L.silu);
        if (dg) dg[b * L.dg.b + t * L.dg.t + ch] = dgv;
        dc[t * C + ch] = dcv;
        for (int64_t j = 0; j < W; ++j) dh[ch * W + j] += dcv * window[j];
        if (dbg) dbg[ch] += dgv;
      }
    }
    // Token t reads s through tap j = s - t + W - 1 when s is in its document (start <= s).
    for (int64_t s = 0; s < T; ++s)
      for (int64_t ch = 0; ch < C; ++ch) {
        F acc = 0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t t = s + W - 1 - j;
          if (t < T && first_readable(L, b, t) <= s) acc += h[ch * W + j] * dc[t * C + ch];
        }
        da[b * L.da.b + s * L.da.t + ch] = acc;
        if (dba) dba[ch] += acc;
      }
  }
}

template <class F>
void short_conv_step_cpu(const ShortConvLayout& L, const F* a, const F* g, const F* h, const F* ba, const F* bg,
                         F* state, F* z) {
  const int64_t C = L.C, W = L.W;
  F window[kShortConvMaxWidth];
  for (int64_t b = 0; b < L.B; ++b) {
    F* st = state + b * (W - 1) * C;
    for (int64_t ch = 0; ch < C; ++ch) {
      for (int64_t j = 0; j + 1 < W; ++j) window[j] = st[j * C + ch];
      window[W - 1] = biased_input(L, a, ba, b, 0, ch, 0);
      const F c = conv_window(h + ch * W, window, W);
      const F gate = g[b * L.g.b + ch] + (bg ? bg[ch] : F(0));
      z[b * L.z.b + ch] = activation(c, L.silu) * gate;
      for (int64_t j = 0; j + 1 < W; ++j) st[j * C + ch] = window[j + 1];
    }
  }
}

template void short_conv_fwd_cpu<float>(const ShortConvLayout&, const float*, const float*, const float*, const float*,
                                        const float*, float*);
template void short_conv_fwd_cpu<double>(const ShortConvLayout&, const double*, const double*, const double*,
                                         const double*, const double*, double*);
template void short_conv_bwd_cpu<float>(const ShortConvLayout&, const float*, const float*, const float*, const float*,
                                        const float*, const float*, float*, float*, float*, float*, float*);
template void short_conv_bwd_cpu<double>(const ShortConvLayout&, const double*, const double*, const double*,
                                         const double*, const double*, const double*, double*, double*, double*,
                                         double*, double*);
template void short_conv_step_cpu<float>(const ShortConvLayout&, const float*, const float*, const float*, const float*,
                                         const float*, float*, float*);
template void short_conv_step_cpu<double>(const ShortConvLayout&, const double*, const double*, const double*,
                                          const double*, const double*, double*, double*);

}  // namespace linac
