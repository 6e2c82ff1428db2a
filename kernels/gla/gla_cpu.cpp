// CPU chunkwise GLA (the form the CPU trains with) and the decode step; math in gla.h. It mirrors
// the CUDA kernels step for step: chunk-local inclusive cumsums B, the exclusive state S_n in the
// inter-chunk term, sub-chunks of c tokens with the same reference points (off-diagonal blocks
// referenced to the first row of the query sub-chunk for P and dq, to the last row of the key
// sub-chunk for dk; diagonal blocks factorised at the sub-chunk's first row in key columns whose
// decay across it is at most kGlaFactorSpan, exact pairwise exponents in the others), the reverse
// state scan for dS, and dg in the chunk-local form of docs/gla.md §4.3: the chunk's reverse cumsum
// of q*dq - k*dk plus rowsum(dS_n+1 * S_n+1), formed from S_n as the kernel does, so no rounding
// error is carried along the sequence. One (batch, head) pair per OpenMP task; results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gla/gla.h"

namespace linac {

namespace {

constexpr int64_t kParallelWork = int64_t{1} << 18;

template <class F>
using Vec = std::vector<F>;

// One chunk's rows [t0, t0 + len) of one (b, h) pair, with its cumsums and helpers.
template <class F>
struct Chunk {
  const GlaLayout& L;
  int64_t b, h, t0, len;
  Vec<F> B;  // [len, Dk] chunk-local inclusive cumsum of g

  Chunk(const GlaLayout& l, int64_t bb, int64_t hh, int64_t t, const F* g)
      : L(l), b(bb), h(hh), t0(t), len(std::min(l.chunk, l.T - t)), B(static_cast<size_t>(len * l.Dk)) {
    for (int64_t r = 0; r < len; ++r)
      for (int64_t i = 0; i < L.Dk; ++i) B[r * L.Dk + i] = (r ? B[(r - 1) * L.Dk + i] : F(0)) + row(g, L.g, r, L.Dk)[i];
  }
  template <class P>
  P* row(P* base, const GlaLayout::Strides& s, int64_t r, int64_t D) const {
    return base + b * s.b + (t0 + r) * s.t + h * D;
  }
  F cum(int64_t r, int64_t i) const { return B[r * L.Dk + i]; }
  F total(int64_t i) const { return cum(len - 1, i); }  // bn
  // Whether key column i of the sub-chunk [lo, hi) decays too much for a factorised diagonal block.
  bool wide(int64_t lo, int64_t hi, int64_t i) const { return cum(lo, i) - cum(hi - 1, i) > F(kGlaFactorSpan); }
  // First row of sub-chunk I and one past its last row.
  int64_t sub_lo(int64_t I) const { return I * L.sub_chunk; }
  int64_t sub_hi(int64_t I) const { return std::min(len, (I + 1) * L.sub_chunk); }
  int64_t n_sub() const { return (len + L.sub_chunk - 1) / L.sub_chunk; }
};

// P[r, s] (scale included) of a chunk, [len, len], zero above the diagonal.
template <class F>
Vec<F> intra_p(const Chunk<F>& c, const F* q, const F* k) {
  const GlaLayout& L = c.L;
  const int64_t n = c.len, Dk = L.Dk;
  const F scale = static_cast<F>(L.scale);
  Vec<F> P(static_cast<size_t>(n * n), F(0));
  Vec<F> qs(static_cast<size_t>(L.sub_chunk * Dk)), ks(static_cast<size_t>(n * Dk));
  std::vector<char> wide(static_cast<size_t>(Dk));
  for (int64_t I = 0; I < c.n_sub(); ++I) {
    const int64_t r0 = c.sub_lo(I), r1 = c.sub_hi(I);
    // A column takes exact exponents when any column of its 64-wide slice is wide (the GPU's
    // intra kernel decides per slice; its dq/dk kernel per column, as the backward below).
    for (int64_t i0 = 0; i0 < Dk; i0 += 64) {
      bool any = false;
      for (int64_t i = i0; i < std::min(Dk, i0 + 64); ++i) any = any || c.wide(r0, r1, i);
      std::fill(wide.begin() + i0, wide.begin() + std::min(Dk, i0 + 64), static_cast<char>(any));
    }
    // Referenced to row r0: q_I * exp(B_I - B[r0]) <= 1 and k * exp(B[r0] - B), <= 1 for the keys of
    // earlier sub-chunks, within exp(kGlaFactorSpan) for those of I (factorised columns only).
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < Dk; ++i) qs[(r - r0) * Dk + i] = c.row(q, L.q, r, Dk)[i] * std::exp(c.cum(r, i) - c.cum(r0, i));
    for (int64_t s = 0; s < r1; ++s)
      for (int64_t i = 0; i < Dk; ++i)
        ks[s * Dk + i] = s >= r0 && wide[i] ? F(0) : c.row(k, L.k, s, Dk)[i] * std::exp(c.cum(r0, i) - c.cum(s, i));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t s = 0; s < r0; ++s) {
        F acc = 0;
        for (int64_t i = 0; i < Dk; ++i) acc += qs[(r - r0) * Dk + i] * ks[s * Dk + i];
        P[r * n + s] = scale * acc;
      }
      const F* qr = c.row(q, L.q, r, Dk);
      for (int64_t s = r0; s <= r; ++s) {  // diagonal block
        const F* kr = c.row(k, L.k, s, Dk);
        F acc = 0;
        for (int64_t i = 0; i < Dk; ++i)
          acc += wide[i] ? qr[i] * kr[i] * std::exp(c.cum(r, i) - c.cum(s, i)) : qs[(r - r0) * Dk + i] * ks[s * Dk + i];
        P[r * n + s] = scale * acc;
      }
    }
  }
  return P;
}

