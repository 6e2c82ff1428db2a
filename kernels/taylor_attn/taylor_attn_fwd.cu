// CUDA chunked Taylor attention forward (math in taylor_attn.h; feature order and padding in
// taylor_attn_common.cuh) and the kernels the backward reuses.
//
// Per group of (batch, head) pairs (as many as ctx.workspace holds), three launches:
//   prep   grid (N, P): q^ = q F^(-1/4), k^ (exact in bf16 at F = 16: the factor is 1/2), v~ = [v, 1, 0..]
//          and, for the backward, g~ = [dout/den, -(dout . o)/den, 0..] (a warp per row, fixed-order
//          dot product), chunk-major with zero rows past T, so every later tile load is dense.
//   scan   grid (3, P, segments of 32 chunks), six warps per CTA, each owning one 16-row feature
//          block: sequential over the chunks of its segment, the f32 state block lives in mma
//          accumulators; per chunk it is stored (the segment-local exclusive state, rounded to the
//          activation dtype: it only feeds tensor-core matmuls), then the warp forms its block of
//          phi(X)^T for the chunk in shared memory and adds phi(X)^T Y on tensor cores. A 3-stage
//          cp.async pipeline keeps chunks in flight. Segments make the sequential part 32 chunks
//          long whatever T is; a carry kernel turns the segment totals (f32) into each segment's
//          starting state, which the chunk kernel adds. The reverse direction scans
//          R_n = sum over later chunks of phi(q^)^T g~ for the backward.
//   chunk  grid (N, P) (taylor_attn_chunk.cuh): o~ = phi(Q^) S_n + tril(kappa(Q^ K^^T)) V~, phi(Q^)
//          formed per 32-feature slice in shared memory; o = o~ / den, den = o~[Dv] + eps.
// With document bounds the scan, carry and chunk kernels run their kDocs instances (the restarts
// and masks of taylor_attn_common.cuh); prep is the same. The bf16 forward at Dv <= 64 runs the
// fused kernel of taylor_attn_fused.cuh instead of these three launches (unless
// LINAC_TAYLOR_KERNELS=chunk).
#include <algorithm>
#include <type_traits>

#include "taylor_attn/taylor_attn_common.cuh"

