// The packed form of VQ-attention's block algorithm (layout in vq_packed.h): the workspace
// carve, the GEMM helper, packing of the inputs into [P Tp, D] rows, the bias tables
// (u.khat_j, u.C_s, vr.rho_d, and per block u.C_s + log N_s; all f32) with the hi/lo bf16 parts
// of the codebook and rho, and the three score GEMMs of a chunk of blocks. Shared by the forward
// and the backward.
#include <algorithm>
#include <string>

#include "vq_attn/vq_common.cuh"

namespace linac {
namespace vq_cuda {
namespace {

using cuda::from_float;
using cuda::to_float;
using cuda::warp_sum;

constexpr int kThreads = 256;

// The pair, packed position, head, sequence and token (-1: padding) of packed row `row` (32-bit:
// carve checks that rows fit).
struct PackedRow {
  uint32_t p, t, h, b;
  int64_t s;
};
__device__ __forceinline__ PackedRow packed_row(const Geo& g, uint32_t row) {
  const uint32_t Tp = static_cast<uint32_t>(g.Tp), B = static_cast<uint32_t>(g.B);
  PackedRow r;
  r.p = row / Tp;
  r.t = row - r.p * Tp;
  r.h = r.p / B;
  r.b = r.p - r.h * B;
  r.s = source_token(g, r.b, r.t);
  return r;
}

// Row-tiled over the packed rows; four columns per access where every row involved is 4-aligned.
// Each row is written `copies` times side by side (dst rows copies * D wide).
template <bool kVec, class T>
__global__ void __launch_bounds__(kThreads) pack_kernel(Geo g, const T* __restrict__ src, VqAttnLayout::Strides s,
                                                        int D, const float* __restrict__ add, T* __restrict__ dst,
                                                        int copies, int log_tpr) {
  const cuda::RowSlot rs = cuda::row_slot(log_tpr);
  if (rs.row >= g.P * g.Tp) return;
  const PackedRow w = packed_row(g, static_cast<uint32_t>(rs.row));
  T* out = dst + rs.row * D * copies;
  const int step = kVec ? 4 * rs.lanes : rs.lanes;
  if (w.s < 0) {
    for (int d = (kVec ? 4 : 1) * rs.lane; d < D * copies; d += step) {
      if constexpr (kVec)
        cuda::store4(out + d, make_float4(0.f, 0.f, 0.f, 0.f));
      else
        out[d] = from_float<T>(0.f);
    }
    return;
  }
  const T* in = src + w.b * s.b + w.s * s.t + int64_t{w.h} * D;
  const float* a = add ? add + int64_t{w.h} * D : nullptr;
  if constexpr (kVec) {
    for (int d = 4 * rs.lane; d < D; d += step) {
      float4 x = cuda::load4(in + d);
      if (a) {
        const float4 y = cuda::load4(a + d);
        x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      }
      for (int c = 0; c < copies; ++c) cuda::store4(out + c * D + d, x);
    }
  } else {
    for (int d = rs.lane; d < D; d += step) {
      const T x = a ? from_float<T>(to_float(in[d]) + a[d]) : in[d];
      for (int c = 0; c < copies; ++c) out[c * D + d] = x;
    }
  }
}

// Warp per packed row.
template <bool kVec, class T>
__global__ void row_dots_kernel(Geo g, const T* __restrict__ x, VqAttnLayout::Strides xs, int D,
                                const float* __restrict__ vec, const T* __restrict__ y, VqAttnLayout::Strides ys,
                                float* __restrict__ out) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= g.P * g.Tp) return;
  const PackedRow w = packed_row(g, static_cast<uint32_t>(row));
  float acc = 0;
  if (w.s >= 0) {
    const T* xr = x + w.b * xs.b + w.s * xs.t + int64_t{w.h} * D;
    const T* yr = y ? y + w.b * ys.b + w.s * ys.t + int64_t{w.h} * D : nullptr;
    const float* vr = yr ? nullptr : vec + int64_t{w.h} * D;
    if constexpr (kVec) {
      for (int d = 4 * lane; d < D; d += 128) {
        const float4 a = cuda::load4(xr + d), b = yr ? cuda::load4(yr + d) : cuda::load4(vr + d);
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
    } else {
      for (int d = lane; d < D; d += 32) acc += to_float(xr[d]) * (yr ? to_float(yr[d]) : vr[d]);
    }
    acc = warp_sum(acc);
  }
  if (lane == 0) out[row] = acc;
}

// Warp per packed row.
__global__ void unit_sums_kernel(Geo g, const float* __restrict__ units, float* __restrict__ out) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= g.P * g.Tp) return;
  const PackedRow w = packed_row(g, static_cast<uint32_t>(row));
  float acc = 0;
  if (w.s >= 0) {
    const int per_head = static_cast<int>(g.Dv / 8);
    const float* u = units + (int64_t{w.b} * g.T + w.s) * (g.H * per_head) + int64_t{w.h} * per_head;
    for (int j = lane; j < per_head; j += 32) acc += u[j];
    acc = warp_sum(acc);
  }
  if (lane == 0) out[row] = acc;
}

