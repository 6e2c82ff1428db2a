// CPU GEMM (math in matmul.h): the packed, cache-blocked scheme of Goto & van de Geijn
// ("Anatomy of high-performance matrix multiplication", 2008) with a register-blocked
// micro-kernel in plain loops that GCC vectorises (-O3 -march=native).
//
// Work units are (batch entry, NC-column tile of C, chunk of rows), split statically over the
// threads; each thread packs its own panels, so no thread waits for another. Within a unit, K
// runs in KC-deep blocks: the unit packs B[KC x NC] once as NR-column micro-panels (k-major: NR
// values of row p, then of row p+1, ...), then for each MC rows packs A[MC x KC] as MR-row
// micro-panels (MR values of column p, then of p+1, ...) and runs the micro-kernel over every
// MR x NR block. Packing absorbs transposes and row strides and zero-pads ragged edges.
//
// Determinism: every element of C gets the same operations whatever the thread count or its
// position in a tile: per KC block (in order) a sum from p = 0 up in one SIMD lane, then one
// update of C. Only the split of rows into units depends on the thread count.
#include <algorithm>
#include <cstddef>
#include <new>

#include <omp.h>

#include "matmul/matmul.h"

namespace linac {
namespace {

// MR x NR accumulators fill 12 of the 16 AVX2 registers (two 8-float or 4-double vectors per
// row); the B micro-panel (KC x NR) stays in L1, the A block (MC x KC) in L2.
template <class T>
struct Blocking;
template <>
struct Blocking<float> {
  static constexpr int MR = 6, NR = 16;
  static constexpr int64_t MC = 96, NC = 256, KC = 256;
};
template <>
struct Blocking<double> {
  static constexpr int MR = 6, NR = 8;
  static constexpr int64_t MC = 96, NC = 128, KC = 256;
};

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr double kParallelMinMacs = 1 << 16;

template <class T>
struct Scratch {
  T* p;
  explicit Scratch(size_t n) : p(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{64}))) {}
  ~Scratch() { ::operator delete[](p, std::align_val_t{64}); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// Rows [i0, i0+mc) and k-columns [p0, p0+kc) of op(A) into MR-row micro-panels. Full panels
// take fixed-trip loops (vectorised copies); the ragged last one is zero-padded.
template <class T>
void pack_a(const T* a, int64_t lda, bool trans, int64_t i0, int64_t mc, int64_t p0, int64_t kc, T* __restrict dst) {
  constexpr int MR = Blocking<T>::MR;
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int64_t rows = std::min<int64_t>(MR, mc - ir);
    T* __restrict d = dst + ir * kc;
    if (trans) {  // op(A)(i, p) = a[p * lda + i]: each k row is contiguous in i
      const T* src = a + p0 * lda + i0 + ir;
      if (rows == MR) {
        for (int64_t p = 0; p < kc; ++p)
#pragma omp simd
          for (int i = 0; i < MR; ++i) d[p * MR + i] = src[p * lda + i];
      } else {
        for (int64_t p = 0; p < kc; ++p)
          for (int64_t i = 0; i < MR; ++i) d[p * MR + i] = i < rows ? src[p * lda + i] : T(0);
      }
    } else {  // op(A)(i, p) = a[i * lda + p]: MR row streams, written interleaved
      const T* src = a + (i0 + ir) * lda + p0;
      if (rows == MR) {
        for (int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) d[p * MR + i] = src[i * lda + p];
      } else {
        for (int64_t p = 0; p < kc; ++p)
          for (int64_t i = 0; i < MR; ++i) d[p * MR + i] = i < rows ? src[i * lda + p] : T(0);
      }
    }
  }
}

// k-rows [p0, p0+kc) and columns [j0, j0+nc) of op(B) into NR-column micro-panels, likewise.
template <class T>
void pack_b(const T* b, int64_t ldb, bool trans, int64_t p0, int64_t kc, int64_t j0, int64_t nc, T* __restrict dst) {
  constexpr int NR = Blocking<T>::NR;
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t cols = std::min<int64_t>(NR, nc - jr);
    T* __restrict d = dst + jr * kc;
    if (trans) {  // op(B)(p, j) = b[j * ldb + p]: NR row streams, written interleaved
      const T* src = b + (j0 + jr) * ldb + p0;
      if (cols == NR) {
        for (int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 16
          for (int j = 0; j < NR; ++j) d[p * NR + j] = src[j * ldb + p];
      } else {
        for (int64_t p = 0; p < kc; ++p)
          for (int64_t j = 0; j < NR; ++j) d[p * NR + j] = j < cols ? src[j * ldb + p] : T(0);
      }
    } else {  // op(B)(p, j) = b[p * ldb + j]: each k row is contiguous in j
      const T* src = b + p0 * ldb + j0 + jr;
      if (cols == NR) {
        for (int64_t p = 0; p < kc; ++p)
#pragma omp simd
          for (int j = 0; j < NR; ++j) d[p * NR + j] = src[p * ldb + j];
      } else {
        for (int64_t p = 0; p < kc; ++p)
          for (int64_t j = 0; j < NR; ++j) d[p * NR + j] = j < cols ? src[p * ldb + j] : T(0);
      }
    }
  }
}

// acc = sum_p a[p, 0:MR]^T b[p, 0:NR] over one KC block. `omp simd` makes GCC vectorise the
// j loop before any unrolling and then unroll it completely, so the MR x NR accumulators live
// in registers: per p, NR/W vector loads of b, MR broadcasts of a, MR*NR/W FMAs. (Letting the
// unroller go first instead leaves SLP code that spills and permutes lanes.) Lanes are
// independent sums, so no reassociation happens.
template <class T>
[[gnu::noinline]] void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict acc_out) {
  constexpr int MR = Blocking<T>::MR, NR = Blocking<T>::NR;
  T acc[MR][NR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < MR; ++i) {
      const T ai = a[p * MR + i];
#pragma omp simd
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[p * NR + j];
    }
  }
  for (int i = 0; i < MR; ++i)
