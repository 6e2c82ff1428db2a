// CUDA Lightning Attention forward and backward (math in lightning.h): the launch sequences per
// group of sequences (as many as ctx.workspace holds), built from the scan and the block pass
// (lightning_common.cuh):
//   forward   scan(k, v; s0) -> S_n, s_final;   pass o  = lower(q, k, v; S)
//   backward  scan(k, v; s0) -> S_n (skipped with saved states);  reverse scan(q, do; ds_final) -> R_n, ds0;
//             pass dq = lower(do, v, k; S^T),  dv = upper(k, q, do; R),  dk = upper(v, do, q; R^T)
//             (the dq and dk passes apply the SiLU feature map's derivative as they store, when given)
// Each state is rounded to the activation dtype once (it only feeds tensor-core matmuls); the scans
// themselves run in f32. Documents (lightning.h) change no launch: the scan and pass kernels mask
// by the bounds (their kDocs instantiations), with each group's bounds offset to its first row.
#include <algorithm>
#include <string>

#include "lightning/lightning_common.cuh"

namespace linac {
namespace lightning_cuda {
namespace {

Args make_args(const LightningLayout& L, const Tensor& decay) {
  LINAC_CHECK(L.T < (int64_t{1} << 30) && L.Dk <= 1024 && L.Dv <= 1024, "lightning (GPU): T or head dims too large");
  LINAC_CHECK(L.Dk % 16 == 0 && L.Dv % 16 == 0, "lightning (GPU): Dk and Dv must be multiples of 16");
  Args a{};
  a.T = static_cast<int>(L.T), a.H = static_cast<int>(L.H), a.Dk = static_cast<int>(L.Dk), a.Dv = static_cast<int>(L.Dv);
  a.N = cdiv(a.T, kC);
  a.walk = L.B * L.H * cdiv(a.Dk, kW) * cdiv(a.Dv, kW) >= kWalkMinTiles;
  a.decay = decay.data<float>();
  a.doc_start = L.docs.start;
  a.doc_end = L.docs.end;
  return a;
}

void check_rows16(const Tensor& x, const LightningLayout::Strides& s, const char* name) {
  const int64_t v = 16 / static_cast<int64_t>(dtype_size(x.dtype));
  LINAC_CHECK(reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && s.b % v == 0 && s.t % v == 0,
              std::string("lightning (GPU): ") + name + " rows must be 16-byte aligned");
}

void check_dtypes(const Tensor& q, std::initializer_list<const Tensor*> acts, std::initializer_list<const Tensor*> f32s) {
  for (const Tensor* t : acts) LINAC_CHECK(t->dtype == q.dtype, "lightning (GPU): activation dtypes must agree");
  for (const Tensor* t : f32s)
    LINAC_CHECK(!t->defined() || t->dtype == DType::F32, "lightning (GPU): decay and states must be f32");
}

// Sequences per group that fit in ctx.workspace.
int group_size(const Ctx& ctx, const LightningLayout& L, DType act) {
  const size_t per = lightning_workspace_bytes_per_seq(L.T, L.H, L.Dk, L.Dv, act);
  if (per > ctx.workspace_bytes)
    throw UserError("lightning: one sequence of " + std::to_string(L.T) + " tokens needs " +
                    std::to_string((per >> 20) + 1) + " MiB of GPU workspace, more than the " +
                    std::to_string(ctx.workspace_bytes >> 20) + " MiB there are; set LINAC_WORKSPACE_MB");
  return static_cast<int>(std::min<int64_t>(L.B, static_cast<int64_t>(ctx.workspace_bytes / per)));
}

// The workspace of a group of B sequences: the forward states S_n and the reverse states R_n (in
// T) and the per-block scan terms U (f32, shared by both scans).
template <class T>
struct Workspace {
  T* S = nullptr;
  T* R = nullptr;
  float* U = nullptr;
};
template <class T>
Workspace<T> carve(const Ctx& ctx, const Args& a, int B) {
  const size_t n = static_cast<size_t>(B) * a.H * a.N * a.Dk * a.Dv;
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t st = align(n * sizeof(T));
  LINAC_CHECK(2 * st + align(n * 4) <= ctx.workspace_bytes, "lightning (GPU): workspace carve overflow");
  char* p = static_cast<char*>(ctx.workspace);
  return {reinterpret_cast<T*>(p), reinterpret_cast<T*>(p + st), reinterpret_cast<float*>(p + 2 * st)};
}

template <class P>
P* at_batch(P* p, int64_t b0, int64_t stride) {
  return p + b0 * stride;
}

// The forward states of the group from b0 on: in the saved tensor (lightning.h) when there is
// one, else in the group's workspace.
template <class T>
T* forward_states(const Tensor& saved, const Args& a, int64_t b0, const Workspace<T>& w) {
  if (!saved.defined()) return w.S;
  return static_cast<T*>(saved.ptr) + b0 * a.H * a.N * static_cast<int64_t>(a.Dk) * a.Dv;
}

// The arguments of the group of sequences from b0 on: its document bounds start at row b0.
Args group_args(Args a, int64_t b0) {
  if (a.doc_start) {
    a.doc_start += b0 * a.T;
    a.doc_end += b0 * a.T;
  }
  return a;
}

}  // namespace
}  // namespace lightning_cuda

void lightning_fwd_cuda(const Ctx& ctx, const LightningLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& decay, const Tensor& s0, const Tensor& o, const Tensor& s_final,
                        const Tensor& saved) {
  using namespace lightning_cuda;
  check_dtypes(q, {&k, &v, &o}, {&decay, &s0, &s_final});
  if (L.B * L.T * L.H == 0) return;
  const Args all = make_args(L, decay);
  check_rows16(q, L.q, "q");
  check_rows16(k, L.k, "k");
  check_rows16(v, L.v, "v");
  check_rows16(o, L.o, "o");
  const int per = group_size(ctx, L, q.dtype);
  const int64_t SS = L.H * L.Dk * L.Dv;
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Args a = group_args(all, b0);
    const float* s0p = s0.defined() ? s0.data<float>() + b0 * SS : nullptr;
    float* sfp = s_final.defined() ? s_final.data<float>() + b0 * SS : nullptr;
    LINAC_GPU_DISPATCH(q.dtype, T, {
      const Workspace<T> w = carve<T>(ctx, a, B);
      const T* qp = at_batch(q.data<T>(), b0, L.q.b);
      const T* kp = at_batch(k.data<T>(), b0, L.k.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      T* S = forward_states(saved, a, b0, w);
      launch_scan<T>(ctx, a, B, false, kp, L.k, vp, L.v, s0p, w.U, S, sfp);
      launch_pass<T>(ctx, a, B, false, false, a.Dk, a.Dv, qp, L.q, kp, L.k, vp, L.v, S, at_batch(o.data<T>(), b0, L.o.b),
                     L.o);
    });
  }
}

void lightning_bwd_cuda(const Ctx& ctx, const LightningLayout& L, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& decay, const Tensor& s0, const Tensor& dout, const Tensor& ds_final,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& ds0, const Tensor& saved,
                        const Tensor& q_pre, const Tensor& k_pre) {
  using namespace lightning_cuda;
  check_dtypes(q, {&k, &v, &dout, &dq, &dk, &dv}, {&decay, &s0, &ds_final, &ds0});
  for (const Tensor* t : {&q_pre, &k_pre})
    LINAC_CHECK(!t->defined() || t->dtype == q.dtype, "lightning (GPU): activation dtypes must agree");
  if (L.B * L.H == 0) return;
  const int64_t SS = L.H * L.Dk * L.Dv;
  if (L.T == 0) {  // nothing to scan: the initial-state gradient is the final-state one
    if (ds0.defined()) {
      if (ds_final.defined())
        LINAC_CUDA_CHECK(cudaMemcpyAsync(ds0.ptr, ds_final.ptr, L.B * SS * 4, cudaMemcpyDeviceToDevice,
                                         cuda::stream_of(ctx)));
      else
        LINAC_CUDA_CHECK(cudaMemsetAsync(ds0.ptr, 0, L.B * SS * 4, cuda::stream_of(ctx)));
    }
    return;
  }
  const Args all = make_args(L, decay);
  check_rows16(q, L.q, "q");
  check_rows16(k, L.k, "k");
  check_rows16(v, L.v, "v");
  check_rows16(dout, L.dout, "dout");
  check_rows16(dq, L.dq, "dq");
  check_rows16(dk, L.dk, "dk");
  check_rows16(dv, L.dv, "dv");
  if (q_pre.defined()) check_rows16(q_pre, L.q_pre, "q_pre");
  if (k_pre.defined()) check_rows16(k_pre, L.k_pre, "k_pre");
  const int per = group_size(ctx, L, q.dtype);
  for (int64_t b0 = 0; b0 < L.B; b0 += per) {
    const int B = static_cast<int>(std::min<int64_t>(per, L.B - b0));
    const Args a = group_args(all, b0);
    const float* s0p = s0.defined() ? s0.data<float>() + b0 * SS : nullptr;
    const float* dsfp = ds_final.defined() ? ds_final.data<float>() + b0 * SS : nullptr;
    float* ds0p = ds0.defined() ? ds0.data<float>() + b0 * SS : nullptr;
    LINAC_GPU_DISPATCH(q.dtype, T, {
      const Workspace<T> w = carve<T>(ctx, a, B);
      const T* qp = at_batch(q.data<T>(), b0, L.q.b);
      const T* kp = at_batch(k.data<T>(), b0, L.k.b);
      const T* vp = at_batch(v.data<T>(), b0, L.v.b);
      const T* dop = at_batch(dout.data<T>(), b0, L.dout.b);
      T* S = forward_states(saved, a, b0, w);
      if (!saved.defined()) launch_scan<T>(ctx, a, B, false, kp, L.k, vp, L.v, s0p, w.U, S, nullptr);
      launch_scan<T>(ctx, a, B, true, qp, L.q, dop, L.dout, dsfp, w.U, w.R, ds0p);
      const T* qpre = q_pre.defined() ? at_batch(q_pre.data<T>(), b0, L.q_pre.b) : nullptr;
      const T* kpre = k_pre.defined() ? at_batch(k_pre.data<T>(), b0, L.k_pre.b) : nullptr;
      launch_pass<T>(ctx, a, B, false, true, a.Dv, a.Dk, dop, L.dout, vp, L.v, kp, L.k, S,
                     at_batch(dq.data<T>(), b0, L.dq.b), L.dq, qpre, L.q_pre);
      launch_pass<T>(ctx, a, B, true, false, a.Dk, a.Dv, kp, L.k, qp, L.q, dop, L.dout, w.R,
                     at_batch(dv.data<T>(), b0, L.dv.b), L.dv);
      launch_pass<T>(ctx, a, B, true, true, a.Dv, a.Dk, vp, L.v, dop, L.dout, qp, L.q, w.R,
                     at_batch(dk.data<T>(), b0, L.dk.b), L.dk, kpre, L.k_pre);
    });
  }
}

}  // namespace linac
