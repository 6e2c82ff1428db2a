// CPU chunked Taylor attention (the form the CPU trains with), the feature map and the decode
// step; math in taylor_attn.h. It mirrors the CUDA kernels: per chunk the exclusive state S_n
// feeds phi(Q^) S_n and the intra-chunk part is the masked C x C matrix; the backward is the two
// sweeps of docs/based.md §6.4 (forward in time with S_n for dq, backward in time with R_n for dk and dv).
// Documents (taylor_attn.h): the intra-chunk sums start at the row's document start, a row reads
// the carried state only when its document began before the chunk, and the state restarts in a
// chunk where a document starts; the stream path (no bounds) is unchanged.
// One (batch, head) pair per OpenMP task; results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_dot.h"
#include "taylor_attn/taylor_attn.h"
#include "taylor_attn/taylor_attn_cpu_common.h"

namespace linac {

namespace {

constexpr int64_t kParallelWork = int64_t{1} << 18;

template <class Fl>
using Vec = std::vector<Fl>;

template <class Fl>
Fl prescale(int64_t F) {
  return static_cast<Fl>(std::pow(static_cast<double>(F), -0.25));
}

template <class Fl>
Fl kappa(Fl u) {
  return 1 + u + u * u / 2;
}

using taylor_cpu::Pair;

// S (R x W) += phi x^T for one feature vector phi (R) and row x (W values; x[W-1] the v~ "1"
// unless given explicitly).
template <class Fl>
void add_outer(Fl* S, const Fl* phi, const Fl* x, int64_t R, int64_t W) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < W; ++j) S[r * W + j] += phi[r] * x[j];
}

// y (W) = S^T phi.
template <class Fl>
void read_out(const Fl* S, const Fl* phi, Fl* y, int64_t R, int64_t W) {
  std::fill(y, y + W, Fl(0));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < W; ++j) y[j] += phi[r] * S[r * W + j];
}

// G (R) = S x for a row x (W).
template <class Fl>
void apply(const Fl* S, const Fl* x, Fl* G, int64_t R, int64_t W) {
  for (int64_t r = 0; r < R; ++r) G[r] = dot(S + r * W, x, W);
}

// v~ = [v, 1].
template <class Fl>
void extend(const Fl* v, int64_t Dv, Fl* vt) {
  std::copy(v, v + Dv, vt);
  vt[Dv] = 1;
}

// Chunk [t0, t0 + len) of row b under documents: whether a document starts in it (the state
// restarts), and the first of its tokens whose key the state after it keeps.
struct ChunkDocs {
  bool restart;
  int64_t keep_from;
  ChunkDocs(const TaylorAttnLayout& L, int64_t b, int64_t t0, int64_t len) {
    const int64_t last = L.start(b, t0 + len - 1);
    restart = L.doc_start && last >= t0;
    keep_from = std::max(t0, last);
  }
};

}  // namespace

int64_t taylor_attn_state_rows(int64_t F) { return F * F + F + 1; }

template <class Fl>
void taylor_feature_map_cpu(int64_t F, const Fl* x, Fl* phi) {
  const Fl c = prescale<Fl>(F), r2 = static_cast<Fl>(1 / std::sqrt(2.0));
  for (int64_t i = 0; i < F; ++i)
    for (int64_t j = 0; j < F; ++j) phi[i * F + j] = (c * x[i]) * (c * x[j]) * r2;
  for (int64_t i = 0; i < F; ++i) phi[F * F + i] = c * x[i];
  phi[F * F + F] = 1;
}

template <class Fl>
void taylor_feature_map_grad_cpu(int64_t F, const Fl* x, const Fl* G, Fl* dx) {
  const Fl c = prescale<Fl>(F), r2 = static_cast<Fl>(1 / std::sqrt(2.0));
  for (int64_t i = 0; i < F; ++i) {
    Fl acc = 0;
    for (int64_t j = 0; j < F; ++j) acc += (G[i * F + j] + G[j * F + i]) * (c * x[j]);
    dx[i] += c * (G[F * F + i] + r2 * acc);
  }
}

template <class Fl>
void taylor_attn_out_grad_cpu(int64_t Dv, const Fl* o, Fl den, const Fl* dout, Fl* g) {
  for (int64_t j = 0; j < Dv; ++j) g[j] = dout[j] / den;
  g[Dv] = -dot(dout, o, Dv) / den;
}

