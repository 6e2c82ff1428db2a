// CUDA chunked Taylor attention backward (math in taylor_attn.h): the two sweeps of docs/based.md §6.4 as
// launches over one group of (batch, head) pairs, deterministic (no atomics, fixed-order sums):
//   prep    q^, k^, v~ and g~ = [dout/den, -(dout . o)/den] (taylor_attn_fwd.cu)
//   scan    forward: S_n = sum over earlier chunks of phi(k^)^T v~ (recomputed, not saved)
//   chunk   kGradQ: dq from S_n g~ through the feature map plus the intra-chunk dU K^
//   scan    reverse: R_n = sum over later chunks of phi(q^)^T g~ (into the same buffer)
//   chunk   kGradK: dk from R_n v~ plus dU^T Q^, and dv = phi(k^) R_n + triu(kappa(U))^T g~
// Documents: both scans restart where a document starts and every chunk masks by document
// (taylor_attn.h), so dS flows only within a document. The bf16 backward at Dv <= 64 runs the
// fused sweeps of taylor_attn_fused.cuh instead (scan and chunk in one kernel each; unless
// LINAC_TAYLOR_KERNELS=chunk).
#include <algorithm>

#include "taylor_attn/taylor_attn_common.cuh"

namespace linac {

void taylor_attn_bwd_cuda(const Ctx& ctx, const TaylorAttnLayout& L, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& den, const Tensor& dout, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) {
  using namespace taylor_cuda;
  for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv})
    LINAC_CHECK(t->dtype == q.dtype, "taylor_attn (GPU): activation dtypes must agree");
  LINAC_CHECK(den.dtype == DType::F32, "taylor_attn (GPU): den must be f32");
  if (L.B * L.T * L.H == 0) return;
  Args a = make_args(L);
  check_rows16(q, L.q, "q");
  check_rows16(k, L.k, "k");
  check_rows16(v, L.v, "v");
  check_rows16(o, L.o, "o");
  check_rows16(dout, L.dout, "dout");
  check_rows16(dq, L.dq, "dq");
  check_rows16(dk, L.dk, "dk");
  check_rows16(dv, L.dv, "dv");
  if (fused_applies(a, q.dtype)) {
    bwd_fused(ctx, L, a, q.data<bf16_t>(), k.data<bf16_t>(), v.data<bf16_t>(), o.data<bf16_t>(), den.data<float>(),
              dout.data<bf16_t>(), dq.data<bf16_t>(), dk.data<bf16_t>(), dv.data<bf16_t>());
    return;
  }
  const int per = group_size(ctx, L, q.dtype);
  for (int64_t p0 = 0; p0 < L.B * L.H; p0 += per) {
    const int P = static_cast<int>(std::min<int64_t>(per, L.B * L.H - p0));
    a.p0 = static_cast<int>(p0);
    LINAC_GPU_DISPATCH(q.dtype, T, {
      const Workspace<T> w = carve<T>(ctx, a, P);
      launch_prep<T>(ctx, a, P, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), dout.data<T>(),
                     den.data<float>(), w, kPrepQKV | kPrepG);
      launch_scan<T>(ctx, a, P, false, w.xk, w.vt, w, nullptr);
      launch_chunk<kGradQ, T>(ctx, a, P, w.xq, w.xk, w.gt, w.vt, w.S, w.carry, nullptr, {}, nullptr, dq.data<T>(),
                              a.dq);
      launch_scan<T>(ctx, a, P, true, w.xq, w.gt, w, nullptr);
      launch_chunk<kGradK, T>(ctx, a, P, w.xk, w.xq, w.vt, w.gt, w.S, w.carry, dv.data<T>(), a.dv, nullptr,
                              dk.data<T>(), a.dk);
    });
  }
}

}  // namespace linac