namespace linac {
namespace taylor_cuda {
namespace {

// ---- prep ----------------------------------------------------------------------------------

// Four elements per access (load4/store4: 8-byte bf16 or 16-byte f32 vectors; every row offset is
// a multiple of four elements).
template <class T>
__global__ void __launch_bounds__(128) prep_kernel(Args a, const T* __restrict__ q, const T* __restrict__ k,
                                                   const T* __restrict__ v, const T* __restrict__ o,
                                                   const T* __restrict__ dout, const float* __restrict__ den,
                                                   Workspace<T> w, int parts) {
  using linac::cuda::load4;
  using linac::cuda::store4;
  const int n = blockIdx.x, pl = blockIdx.y, pair = a.p0 + pl, b = pair / a.H, h = pair % a.H;
  const int rows = min(kC, a.T - n * kC), tid = threadIdx.x, DvP = a.DvP, Dv = a.Dv;
  const int64_t t0 = static_cast<int64_t>(n) * kC, r0 = (static_cast<int64_t>(pl) * a.N + n) * kC;
  const float scale = 0.5f;  // F^(-1/4) at F = 16
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f), one = make_float4(1.f, 0.f, 0.f, 0.f);
  auto scaled = [&](float4 x) { return make_float4(scale * x.x, scale * x.y, scale * x.z, scale * x.w); };
  for (int idx = tid; idx < (parts & kPrepQKV ? kC * kF / 4 : 0); idx += 128) {
    const int r = idx / (kF / 4), i = 4 * (idx % (kF / 4));
    const bool ok = r < rows;
    store4(w.xq + r0 * kF + 4 * idx, ok ? scaled(load4(q + b * a.q.b + (t0 + r) * a.q.t + h * kF + i)) : zero);
    store4(w.xk + r0 * kF + 4 * idx, ok ? scaled(load4(k + b * a.k.b + (t0 + r) * a.k.t + h * kF + i)) : zero);
  }
  for (int idx = tid; idx < (parts & kPrepQKV ? kC * DvP / 4 : 0); idx += 128) {
    const int r = idx / (DvP / 4), j = 4 * (idx % (DvP / 4));
    float4 val = zero;
    if (r < rows) val = j < Dv ? load4(v + b * a.v.b + (t0 + r) * a.v.t + h * Dv + j) : j == Dv ? one : zero;
    store4(w.vt + r0 * DvP + 4 * idx, val);
  }
  if (!(parts & kPrepG)) return;
  // g~: `lanes` lanes per row (16 when Dv <= 64, so a warp does two rows at a time), a fixed-order
  // dot product dout . o (the order of a warp_sum whose other 16 lanes hold zero).
  const int lanes = Dv <= 64 ? 16 : 32, warp = tid >> 5, lane = tid & 31, l = lane % lanes;
  for (int r = warp * (32 / lanes) + lane / lanes; r < kC; r += 4 * (32 / lanes)) {
    T* g = w.gt + (r0 + r) * DvP;
    const bool ok = r < rows;
    const T* orow = o + b * a.o.b + (t0 + r) * a.o.t + h * Dv;
    const T* drow = dout + b * a.dout.b + (t0 + r) * a.dout.t + h * Dv;
    const float inv = ok ? 1.f / den[static_cast<int64_t>(pair) * a.T + t0 + r] : 0.f;
    float dot = 0.f;
    for (int j = 4 * l; ok && j < Dv; j += 4 * lanes) {
      const float4 d = load4(drow + j), x = load4(orow + j);
      dot += d.x * x.x + d.y * x.y + d.z * x.z + d.w * x.w;
    }
    dot = lanes == 16 ? cuda::lanes_sum<16>(dot) : cuda::lanes_sum<32>(dot);
    for (int j = 4 * l; j < DvP; j += 4 * lanes) {
      float4 val = zero;
      if (ok && j < Dv) {
        const float4 d = load4(drow + j);
        val = make_float4(d.x * inv, d.y * inv, d.z * inv, d.w * inv);
      } else if (ok && j == Dv) {
        val.x = -dot * inv;
      }
      store4(g + j, val);
    }
  }
}

// ---- state scan ----------------------------------------------------------------------------

constexpr int kScanStages = 3, kScanWarps = 6;  // 6 warps share each chunk's tiles

struct ScanSmem {
  int ldx, ldy, ldphi, stage, bytes;
  template <class T>
  __host__ __device__ static ScanSmem of(int DvP) {
    ScanSmem s{};
    s.ldx = ld_of<T>(kF), s.ldy = ld_of<T>(DvP), s.ldphi = ld_of<T>(16);
    s.stage = kC * (s.ldx + s.ldy) * static_cast<int>(sizeof(T));
    s.bytes = kScanStages * s.stage + kScanWarps * kC * s.ldphi * static_cast<int>(sizeof(T));
    return s;
  }
};

// Documents: at a chunk in which a document starts the accumulators restart, and only the rows the
// next state holds enter it: forward the keys s >= start[t1] (the document of the chunk's last
// token), reverse the queries with start < t0 (the document of the token before the chunk).
template <class T, bool kRev, int NT, bool kDocs>
__global__ void __launch_bounds__(32 * kScanWarps) scan_kernel(Args a, const T* __restrict__ x, const T* __restrict__ y,
                                                  T* __restrict__ states, float* __restrict__ carry) {
  extern __shared__ __align__(16) unsigned char smem[];
  const ScanSmem L = ScanSmem::of<T>(a.DvP);
  const int pl = blockIdx.y, seg = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, DvP = a.DvP;
  const int fb = kScanWarps * blockIdx.x + warp, ntv = DvP / 8;
  const int c0 = seg * kSegChunks, N = min(kSegChunks, a.N - c0);  // this segment's chunks
  const Frag f;
  auto stage_x = [&](int s) { return reinterpret_cast<T*>(smem + s * L.stage); };
  auto stage_y = [&](int s) { return reinterpret_cast<T*>(smem + s * L.stage + kC * L.ldx * sizeof(T)); };
  T* phi = reinterpret_cast<T*>(smem + kScanStages * L.stage) + warp * kC * L.ldphi;
  auto chunk = [&](int step) { return c0 + (kRev ? N - 1 - step : step); };
  auto issue = [&](int step) {
    if (step < N) {
      const int s = step % kScanStages;
      const int64_t r0 = (static_cast<int64_t>(pl) * a.N + chunk(step)) * kC;
      load_rows<T, 32 * kScanWarps>(stage_x(s), L.ldx, x + r0 * kF, kF, kC, kF);
      load_rows<T, 32 * kScanWarps>(stage_y(s), L.ldy, y + r0 * DvP, DvP, kC, DvP);
    }
    cp_async_commit();
  };

  float acc[NT][4] = {};
  for (int s = 0; s < kScanStages - 1; ++s) issue(s);
  for (int step = 0; step < N; ++step) {
    const int s = step % kScanStages;
    cp_async_wait<kScanStages - 2>();
    __syncthreads();  // this step's tiles landed; every warp is done with the stage issue() refills
    issue(step + kScanStages - 1);
    T* out = states + ((static_cast<int64_t>(pl) * a.N + chunk(step)) * kRows + 16 * fb) * DvP;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt >= ntv) break;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        store2(out + f.row(0, 2 * hf) * DvP + f.col(0, nt, 0), acc[nt][2 * hf], acc[nt][2 * hf + 1]);
    }
    const T* xs = stage_x(s);
    if constexpr (kDocs) {
      const int64_t t0 = static_cast<int64_t>(chunk(step)) * kC;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kC), a.T - t0));
      const int32_t* start = a.doc_start + static_cast<int64_t>((a.p0 + pl) / a.H) * a.T;
      const int last = start[t0 + rows - 1];
      if (last >= t0)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
      for (int idx = lane; idx < kC * 16; idx += 32) {
        const int tok = idx >> 4, jj = idx & 15;
        const bool in = tok < rows && (kRev ? start[t0 + tok] < t0 : t0 + tok >= last);
        phi[tok * L.ldphi + jj] = linac::cuda::from_float<T>(in ? feature(xs + tok * L.ldx, fb, jj) : 0.f);
      }
    } else {
      for (int idx = lane; idx < kC * 16; idx += 32) {
        const int tok = idx >> 4, jj = idx & 15;
        phi[tok * L.ldphi + jj] = linac::cuda::from_float<T>(feature(xs + tok * L.ldx, fb, jj));
      }
    }
    __syncwarp();
    // state block (16 features x DvP) += phi^T (stored [token][feature]) . Y
    warp_mma<T, true, true, NT>(acc, phi, L.ldphi, 0, 0, stage_y(s), L.ldy, 0, 0, kC / 16, ntv);
    __syncwarp();
  }
  float* tot = carry + ((static_cast<int64_t>(pl) * a.nseg + seg) * kRows + 16 * fb) * DvP;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (nt < ntv) tot[f.row(0, e) * DvP + f.col(0, nt, e)] = acc[nt][e];
}