template <class Fl>
void taylor_attn_fwd_chunk_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* o, Fl* den,
                               Fl* s_final) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(F), C = L.chunk;
  const Fl c = prescale<Fl>(F), eps = static_cast<Fl>(L.eps);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * L.T * R * W > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    Vec<Fl> S(static_cast<size_t>(R * W), Fl(0)), phi(static_cast<size_t>(R)), ot(static_cast<size_t>(W));
    Vec<Fl> vt(static_cast<size_t>(W));
    for (int64_t t0 = 0; t0 < L.T; t0 += C) {
      const int64_t len = std::min(C, L.T - t0);
      for (int64_t r = 0; r < len; ++r) {
        const Fl* qr = p.row(q, L.q, t0 + r, F);
        const int64_t st = L.start(p.b, t0 + r);
        taylor_feature_map_cpu(F, qr, phi.data());
        if (L.doc_start && st >= t0)
          std::fill(ot.begin(), ot.end(), Fl(0));
        else
          read_out(S.data(), phi.data(), ot.data(), R, W);  // inter: the exclusive state S_n
        for (int64_t s = std::max<int64_t>(0, st - t0); s <= r; ++s) {  // intra: the masked chunk matrix
          const Fl a = kappa(c * c * dot(qr, p.row(k, L.k, t0 + s, F), F));
          extend(p.row(v, L.v, t0 + s, Dv), Dv, vt.data());
          for (int64_t j = 0; j < W; ++j) ot[j] += a * vt[j];
        }
        const Fl d = ot[Dv] + eps;
        den[bh * L.T + t0 + r] = d;
        Fl* orow = p.row(o, L.o, t0 + r, Dv);
        for (int64_t j = 0; j < Dv; ++j) orow[j] = ot[j] / d;
      }
      const ChunkDocs cd(L, p.b, t0, len);
      if (cd.restart) std::fill(S.begin(), S.end(), Fl(0));
      for (int64_t s = cd.keep_from - t0; s < len; ++s) {
        taylor_feature_map_cpu(F, p.row(k, L.k, t0 + s, F), phi.data());
        extend(p.row(v, L.v, t0 + s, Dv), Dv, vt.data());
        add_outer(S.data(), phi.data(), vt.data(), R, W);
      }
    }
    if (s_final) std::copy(S.begin(), S.end(), s_final + bh * R * W);
  }
}

template <class Fl>
void taylor_attn_bwd_chunk_cpu(const TaylorAttnLayout& L, const Fl* q, const Fl* k, const Fl* v, const Fl* o,
                               const Fl* den, const Fl* dout, Fl* dq, Fl* dk, Fl* dv) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(F), C = L.chunk, T = L.T;
  const Fl c = prescale<Fl>(F);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * L.T * R * W > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const Pair p{bh / L.H, bh % L.H};
    // g~ and v~ of every token of the pair.
    Vec<Fl> gt(static_cast<size_t>(T * W)), vt(static_cast<size_t>(T * W));
    for (int64_t t = 0; t < T; ++t) {
      taylor_attn_out_grad_cpu(Dv, p.row(o, L.o, t, Dv), den[bh * T + t], p.row(dout, L.dout, t, Dv), &gt[t * W]);
      extend(p.row(v, L.v, t, Dv), Dv, &vt[t * W]);
    }
    auto P = [&](int64_t t, int64_t s) { return dot(&gt[t * W], &vt[s * W], W); };  // g~_t . v~_s
    auto u = [&](int64_t t, int64_t s) { return c * c * dot(p.row(q, L.q, t, F), p.row(k, L.k, s, F), F); };
    Vec<Fl> S(static_cast<size_t>(R * W), Fl(0)), phi(static_cast<size_t>(R)), G(static_cast<size_t>(R));
    // Sweep A, forward in time: dq.
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t len = std::min(C, T - t0);
      for (int64_t r = t0; r < t0 + len; ++r) {
        Fl* dqr = p.row(dq, L.dq, r, F);
        const Fl* qr = p.row(q, L.q, r, F);
        const int64_t st = L.start(p.b, r);
        std::fill(dqr, dqr + F, Fl(0));
        if (!L.doc_start || st < t0) {
          apply(S.data(), &gt[r * W], G.data(), R, W);  // dL/dphi(q^_r) from the chunks before
          taylor_feature_map_grad_cpu(F, qr, G.data(), dqr);
        }
        for (int64_t s = std::max(t0, st); s <= r; ++s) {
          const Fl du = P(r, s) * (1 + u(r, s)) * c;
          const Fl* ks = p.row(k, L.k, s, F);
          for (int64_t i = 0; i < F; ++i) dqr[i] += du * c * ks[i];
        }
      }
      const ChunkDocs cd(L, p.b, t0, len);
      if (cd.restart) std::fill(S.begin(), S.end(), Fl(0));
      for (int64_t s = cd.keep_from; s < t0 + len; ++s) {
        taylor_feature_map_cpu(F, p.row(k, L.k, s, F), phi.data());
        add_outer(S.data(), phi.data(), &vt[s * W], R, W);
      }
    }
    // Sweep B, backward in time: dk, dv (S now holds R_n, the chunks after the current one).
    std::fill(S.begin(), S.end(), Fl(0));
    Vec<Fl> dvt(static_cast<size_t>(W));
    for (int64_t t0 = (T - 1) / C * C; t0 >= 0; t0 -= C) {
      const int64_t len = std::min(C, T - t0);
      const ChunkDocs cd(L, p.b, t0, len);
      for (int64_t s = t0; s < t0 + len; ++s) {
        Fl* dks = p.row(dk, L.dk, s, F);
        const Fl* ks = p.row(k, L.k, s, F);
        std::fill(dks, dks + F, Fl(0));
        if (s >= cd.keep_from) {  // R_n holds the queries of the document of the chunk's last token
          apply(S.data(), &vt[s * W], G.data(), R, W);  // dL/dphi(k^_s) from the chunks after
          taylor_feature_map_grad_cpu(F, ks, G.data(), dks);
          taylor_feature_map_cpu(F, ks, phi.data());
          read_out(S.data(), phi.data(), dvt.data(), R, W);
        } else {
          std::fill(dvt.begin(), dvt.end(), Fl(0));
        }
        for (int64_t t = s; t < t0 + len; ++t) {
          if (L.start(p.b, t) > s) break;  // later queries of the chunk are in later documents
          const Fl uu = u(t, s), du = P(t, s) * (1 + uu) * c, a = kappa(uu);
          const Fl* qt = p.row(q, L.q, t, F);
          for (int64_t i = 0; i < F; ++i) dks[i] += du * c * qt[i];
          for (int64_t j = 0; j < W; ++j) dvt[j] += a * gt[t * W + j];
        }
        std::copy(dvt.begin(), dvt.begin() + Dv, p.row(dv, L.dv, s, Dv));
      }
      if (cd.restart) std::fill(S.begin(), S.end(), Fl(0));
      for (int64_t t = t0; t < t0 + len; ++t) {
        if (L.doc_start && L.start(p.b, t) >= t0) break;  // R_n-1 keeps the queries whose document began before the chunk
        taylor_feature_map_cpu(F, p.row(q, L.q, t, F), phi.data());
        add_outer(S.data(), phi.data(), &gt[t * W], R, W);
      }
    }
  }
}