// Warp per row of an f32 table X [H, rows, Dk]: dot [H, rows_out] = vec[h] . X[h, r]; tab [H,
// rows_out, ldt]: X rounded to T (hi), and with `split` (bf16) the rest rounded (lo) beside it,
// columns Dk .. 2 Dk; both zero past `rows`.
template <class T>
__global__ void table_kernel(int64_t H, int64_t rows, int64_t rows_out, int64_t Dk, const float* __restrict__ X,
                             const float* __restrict__ vec, float* __restrict__ dot, T* __restrict__ tab, int64_t ldt,
                             bool split) {
  const int64_t i = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (i >= H * rows_out) return;
  const int64_t h = i / rows_out, r = i % rows_out;
  float acc = 0;
  for (int64_t d = lane; d < Dk; d += 32) {
    const float x = r < rows ? X[(h * rows + r) * Dk + d] : 0.f;
    acc += x * vec[h * Dk + d];
    const T xh = from_float<T>(x);
    tab[i * ldt + d] = xh;
    if (split) tab[i * ldt + Dk + d] = from_float<T>(x - to_float(xh));
  }
  acc = warp_sum(acc);
  if (lane == 0) dot[i] = acc;
}

// cbias[i, s] = ucb[h(i), s] + log N^(i)_s, -inf where N = 0 and for s >= S (Ws::cbias).
__global__ void cache_bias_kernel(Geo g, const float* __restrict__ counts, const float* __restrict__ ucb,
                                  float* __restrict__ cbias) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= g.NB * g.lds) return;
  const int64_t i = e / g.lds, s = e - i * g.lds, h = i / g.R / g.B;
  const float N = s < g.S ? counts[i * g.S + s] : 0.f;
  cbias[e] = N > 0 ? ucb[h * g.S + s] + logf(N) : -INFINITY;
}

__global__ void fill_kernel(float* __restrict__ x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

}  // namespace

Ws carve(const Ctx& ctx, const Geo& g, size_t act_bytes, bool backward, const char* op) {
  const size_t fixed = layout(g, act_bytes, backward, 0, nullptr, nullptr);
  const size_t per_block = layout(g, act_bytes, backward, 1, nullptr, nullptr) - fixed;
  LINAC_CHECK(g.P * g.Tp < (int64_t{1} << 31) && std::max(g.Dk, g.Dv) < (int64_t{1} << 30),
              std::string(op) + ": more than 2^31 packed rows or 2^30 head dims");
  LINAC_CHECK(ctx.workspace_bytes >= fixed + per_block,
              std::string(op) + ": ctx.workspace has " + std::to_string(ctx.workspace_bytes) + " bytes, need at least " +
                  std::to_string(fixed + per_block) + " (vq_attn_workspace_bytes)");
  // Chunk scratch is rounded per buffer, so a chunk of c blocks can need slightly more than c
  // times one block's: step down until it fits.
  int64_t cap = std::min<int64_t>(g.B * g.R, static_cast<int64_t>((ctx.workspace_bytes - fixed) / per_block));
  while (cap > 1 && layout(g, act_bytes, backward, cap, nullptr, nullptr) > ctx.workspace_bytes) --cap;
  Ws w{};
  layout(g, act_bytes, backward, cap, static_cast<char*>(ctx.workspace), &w);
  const Ctx blas_ws = w.blas;
  w.blas = ctx;
  w.blas.workspace = blas_ws.workspace;
  w.blas.workspace_bytes = blas_ws.workspace_bytes;
  return w;
}