#pragma omp simd
    for (int j = 0; j < NR; ++j) acc_out[i * NR + j] = acc[i][j];
}

// C block (rows x cols valid of MR x NR) from the micro-kernel's sums. The first K block
// applies beta (never reading C when beta == 0), later ones add on.
template <class T>
inline void update_c(const T* __restrict acc, T* __restrict c, int64_t ldc, int64_t rows, int64_t cols, T alpha,
                     T beta, bool first) {
  constexpr int NR = Blocking<T>::NR;
  for (int64_t i = 0; i < rows; ++i) {
    T* __restrict ci = c + i * ldc;
    const T* __restrict ai = acc + i * NR;
    if (!first)
      for (int64_t j = 0; j < cols; ++j) ci[j] += alpha * ai[j];
    else if (beta == T(0))
      for (int64_t j = 0; j < cols; ++j) ci[j] = alpha * ai[j];
    else
      for (int64_t j = 0; j < cols; ++j) ci[j] = alpha * ai[j] + beta * ci[j];
  }
}

// Splits the rows of C into chunks so that batch * n_tiles * chunks work units are at least
// twice the thread count and, where possible, a multiple of it. A unit packs each B block once
// and reuses it for all its rows, so chunks stay as tall as balance allows.
inline int64_t row_chunks(int64_t m_blocks, int64_t outer_units, int64_t threads) {
  if (threads <= 1) return 1;
  int64_t chunks = std::min(m_blocks, (2 * threads + outer_units - 1) / outer_units);
  for (int64_t c = chunks; c <= m_blocks; ++c)
    if (outer_units * c % threads == 0) return c;
  return chunks;
}

}  // namespace