// S <- exp(bn) S + (k * exp(bn - B))^T v over one chunk (forward state step).
template <class F>
void state_step(const Chunk<F>& c, const F* k, const F* v, F* S) {
  const GlaLayout& L = c.L;
  const int64_t Dk = L.Dk, Dv = L.Dv;
  for (int64_t i = 0; i < Dk; ++i) {
    F* Si = S + i * Dv;
    const F bn = c.total(i);
    const F decay = std::exp(bn);
    for (int64_t j = 0; j < Dv; ++j) Si[j] *= decay;
    for (int64_t r = 0; r < c.len; ++r) {
      const F w = c.row(k, L.k, r, Dk)[i] * std::exp(bn - c.cum(r, i));
      const F* vr = c.row(v, L.v, r, Dv);
      for (int64_t j = 0; j < Dv; ++j) Si[j] += w * vr[j];
    }
  }
}

int64_t n_chunks(const GlaLayout& L) { return (L.T + L.chunk - 1) / L.chunk; }

}  // namespace

template <class F>
void gla_fwd_chunk_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0, F* o,
                       F* s_final) {
  const int64_t Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * L.T * (SS + L.chunk * (Dk + Dv)) > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const int64_t b = bh / L.H, h = bh % L.H;
    Vec<F> S(static_cast<size_t>(SS), F(0));
    if (s0) S.assign(s0 + bh * SS, s0 + (bh + 1) * SS);
    Vec<F> qd(static_cast<size_t>(Dk));
    for (int64_t t0 = 0; t0 < L.T; t0 += L.chunk) {
      const Chunk<F> c(L, b, h, t0, g);
      const Vec<F> P = intra_p(c, q, k);
      for (int64_t r = 0; r < c.len; ++r) {
        const F* qr = c.row(q, L.q, r, Dk);
        for (int64_t i = 0; i < Dk; ++i) qd[i] = scale * qr[i] * std::exp(c.cum(r, i));
        F* orow = c.row(o, L.o, r, Dv);
        for (int64_t j = 0; j < Dv; ++j) orow[j] = 0;
        for (int64_t i = 0; i < Dk; ++i)  // inter: the exclusive state S_n
          for (int64_t j = 0; j < Dv; ++j) orow[j] += qd[i] * S[i * Dv + j];
        for (int64_t s = 0; s <= r; ++s) {
          const F p = P[r * c.len + s];
          const F* vs = c.row(v, L.v, s, Dv);
          for (int64_t j = 0; j < Dv; ++j) orow[j] += p * vs[j];
        }
      }
      state_step(c, k, v, S.data());
    }
    if (s_final) std::copy(S.begin(), S.end(), s_final + bh * SS);
  }
}