template <class Fl>
void taylor_attn_step_cpu(const TaylorStepLayout& L, const Fl* q, const Fl* k, const Fl* v, Fl* state, Fl* o) {
  const int64_t F = L.F, Dv = L.Dv, W = Dv + 1, R = taylor_attn_state_rows(F);
  Vec<Fl> phi(static_cast<size_t>(R)), vt(static_cast<size_t>(W)), ot(static_cast<size_t>(W));
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const int64_t b = bh / L.H, h = bh % L.H;
    Fl* S = state + bh * R * W;
    taylor_feature_map_cpu(F, k + b * L.k + h * F, phi.data());
    extend(v + b * L.v + h * Dv, Dv, vt.data());
    add_outer(S, phi.data(), vt.data(), R, W);
    taylor_feature_map_cpu(F, q + b * L.q + h * F, phi.data());
    read_out(S, phi.data(), ot.data(), R, W);
    const Fl d = ot[Dv] + static_cast<Fl>(L.eps);
    for (int64_t j = 0; j < Dv; ++j) o[b * L.o + h * Dv + j] = ot[j] / d;
  }
}

#define LINAC_TAYLOR_CPU(Fl)                                                                                         \
  template void taylor_feature_map_cpu<Fl>(int64_t, const Fl*, Fl*);                                                 \
  template void taylor_feature_map_grad_cpu<Fl>(int64_t, const Fl*, const Fl*, Fl*);                                 \
  template void taylor_attn_out_grad_cpu<Fl>(int64_t, const Fl*, Fl, const Fl*, Fl*);                                \
  template void taylor_attn_fwd_chunk_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*, Fl*, Fl*,   \
                                              Fl*);                                                                  \
  template void taylor_attn_bwd_chunk_cpu<Fl>(const TaylorAttnLayout&, const Fl*, const Fl*, const Fl*, const Fl*,  \
                                              const Fl*, const Fl*, Fl*, Fl*, Fl*);                                  \
  template void taylor_attn_step_cpu<Fl>(const TaylorStepLayout&, const Fl*, const Fl*, const Fl*, Fl*, Fl*);
LINAC_TAYLOR_CPU(float)
LINAC_TAYLOR_CPU(double)
#undef LINAC_TAYLOR_CPU

}  // namespace linac