void gemm(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, int64_t batch, Operand a, Operand b, void* c,
          int64_t ldc, int64_t stride_c, float beta, bool tf32_exact, DType cd, const float* bias) {
  if (m == 0 || n == 0 || k == 0 || batch == 0) return;
  GemmProblem pr;
  pr.m = m, pr.n = n, pr.k = k, pr.batch = batch;
  pr.trans_a = a.trans, pr.trans_b = b.trans;
  pr.lda = a.ld, pr.ldb = b.ld, pr.ldc = ldc;
  pr.batch_stride_a = a.stride, pr.batch_stride_b = b.stride, pr.batch_stride_c = stride_c;
  pr.alpha = 1, pr.beta = beta;
  pr.tf32_exact = tf32_exact;
  pr.bias = bias;
  const Tensor ta(const_cast<void*>(a.p), ab, Device::CUDA, {1}), tb(const_cast<void*>(b.p), ab, Device::CUDA, {1});
  const Tensor tc(c, cd, Device::CUDA, {1});
  matmul_cuda(blas, pr, ta, tb, tc);
}

void gemm_table(const Ctx& blas, DType ab, int64_t m, int64_t n, int64_t k, int64_t batch, Operand a, const void* tab,
                int64_t ldt, float* c, int64_t ldc, int64_t stride_c, float beta) {
  gemm(blas, ab, m, n, k, batch, a, {tab, ldt, 0, false}, c, ldc, stride_c, beta);
  if (ab == DType::BF16) {
    const void* lo = static_cast<const char*>(tab) + n * static_cast<int64_t>(dtype_size(ab));
    gemm(blas, ab, m, n, k, batch, a, {lo, ldt, 0, false}, c, ldc, stride_c, 1.f);
  }
}