template <class F>
void gla_bwd_chunk_cpu(const GlaLayout& L, const F* q, const F* k, const F* v, const F* g, const F* s0,
                       const F* dout, const F* ds_final, F* dq, F* dk, F* dv, F* dg, F* ds0) {
  const int64_t Dk = L.Dk, Dv = L.Dv, SS = Dk * Dv, C = L.chunk, N = n_chunks(L);
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(dynamic) if (L.B * L.H * L.T * (SS + C * (Dk + Dv)) > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const int64_t b = bh / L.H, h = bh % L.H;
    // Forward states S_0 .. S_N-1 (S_n = before chunk n), recomputed (S_0 kept when T = 0).
    Vec<F> S(static_cast<size_t>(std::max<int64_t>(N, 1) * SS), F(0));
    if (s0) std::copy(s0 + bh * SS, s0 + (bh + 1) * SS, S.begin());
    for (int64_t n = 0; n + 1 < N; ++n) {
      std::copy(S.begin() + n * SS, S.begin() + (n + 1) * SS, S.begin() + (n + 1) * SS);
      state_step(Chunk<F>(L, b, h, n * C, g), k, v, S.data() + (n + 1) * SS);
    }
    // Reverse scan: dS[n] = gradient of the state after chunk n (= S_{n+1}); dS[N] ... dS_0.
    Vec<F> dS(static_cast<size_t>((N + 1) * SS), F(0));
    if (ds_final) std::copy(ds_final + bh * SS, ds_final + (bh + 1) * SS, dS.begin() + N * SS);
    for (int64_t n = N - 1; n >= 0; --n) {
      const Chunk<F> c(L, b, h, n * C, g);
      const F* next = dS.data() + (n + 1) * SS;
      F* cur = dS.data() + n * SS;
      for (int64_t i = 0; i < Dk; ++i) {
        const F decay = std::exp(c.total(i));
        for (int64_t j = 0; j < Dv; ++j) cur[i * Dv + j] = decay * next[i * Dv + j];
        for (int64_t r = 0; r < c.len; ++r) {
          const F w = scale * c.row(q, L.q, r, Dk)[i] * std::exp(c.cum(r, i));
          const F* dor = c.row(dout, L.dout, r, Dv);
          for (int64_t j = 0; j < Dv; ++j) cur[i * Dv + j] += w * dor[j];
        }
      }
    }
    if (ds0) std::copy(dS.begin(), dS.begin() + SS, ds0 + bh * SS);

    for (int64_t n = 0; n < N; ++n) {
      const Chunk<F> c(L, b, h, n * C, g);
      const int64_t len = c.len;
      const F* Sn = S.data() + n * SS;           // state before the chunk
      const F* dSn1 = dS.data() + (n + 1) * SS;  // gradient of the state after it
      const Vec<F> P = intra_p(c, q, k);
      // dP = do v^T (causal) and the inter-chunk parts of dq' (= dq / scale), dk, dv.
      Vec<F> dP(static_cast<size_t>(len * len), F(0)), dqs(static_cast<size_t>(len * Dk), F(0));
      Vec<F> dks(static_cast<size_t>(len * Dk), F(0)), kd(static_cast<size_t>(len * Dk));
      Vec<F> kcarry(static_cast<size_t>(Dk), F(0));  // colsum(k * dk_inter), the new keys' share of the carry
      for (int64_t r = 0; r < len; ++r) {
        const F *dor = c.row(dout, L.dout, r, Dv), *vr = c.row(v, L.v, r, Dv), *kr = c.row(k, L.k, r, Dk);
        for (int64_t s = 0; s <= r; ++s) {
          const F* vs = c.row(v, L.v, s, Dv);
          F acc = 0;
          for (int64_t j = 0; j < Dv; ++j) acc += dor[j] * vs[j];
          dP[r * len + s] = acc;
        }
        for (int64_t i = 0; i < Dk; ++i) {
          F aq = 0, ak = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            aq += dor[j] * Sn[i * Dv + j];
            ak += vr[j] * dSn1[i * Dv + j];
          }
          const F dec = std::exp(c.total(i) - c.cum(r, i));
          dqs[r * Dk + i] = aq * std::exp(c.cum(r, i));
          dks[r * Dk + i] = ak * dec;
          kd[r * Dk + i] = kr[i] * dec;
          kcarry[i] += kr[i] * dks[r * Dk + i];
        }
        F* dvr = c.row(dv, L.dv, r, Dv);
        for (int64_t j = 0; j < Dv; ++j) dvr[j] = 0;
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) dvr[j] += kd[r * Dk + i] * dSn1[i * Dv + j];
        for (int64_t t = r; t < len; ++t) {
          const F p = P[t * len + r];
          const F* dot = c.row(dout, L.dout, t, Dv);
          for (int64_t j = 0; j < Dv; ++j) dvr[j] += p * dot[j];
        }
      }
      // Intra-chunk parts of dq' and dk, sub-chunk by sub-chunk.
      Vec<F> ref(static_cast<size_t>(len * Dk)), acc(static_cast<size_t>(Dk));
      const size_t c_sub = static_cast<size_t>(L.sub_chunk);
      Vec<F> ea(c_sub), eb(c_sub), qq(c_sub), kk(c_sub), dqa(c_sub), dka(c_sub);
      for (int64_t I = 0; I < c.n_sub(); ++I) {
        const int64_t lo = c.sub_lo(I), hi = c.sub_hi(I);
        // dq'[r in I] from the keys of earlier sub-chunks, referenced to the first row of I.
        for (int64_t s = 0; s < lo; ++s)
          for (int64_t i = 0; i < Dk; ++i) ref[s * Dk + i] = c.row(k, L.k, s, Dk)[i] * std::exp(c.cum(lo, i) - c.cum(s, i));
        for (int64_t r = lo; r < hi; ++r) {
          std::fill(acc.begin(), acc.end(), F(0));
          for (int64_t s = 0; s < lo; ++s)
            for (int64_t i = 0; i < Dk; ++i) acc[i] += dP[r * len + s] * ref[s * Dk + i];
          for (int64_t i = 0; i < Dk; ++i) dqs[r * Dk + i] += std::exp(c.cum(r, i) - c.cum(lo, i)) * acc[i];
        }
        // dk[s in I] from the queries of later sub-chunks, referenced to the last row of I.
        for (int64_t r = hi; r < len; ++r)
          for (int64_t i = 0; i < Dk; ++i)
            ref[r * Dk + i] = scale * c.row(q, L.q, r, Dk)[i] * std::exp(c.cum(r, i) - c.cum(hi - 1, i));
        for (int64_t s = lo; s < hi; ++s) {
          std::fill(acc.begin(), acc.end(), F(0));
          for (int64_t r = hi; r < len; ++r)
            for (int64_t i = 0; i < Dk; ++i) acc[i] += dP[r * len + s] * ref[r * Dk + i];
          for (int64_t i = 0; i < Dk; ++i) dks[s * Dk + i] += std::exp(c.cum(hi - 1, i) - c.cum(s, i)) * acc[i];
        }
        // Diagonal block. Factorised columns: exp(B_r - B_s) = ea_r eb_s with ea = exp(B - B[lo]),
        // eb = exp(B[lo] - B); the sums over dP take k eb and scale q ea, and ea, eb multiply them
        // after. Wide columns: exact pairwise exponents.
        for (int64_t i = 0; i < Dk; ++i) {
          const int64_t m = hi - lo;
          const bool exact = c.wide(lo, hi, i);
          for (int64_t l = 0; l < m; ++l) {
            ea[l] = exact ? F(1) : std::exp(c.cum(lo + l, i) - c.cum(lo, i));
            eb[l] = exact ? F(1) : std::exp(c.cum(lo, i) - c.cum(lo + l, i));
            qq[l] = scale * c.row(q, L.q, lo + l, Dk)[i] * ea[l];
            kk[l] = c.row(k, L.k, lo + l, Dk)[i] * eb[l];
            dqa[l] = dka[l] = 0;
          }
          for (int64_t rl = 0; rl < m; ++rl)
            for (int64_t sl = 0; sl <= rl; ++sl) {
              F d = dP[(lo + rl) * len + lo + sl];
              if (exact) d *= std::exp(c.cum(lo + rl, i) - c.cum(lo + sl, i));
              dqa[rl] += d * kk[sl];
              dka[sl] += d * qq[rl];
            }
          for (int64_t l = 0; l < m; ++l) {
            dqs[(lo + l) * Dk + i] += ea[l] * dqa[l];
            dks[(lo + l) * Dk + i] += eb[l] * dka[l];
          }
        }
      }
      // Write dq, dk; dg = the chunk-local reverse cumsum of q*dq - k*dk plus rowsum(dS_n+1 * S_n+1),
      // the later chunks' share, as exp(bn) rowsum(dS_n+1 * S_n) + colsum(k * dk_inter) (docs/gla.md §4.3).
      for (int64_t i = 0; i < Dk; ++i) {
        F acc = 0;
        for (int64_t j = 0; j < Dv; ++j) acc += dSn1[i * Dv + j] * Sn[i * Dv + j];
        acc = std::exp(c.total(i)) * acc + kcarry[i];
        for (int64_t r = len - 1; r >= 0; --r) {
          const F dqv = scale * dqs[r * Dk + i], dkv = dks[r * Dk + i];
          c.row(dq, L.dq, r, Dk)[i] = dqv;
          c.row(dk, L.dk, r, Dk)[i] = dkv;
          acc += c.row(q, L.q, r, Dk)[i] * dqv - c.row(k, L.k, r, Dk)[i] * dkv;
          c.row(dg, L.dg, r, Dk)[i] = acc;
        }
      }
    }
  }
}