// Segment totals -> carries in place (exclusive prefix over the segments, in order), a thread per
// four state elements; the full sum (forward) is the final state, the only reader of the last
// segment's total. The totals are read four segments at a time before their carries are stored,
// so the loads are in flight together (a store may alias the next load as far as the compiler
// knows: one at a time, the loop waited out each load's latency, 45 against 19 us at T = 8192).
// Documents: the running sum restarts at a segment in which a document starts (its total already
// restarted there).
template <bool kRev, bool kDocs>
__global__ void __launch_bounds__(128) carry_kernel(Args a, float* __restrict__ carry, float* __restrict__ s_final) {
  constexpr int kBatch = 4;
  const int pl = blockIdx.y, e4 = blockIdx.x * 128 + threadIdx.x, n4 = kRows * a.DvP / 4;
  if (e4 >= n4) return;
  float4* c = reinterpret_cast<float4*>(carry) + static_cast<int64_t>(pl) * a.nseg * n4 + e4;
  auto seg = [&](int i) -> int64_t { return kRev ? a.nseg - 1 - i : i; };  // the i-th segment in scan order
  float4 run = make_float4(0.f, 0.f, 0.f, 0.f);
  const int n = s_final ? a.nseg : a.nseg - 1;  // totals read
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    float4 t[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j < n) t[j] = c[seg(i0 + j) * n4];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j >= n) break;
      const int64_t g = seg(i0 + j);
      c[g * n4] = run;
      if constexpr (kDocs) {
        const int64_t first = g * kSegChunks * kC, last = min(first + kSegChunks * kC, static_cast<int64_t>(a.T)) - 1;
        if (chunk_restarts(a.doc_start + static_cast<int64_t>((a.p0 + pl) / a.H) * a.T, first, last))
          run = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      run.x += t[j].x, run.y += t[j].y, run.z += t[j].z, run.w += t[j].w;
    }
  }
  if (!s_final) {  // the last segment's carry: the sum so far (its own total is not read)
    c[seg(a.nseg - 1) * n4] = run;
    return;
  }
  const int R = kF * kF + kF + 1, W = a.Dv + 1, r = 4 * e4 / a.DvP, col = 4 * e4 % a.DvP;
  const float v[4] = {run.x, run.y, run.z, run.w};
  for (int u = 0; u < 4; ++u)
    if (r < R && col + u < W) s_final[static_cast<int64_t>(a.p0 + pl) * R * W + r * W + col + u] = v[u];
}