template <class T>
void pack(const Ctx& ctx, const Geo& g, const T* src, VqAttnLayout::Strides s, int64_t D, const float* add, T* dst,
          int copies) {
  const bool vec = D % 4 == 0 && cuda::rows_vec4(src, sizeof(T), s.t) && s.b % 4 == 0 &&
                   (!add || cuda::rows_vec4(add, sizeof(float), D)) && cuda::rows_vec4(dst, sizeof(T), D);
  const cuda::RowTiling rt = cuda::row_tiling(g.P * g.Tp, (vec ? D / 4 : D) * copies, kThreads);
  const int d = static_cast<int>(D);
  if (vec)
    pack_kernel<true, T><<<rt.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(g, src, s, d, add, dst, copies, rt.log_tpr);
  else
    pack_kernel<false, T><<<rt.blocks, kThreads, 0, cuda::stream_of(ctx)>>>(g, src, s, d, add, dst, copies, rt.log_tpr);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void row_dots(const Ctx& ctx, const Geo& g, const T* x, VqAttnLayout::Strides xs, int64_t D, const float* vec,
              const T* y, VqAttnLayout::Strides ys, float* out) {
  const bool vec4 = D % 4 == 0 && cuda::rows_vec4(x, sizeof(T), xs.t) && xs.b % 4 == 0 &&
                    (y ? cuda::rows_vec4(y, sizeof(T), ys.t) && ys.b % 4 == 0 : cuda::rows_vec4(vec, sizeof(float), D));
  const unsigned blocks = cuda::grid_1d(g.P * g.Tp * 32, kThreads);
  const int d = static_cast<int>(D);
  if (vec4)
    row_dots_kernel<true, T><<<blocks, kThreads, 0, cuda::stream_of(ctx)>>>(g, x, xs, d, vec, y, ys, out);
  else
    row_dots_kernel<false, T><<<blocks, kThreads, 0, cuda::stream_of(ctx)>>>(g, x, xs, d, vec, y, ys, out);
  LINAC_CUDA_LAUNCH_CHECK();
}

void unit_sums(const Ctx& ctx, const Geo& g, const float* units, float* out) {
  unit_sums_kernel<<<cuda::grid_1d(g.P * g.Tp * 32, kThreads), kThreads, 0, cuda::stream_of(ctx)>>>(g, units, out);
  LINAC_CUDA_LAUNCH_CHECK();
}

int64_t packed_row_stride(const Geo& g, VqAttnLayout::Strides s, int64_t D) {
  const bool packed = !g.docs.src && g.H == 1 && g.T == g.Tp && s.t >= D && (g.B == 1 || s.b == g.T * s.t);
  return packed ? s.t : 0;
}

bool is_packed(const Geo& g, VqAttnLayout::Strides s, int64_t D) { return packed_row_stride(g, s, D) == D; }

template <class T>
void prepare(const Ctx& ctx, const Geo& g, const VqAttnLayout& L, Ws& w, const T* q, const T* khat, const int32_t* z,
             const T* v, const float* codebook, const float* u, const float* vr, const float* rho, bool backward) {
  cudaStream_t st = cuda::stream_of(ctx);
  const bool split = sizeof(T) == 2;
  auto place = [&](const T* x, VqAttnLayout::Strides s, int64_t D, void*& dst) {
    if (is_packed(g, s, D))
      dst = const_cast<T*>(x);  // read only
    else
      pack<T>(ctx, g, x, s, D, nullptr, static_cast<T*>(dst));
  };
  // What only the scores read (packed q, its doubled copy, u.khat): not for a backward that has
  // the forward's weights.
  const bool scores = !backward || !L.saved_weights;
  if (scores) {
    place(q, L.q, g.Dk, w.qp);
    if (w.qq) pack<T>(ctx, g, q, L.q, g.Dk, nullptr, static_cast<T*>(w.qq), 2);
    row_dots<T>(ctx, g, khat, L.khat, g.Dk, u, nullptr, {}, w.ub);
  }
  place(khat, L.khat, g.Dk, w.kp);
  place(v, L.v, g.Dv, w.vp);
  table_kernel<T><<<cuda::grid_1d(g.H * g.S * 32, kThreads), kThreads, 0, st>>>(
      g.H, g.S, g.S, g.Dk, codebook, u, w.ucb, static_cast<T*>(w.ctab), w.ldt, split);
  LINAC_CUDA_LAUNCH_CHECK();
  table_kernel<T><<<cuda::grid_1d(g.H * g.ldp * 32, kThreads), kThreads, 0, st>>>(
      g.H, g.Lb + 1, g.ldp, g.Dk, rho, vr, w.vrho, static_cast<T*>(w.rtab), w.ldt, split);
  LINAC_CUDA_LAUNCH_CHECK();
  if (L.saved_cache) {
    const SavedCache saved = saved_cache(g, sizeof(T), L.saved_cache);
    w.ubar = saved.ubar;
    w.counts = saved.counts;
  }
  if (!backward || !L.saved_cache) {
    const CodeLists lists = code_lists(ctx, z, g.docs.packed, g.B, g.T, g.H, g.S, g.Lb, g.R, w.lists, w.lists_bytes,
                                         "vq_attn");
    cache_scan<T>(ctx, g, v, L.v, lists, w.counts, static_cast<T*>(w.ubar));
  }
  if (scores) {
    cache_bias_kernel<<<cuda::grid_1d(g.NB * g.lds, kThreads), kThreads, 0, st>>>(g, w.counts, w.ucb, w.cbias);
    LINAC_CUDA_LAUNCH_CHECK();
  }
  if (w.ones) {
    fill_kernel<<<cuda::grid_1d(g.B * g.Tp, kThreads), kThreads, 0, st>>>(w.ones, g.B * g.Tp, 1.f);
    LINAC_CUDA_LAUNCH_CHECK();
  }
}

void window_gemm(const Geo& g, const Ws& w, DType act, int64_t i0, int64_t c, bool n_side, Operand a, const void* x,
                 int64_t D, void* cc, int64_t ldc, int64_t stride_c, float beta, DType cd) {
  const size_t es = dtype_size(act);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  auto at_c = [&](int64_t elems) { return static_cast<char*>(cc) + elems * static_cast<int64_t>(dtype_size(cd)); };
  const int64_t Lb = g.Lb;
  if (i0 == 0 && c > 0) {
    if (n_side)
      gemm(w.blas, act, Lb, Lb, D, 1, a, {x, D, 0, true}, at_c(Lb), ldc, 0, beta, false, cd);
    else
      gemm(w.blas, act, Lb, D, Lb, 1, {at(a.p, Lb), a.ld, 0, a.trans}, {x, D, 0, false}, cc, ldc, 0, beta, false, cd);
    a.p = at(a.p, a.stride);
    cc = at_c(stride_c);
    i0 = 1;
    --c;
  }
  if (n_side)
    gemm(w.blas, act, Lb, 2 * Lb, D, c, a, {at(x, (i0 - 1) * Lb * D), D, Lb * D, true}, cc, ldc, stride_c, beta, false,
         cd);
  else
    gemm(w.blas, act, Lb, D, 2 * Lb, c, a, {at(x, (i0 - 1) * Lb * D), D, Lb * D, false}, cc, ldc, stride_c, beta, false,
         cd);
}

void chunk_scores(const Geo& g, const Ws& w, DType act, int64_t h, int64_t i0, int64_t c) {
  const size_t es = dtype_size(act);
  auto at = [&](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * static_cast<int64_t>(es); };
  const int64_t Lb = g.Lb, Dk = g.Dk, rows = c * Lb;
  const Operand qa{at(w.qp, i0 * Lb * Dk), Dk, Lb * Dk, false};
  // swin[i] = q_i [Lb, Dk] @ (keys (i-1) Lb .. (i+1) Lb)^T
  window_gemm(g, w, act, i0, c, true, qa, w.kp, Dk, w.swin, g.ldw, Lb * g.ldw, 0.f);
  const void* ctab = at(w.ctab, h * g.S * w.ldt);
  const void* rtab = at(w.rtab, h * g.ldp * w.ldt);  // all ldp distances (padding rows are zero):
                                                     // a GEMM dimension of Lb + 1 is odd
  // bf16: [q | q] . [hi | lo], both parts in one product (vq_packed.h); f32: q . C. Where a pair
  // has at most four blocks, only for the rows of those with a cache (for_cached_blocks;
  // RowScores reads no others).
  const Operand qt = w.qq ? Operand{at(w.qq, i0 * Lb * 2 * Dk), 2 * Dk, 0, false} : qa;
  const int64_t kt = w.qq ? 2 * Dk : Dk;
  for_cached_blocks(g, i0, c, [&](int64_t i, int64_t batch, int64_t stride) {
    const int64_t m = stride == 1 ? batch * Lb : Lb, nb = stride == 1 ? 1 : batch;
    gemm(w.blas, act, m, g.S, kt, nb, {at(qt.p, (i - i0) * Lb * qt.ld), qt.ld, stride * Lb * qt.ld, false},
         {ctab, w.ldt, 0, true}, w.scache + (i - i0) * Lb * g.lds, g.lds, stride * Lb * g.lds, 0.f);
  });
  gemm(w.blas, act, rows, g.ldp, kt, 1, qt, {rtab, w.ldt, 0, true}, w.pos, g.ldp, 0, 0.f, false, DType::F32,
       w.vrho + h * g.ldp);  // + vr.rho_d in the epilogue
}

#define LINAC_VQ_PREPARE(T)                                                                                            \
  template void prepare<T>(const Ctx&, const Geo&, const VqAttnLayout&, Ws&, const T*, const T*, const int32_t*,      \
                           const T*, const float*, const float*, const float*, const float*, bool);                    \
  template void pack<T>(const Ctx&, const Geo&, const T*, VqAttnLayout::Strides, int64_t, const float*, T*, int);     \
  template void row_dots<T>(const Ctx&, const Geo&, const T*, VqAttnLayout::Strides, int64_t, const float*, const T*, \
                            VqAttnLayout::Strides, float*);
LINAC_VQ_PREPARE(float)
LINAC_VQ_PREPARE(__nv_bfloat16)
#undef LINAC_VQ_PREPARE

}  // namespace vq_cuda
}  // namespace linac