template <class F>
void gla_step_cpu(const GlaStepLayout& L, const F* q, const F* k, const F* v, const F* g, F* state, F* o) {
  const int64_t Dk = L.Dk, Dv = L.Dv;
  const F scale = static_cast<F>(L.scale);
#pragma omp parallel for schedule(static) if (L.B * L.H * Dk * Dv > kParallelWork)
  for (int64_t bh = 0; bh < L.B * L.H; ++bh) {
    const int64_t b = bh / L.H, h = bh % L.H;
    const F *qb = q + b * L.q + h * Dk, *kb = k + b * L.k + h * Dk, *gb = g + b * L.g + h * Dk;
    const F* vb = v + b * L.v + h * Dv;
    F* ob = o + b * L.o + h * Dv;
    F* S = state + bh * Dk * Dv;
    for (int64_t j = 0; j < Dv; ++j) ob[j] = 0;
    for (int64_t i = 0; i < Dk; ++i) {
      const F a = std::exp(gb[i]);
      for (int64_t j = 0; j < Dv; ++j) {
        const F s = a * S[i * Dv + j] + kb[i] * vb[j];
        S[i * Dv + j] = s;
        ob[j] += qb[i] * s;
      }
    }
    for (int64_t j = 0; j < Dv; ++j) ob[j] *= scale;
  }
}

#define LINAC_GLA_CHUNK(F)                                                                                         \
  template void gla_fwd_chunk_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*, F*, F*); \
  template void gla_bwd_chunk_cpu<F>(const GlaLayout&, const F*, const F*, const F*, const F*, const F*,          \
                                     const F*, const F*, F*, F*, F*, F*, F*);                                      \
  template void gla_step_cpu<F>(const GlaStepLayout&, const F*, const F*, const F*, const F*, F*, F*);
LINAC_GLA_CHUNK(float)
LINAC_GLA_CHUNK(double)
#undef LINAC_GLA_CHUNK

}  // namespace linac