template <class K>
void set_smem(K kernel, int bytes) {
  LINAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

template <class T>
void launch_prep(const Ctx& ctx, const Args& a, int P, const T* q, const T* k, const T* v, const T* o,
                 const T* dout, const float* den, const Workspace<T>& w, int parts) {
  prep_kernel<T><<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(P)), 128, 0, cuda::stream_of(ctx)>>>(
      a, q, k, v, o, dout, den, w, parts);
  LINAC_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_scan(const Ctx& ctx, const Args& a, int P, bool reverse, const T* x, const T* y, const Workspace<T>& w,
                 float* s_final) {
  const int bytes = ScanSmem::of<T>(a.DvP).bytes;
  const bool small = a.DvP / 8 <= kNTSmall, docs = a.doc_start != nullptr;
  auto pick = [&](auto rev, auto doc) {
    constexpr bool kRev = decltype(rev)::value, kDocs = decltype(doc)::value;
    return small ? scan_kernel<T, kRev, kNTSmall, kDocs> : scan_kernel<T, kRev, kNTLarge, kDocs>;
  };
  using True = std::true_type;
  using False = std::false_type;
  auto kernel = reverse ? (docs ? pick(True{}, True{}) : pick(True{}, False{}))
                        : (docs ? pick(False{}, True{}) : pick(False{}, False{}));
  set_smem(kernel, bytes);
  const dim3 grid(kBlocks / kScanWarps, static_cast<unsigned>(P), static_cast<unsigned>(a.nseg));
  kernel<<<grid, 32 * kScanWarps, bytes, cuda::stream_of(ctx)>>>(a, x, y, w.S, w.carry);
  LINAC_CUDA_LAUNCH_CHECK();
  // With one segment the chunk kernels add no carry: only the final state needs the pass.
  if (a.nseg > 1 || s_final) launch_carry(ctx, a, P, reverse, w.carry, s_final);
}

void launch_carry(const Ctx& ctx, const Args& a, int P, bool reverse, float* carry, float* s_final) {
  const bool docs = a.doc_start != nullptr;
  const dim3 grid(static_cast<unsigned>(cdiv(kRows * a.DvP / 4, 128)), static_cast<unsigned>(P));
  auto kernel = reverse ? (docs ? carry_kernel<true, true> : carry_kernel<true, false>)
                        : (docs ? carry_kernel<false, true> : carry_kernel<false, false>);
  kernel<<<grid, 128, 0, cuda::stream_of(ctx)>>>(a, carry, s_final);
  LINAC_CUDA_LAUNCH_CHECK();
}

#define LINAC_TAYLOR_LAUNCHERS(T)                                                                                    \
  template void launch_prep<T>(const Ctx&, const Args&, int, const T*, const T*, const T*, const T*, const T*,     \
                               const float*, const Workspace<T>&, int);                                            \
  template void launch_scan<T>(const Ctx&, const Args&, int, bool, const T*, const T*, const Workspace<T>&, float*);
LINAC_TAYLOR_LAUNCHERS(float)
LINAC_TAYLOR_LAUNCHERS(bf16_t)
#undef LINAC_TAYLOR_LAUNCHERS

Args make_args(const TaylorAttnLayout& L) {
  LINAC_CHECK(L.F == kF, "taylor_attn (GPU): needs F = 16, got " + std::to_string(L.F));
  LINAC_CHECK(L.chunk == kC, "taylor_attn (GPU): needs chunk 64");
  LINAC_CHECK(L.Dv % 16 == 0 && L.Dv <= 128, "taylor_attn (GPU): Dv must be a multiple of 16 up to 128");
  LINAC_CHECK(L.T < (int64_t{1} << 30) && L.B * L.H < (int64_t{1} << 30), "taylor_attn (GPU): T or B*H too large");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.Dv = static_cast<int>(L.Dv), a.DvP = a.Dv + 16;
  a.N = cdiv(a.T, kC);
  a.nseg = cdiv(a.N, kSegChunks);
  a.eps = static_cast<float>(L.eps);
  a.doc_start = L.doc_start;
  a.q = L.q, a.k = L.k, a.v = L.v, a.o = L.o, a.dout = L.dout, a.dq = L.dq, a.dk = L.dk, a.dv = L.dv;
  return a;
}

void check_rows16(const Tensor& x, const TaylorAttnLayout::Strides& s, const char* name) {
  const int64_t v = 16 / static_cast<int64_t>(dtype_size(x.dtype));
  LINAC_CHECK(reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && s.b % v == 0 && s.t % v == 0,
              std::string("taylor_attn (GPU): ") + name + " rows must be 16-byte aligned");
}

int group_size(const Ctx& ctx, const TaylorAttnLayout& L, DType act) {
  return balanced_group(ctx, L,
                        [&](int64_t P) { return taylor_attn_launches_workspace_bytes(1, L.T, P, L.F, L.Dv, act); });
}

int balanced_group(const Ctx& ctx, const TaylorAttnLayout& L, const std::function<size_t(int64_t)>& bytes) {
  const size_t per = bytes(1);
  if (per > ctx.workspace_bytes)
    throw UserError("taylor_attn: one (batch, head) pair of " + std::to_string(L.T) + " tokens needs " +
                    std::to_string((per >> 20) + 1) + " MiB of GPU workspace, more than the " +
                    std::to_string(ctx.workspace_bytes >> 20) + " MiB there are; set LINAC_WORKSPACE_MB");
  const int64_t BH = L.B * L.H;
  int64_t P = per ? std::min<int64_t>(BH, static_cast<int64_t>(ctx.workspace_bytes / per)) : BH;
  while (P > 1 && bytes(P) > ctx.workspace_bytes) --P;
  const int64_t groups = (BH + P - 1) / P;  // balanced, so no group is a small remainder
  return static_cast<int>((BH + groups - 1) / groups);
}

template <class T>
Workspace<T> carve(const Ctx& ctx, const Args& a, int P) {
  char* p = static_cast<char*>(ctx.workspace);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += (bytes + 255) / 256 * 256;
    return reinterpret_cast<T*>(r);
  };
  const size_t rows = static_cast<size_t>(P) * a.N * kC, e = sizeof(T);
  Workspace<T> w;
  w.xq = take(rows * kF * e);
  w.xk = take(rows * kF * e);
  w.vt = take(rows * a.DvP * e);
  w.gt = take(rows * a.DvP * e);
  w.S = take(static_cast<size_t>(P) * a.N * kRows * a.DvP * e);
  w.carry = reinterpret_cast<float*>(take(static_cast<size_t>(P) * a.nseg * kRows * a.DvP * 4));
  LINAC_CHECK(static_cast<size_t>(p - static_cast<char*>(ctx.workspace)) <= ctx.workspace_bytes,
              "taylor_attn (GPU): workspace carve overflow");
  return w;
}
template Workspace<float> carve<float>(const Ctx&, const Args&, int);
template Workspace<bf16_t> carve<bf16_t>(const Ctx&, const Args&, int);

}  // namespace taylor_cuda

