// Small helpers shared by the VQ-attention CPU references (rows of strided [B,T,H,D] tensors and
// the score of one query against one key).
#pragma once

#include <cstdint>

#include "common/cpu_dot.h"
#include "vq_attn/vq_attn.h"

namespace linac::vq_cpu {

template <class P>
P* row(P* base, const VqAttnLayout::Strides& s, int64_t b, int64_t t, int64_t h, int64_t D) {
  return base + b * s.b + t * s.t + h * D;
}

template <class F>
void axpy(F a, const F* x, F* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// fn(a, e) for every document [a, e) of row b in order: the whole row without document bounds.
template <class Fn>
void for_each_document(const VqAttnLayout& L, int64_t b, Fn fn) {
  if (!L.docs.defined()) return fn(int64_t{0}, L.T);
  for (int64_t a = 0; a < L.T;) {
    const int64_t e = L.docs.end[b * L.T + a];
    fn(a, e);
    a = e;
  }
}

// The biased queries of one token: qu = q + u, qr = q + vr.
template <class F>
void biased_queries(const F* q, const F* u, const F* vr, int64_t Dk, F* qu, F* qr) {
  for (int64_t i = 0; i < Dk; ++i) qu[i] = q[i] + u[i], qr[i] = q[i] + vr[i];
}

}  // namespace linac::vq_cpu