template <class T>
void matmul_cpu(const GemmProblem& pr, const T* a, const T* b, T* c) {
  using B = Blocking<T>;
  constexpr int MR = B::MR, NR = B::NR;
  const int64_t m = pr.m, n = pr.n, k = pr.k;
  if (m == 0 || n == 0 || pr.batch == 0) return;
  const T alpha = static_cast<T>(pr.alpha), beta = static_cast<T>(pr.beta);
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                            static_cast<double>(pr.batch) >= kParallelMinMacs;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int64_t n_tiles = (n + B::NC - 1) / B::NC, m_blocks = (m + MR - 1) / MR;
  const int64_t want = row_chunks(m_blocks, pr.batch * n_tiles, threads);
  const int64_t blocks_per_chunk = (m_blocks + want - 1) / want;
  const int64_t chunks = (m_blocks + blocks_per_chunk - 1) / blocks_per_chunk;  // none empty
  const int64_t chunk_rows = blocks_per_chunk * MR;
  const int64_t units = pr.batch * n_tiles * chunks;
  const int64_t mc_max = std::min(B::MC, m_blocks * MR);
  const int64_t nc_max = std::min(B::NC, (n + NR - 1) / NR * NR);
  const int64_t kc_max = std::min(B::KC, k);

#pragma omp parallel if (parallel)
  {
    Scratch<T> pa(static_cast<size_t>(mc_max * kc_max)), pb(static_cast<size_t>(nc_max * kc_max));
    alignas(64) T acc[MR * NR];
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t bi = u / (n_tiles * chunks), rest = u % (n_tiles * chunks);
      const int64_t j0 = (rest / chunks) * B::NC, r0 = (rest % chunks) * chunk_rows;
      const int64_t nc = std::min(B::NC, n - j0), r1 = std::min(m, r0 + chunk_rows);
      const T* ab = a + bi * pr.batch_stride_a;
      const T* bb = b + bi * pr.batch_stride_b;
      T* cb = c + bi * pr.batch_stride_c;
      for (int64_t p0 = 0; p0 < k; p0 += B::KC) {
        const int64_t kc = std::min(B::KC, k - p0);
        pack_b(bb, pr.ldb, pr.trans_b, p0, kc, j0, nc, pb.p);
        for (int64_t i0 = r0; i0 < r1; i0 += B::MC) {
          const int64_t mc = std::min(B::MC, r1 - i0);
          pack_a(ab, pr.lda, pr.trans_a, i0, mc, p0, kc, pa.p);
          for (int64_t jr = 0; jr < nc; jr += NR)
            for (int64_t ir = 0; ir < mc; ir += MR) {
              micro_kernel(kc, pa.p + ir * kc, pb.p + jr * kc, acc);
              update_c(acc, cb + (i0 + ir) * pr.ldc + j0 + jr, pr.ldc, std::min<int64_t>(MR, mc - ir),
                       std::min<int64_t>(NR, nc - jr), alpha, beta, p0 == 0);
            }
        }
      }
    }
  }
}

template void matmul_cpu<float>(const GemmProblem&, const float*, const float*, float*);
template void matmul_cpu<double>(const GemmProblem&, const double*, const double*, double*);

template <class T>
void add_bias_rows_cpu(const GemmProblem& p, const T* bias, T* c) {
  const bool parallel = static_cast<double>(p.m) * static_cast<double>(p.n) >= kParallelMinMacs;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) c[i * p.ldc + j] += bias[j];
}

template void add_bias_rows_cpu<float>(const GemmProblem&, const float*, float*);
template void add_bias_rows_cpu<double>(const GemmProblem&, const double*, double*);

template <class T>
void copy_rows_cpu(const GemmProblem& p, const T* c_in, T* c) {
  for (int64_t i = 0; i < p.m; ++i) std::copy_n(c_in + i * p.ldc, p.n, c + i * p.ldc);
}

template void copy_rows_cpu<float>(const GemmProblem&, const float*, float*);
template void copy_rows_cpu<double>(const GemmProblem&, const double*, double*);

}  // namespace linac