void taylor_attn_fwd_cuda(const Ctx& ctx, const TaylorAttnLayout& L, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& den, const Tensor& s_final) {
  using namespace taylor_cuda;
  LINAC_CHECK(k.dtype == q.dtype && v.dtype == q.dtype && o.dtype == q.dtype,
              "taylor_attn (GPU): activation dtypes must agree");
  LINAC_CHECK(den.dtype == DType::F32 && (!s_final.defined() || s_final.dtype == DType::F32),
              "taylor_attn (GPU): den and s_final must be f32");
  if (L.B * L.T * L.H == 0) return;
  Args a = make_args(L);
  check_rows16(q, L.q, "q");
  check_rows16(k, L.k, "k");
  check_rows16(v, L.v, "v");
  check_rows16(o, L.o, "o");
  float* sf = s_final.defined() ? s_final.data<float>() : nullptr;
  if (fused_applies(a, q.dtype)) {
    fwd_fused(ctx, L, a, q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), o.data<bf16_t>(), den.data<float>(), sf);
    return;
  }
  const int per = group_size(ctx, L, q.dtype);
  for (int64_t p0 = 0; p0 < L.B * L.H; p0 += per) {
    const int P = static_cast<int>(std::min<int64_t>(per, L.B * L.H - p0));
    a.p0 = static_cast<int>(p0);
    LINAC_GPU_DISPATCH(q.dtype, T, {
      const Workspace<T> w = carve<T>(ctx, a, P);
      launch_prep<T>(ctx, a, P, q.data<T>(), k.data<T>(), v.data<T>(), nullptr, nullptr, nullptr, w, kPrepQKV);
      launch_scan<T>(ctx, a, P, false, w.xk, w.vt, w, sf);
      launch_chunk<kOut, T>(ctx, a, P, w.xq, w.xk, nullptr, w.vt, w.S, w.carry, o.data<T>(), a.o, den.data<float>(),
                            nullptr, {});
    });
  }
}

}  // namespace linac
