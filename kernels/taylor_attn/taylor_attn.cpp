// Taylor attention entry points: argument checks, the layout (shapes, batch/token strides),
// device/dtype/form dispatch, and the GPU workspace size.
#include "taylor_attn/taylor_attn.h"

#include <cstdlib>
#include <string>

#include "core/dispatch.h"
#include "core/gpu.h"

namespace linac {

namespace {

// A [B,T,H,D] argument: head and dim strides fixed, batch/token strides free.
void check_bthd(const Tensor& x, const Tensor& q, int64_t D, const char* name) {
  LINAC_CHECK(x.ndim == 4, std::string("taylor_attn: ") + name + " must be [B,T,H,D], got " + x.shape_str());
  LINAC_CHECK(x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == q.size(2) && x.size(3) == D,
              std::string("taylor_attn: ") + name + " has shape " + x.shape_str() + ", q has " + q.shape_str());
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == D),
              std::string("taylor_attn: ") + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == q.device, std::string("taylor_attn: ") + name + " is on another device");
}

TaylorAttnLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

TaylorAttnLayout make_layout(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& den,
                             const TaylorAttnOpts& opts) {
  LINAC_CHECK(q.ndim == 4, "taylor_attn: q must be [B,T,H,F], got " + q.shape_str());
  LINAC_CHECK(v.ndim == 4, "taylor_attn: v must be [B,T,H,Dv], got " + v.shape_str());
  TaylorAttnLayout L;
  L.B = q.size(0), L.T = q.size(1), L.H = q.size(2), L.F = q.size(3), L.Dv = v.size(3);
  LINAC_CHECK(L.F > 0 && L.Dv > 0, "taylor_attn: empty feature or value dim");
  LINAC_CHECK(opts.chunk >= 1, "taylor_attn: chunk must be >= 1");
  check_bthd(q, q, L.F, "q");
  check_bthd(k, q, L.F, "k");
  check_bthd(v, q, L.Dv, "v");
  check_bthd(o, q, L.Dv, "o");
  LINAC_CHECK(den.ndim == 3 && den.is_contiguous() && den.size(0) == L.B && den.size(1) == L.H && den.size(2) == L.T,
              "taylor_attn: den must be [B,H,T] contiguous, got " + den.shape_str());
  LINAC_CHECK(den.device == q.device, "taylor_attn: den is on another device");
  L.chunk = opts.chunk;
  L.eps = opts.eps;
  L.doc_start = opts.docs.start;
  L.q = strides(q), L.k = strides(k), L.v = strides(v), L.o = strides(o);
  if (const Tensor& c = opts.saved_carries; c.defined()) {
    const size_t need = taylor_attn_saved_carries_bytes(L.B, L.T, L.H, L.F, L.Dv, q.dtype);
    LINAC_CHECK(c.is_contiguous() && c.device == q.device && c.nbytes() >= need,
                "taylor_attn: saved_carries must be contiguous on the inputs' device, of "
                "taylor_attn_saved_carries_bytes()");
    if (q.device != Device::CPU && need > 0) L.saved_carries = static_cast<float*>(c.ptr);
  }
  return L;
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts) LINAC_CHECK(!t->defined() || t->dtype == dt, "taylor_attn: CPU dtypes must agree");
}

}  // namespace

void taylor_attn_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& den, const Tensor& s_final, const TaylorAttnOpts& opts, TaylorAttnForm form) {
  const TaylorAttnLayout L = make_layout(q, k, v, o, den, opts);
  if (s_final.defined()) {
    LINAC_CHECK(s_final.ndim == 4 && s_final.is_contiguous() && s_final.size(0) == L.B && s_final.size(1) == L.H &&
                    s_final.size(2) == taylor_attn_state_rows(L.F) && s_final.size(3) == L.Dv + 1,
                "taylor_attn: s_final must be [B,H,F*F+F+1,Dv+1] contiguous, got " + s_final.shape_str());
    LINAC_CHECK(s_final.device == q.device, "taylor_attn: s_final is on another device");
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == TaylorAttnForm::Chunk, "taylor_attn: the GPU runs the chunked form only");
#if LINAC_WITH_CUDA
    taylor_attn_fwd_cuda(ctx, L, q, k, v, o, den, s_final);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &o, &den, &s_final});
  LINAC_CPU_DISPATCH(q.dtype, Fl, {
    auto fn = form == TaylorAttnForm::Chunk       ? taylor_attn_fwd_chunk_cpu<Fl>
              : form == TaylorAttnForm::Recurrent ? taylor_attn_fwd_recurrent_cpu<Fl>
                                                  : taylor_attn_fwd_quadratic_cpu<Fl>;
    fn(L, q.data<Fl>(), k.data<Fl>(), v.data<Fl>(), o.data<Fl>(), den.data<Fl>(),
       s_final.defined() ? s_final.data<Fl>() : nullptr);
  });
}

void taylor_attn_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& den, const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const TaylorAttnOpts& opts, TaylorAttnForm form) {
  TaylorAttnLayout L = make_layout(q, k, v, o, den, opts);
  check_bthd(dout, q, L.Dv, "dout");
  check_bthd(dq, q, L.F, "dq");
  check_bthd(dk, q, L.F, "dk");
  check_bthd(dv, q, L.Dv, "dv");
  L.dout = strides(dout), L.dq = strides(dq), L.dk = strides(dk), L.dv = strides(dv);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == TaylorAttnForm::Chunk, "taylor_attn: the GPU runs the chunked form only");
#if LINAC_WITH_CUDA
    taylor_attn_bwd_cuda(ctx, L, q, k, v, o, den, dout, dq, dk, dv);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &o, &den, &dout, &dq, &dk, &dv});
  LINAC_CPU_DISPATCH(q.dtype, Fl, {
    auto fn = form == TaylorAttnForm::Chunk       ? taylor_attn_bwd_chunk_cpu<Fl>
              : form == TaylorAttnForm::Recurrent ? taylor_attn_bwd_recurrent_cpu<Fl>
                                                  : taylor_attn_bwd_quadratic_cpu<Fl>;
    fn(L, q.data<Fl>(), k.data<Fl>(), v.data<Fl>(), o.data<Fl>(), den.data<Fl>(), dout.data<Fl>(), dq.data<Fl>(),
       dk.data<Fl>(), dv.data<Fl>());
  });
}

void taylor_attn_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& state,
                      const Tensor& o, double eps) {
  auto check_bhd = [&](const Tensor& x, int64_t D, const char* name) {
    LINAC_CHECK(x.ndim == 3 && x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == D,
                std::string("taylor_attn_step: ") + name + " must be [B,H,D], got " + x.shape_str());
    LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == D),
                std::string("taylor_attn_step: ") + name + " must have contiguous [H,D] rows");
    LINAC_CHECK(x.device == q.device, std::string("taylor_attn_step: ") + name + " is on another device");
  };
  LINAC_CHECK(q.ndim == 3 && v.ndim == 3, "taylor_attn_step: q and v must be [B,H,D]");
  TaylorStepLayout L;
  L.B = q.size(0), L.H = q.size(1), L.F = q.size(2), L.Dv = v.size(2);
  L.eps = eps;
  check_bhd(q, L.F, "q");
  check_bhd(k, L.F, "k");
  check_bhd(v, L.Dv, "v");
  check_bhd(o, L.Dv, "o");
  LINAC_CHECK(state.ndim == 4 && state.is_contiguous() && state.size(0) == L.B && state.size(1) == L.H &&
                  state.size(2) == taylor_attn_state_rows(L.F) && state.size(3) == L.Dv + 1,
              "taylor_attn_step: state must be [B,H,F*F+F+1,Dv+1] contiguous, got " + state.shape_str());
  LINAC_CHECK(state.device == q.device, "taylor_attn_step: state is on another device");
  L.q = q.strides[0], L.k = k.strides[0], L.v = v.strides[0], L.o = o.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    taylor_attn_step_cuda(ctx, L, q, k, v, state, o);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &state, &o});
  LINAC_CPU_DISPATCH(
      q.dtype, Fl,
      taylor_attn_step_cpu<Fl>(L, q.data<Fl>(), k.data<Fl>(), v.data<Fl>(), state.data<Fl>(), o.data<Fl>()));
}

const char* taylor_attn_gpu_kernels() {
  const char* env = std::getenv("LINAC_TAYLOR_KERNELS");
  const std::string choice = env ? env : "";
  if (choice == "chunk") return "chunk";
  if (!choice.empty() && choice != "auto" && choice != "sm80")
    throw UserError("LINAC_TAYLOR_KERNELS must be auto, sm80 or chunk, got '" + choice + "'");
  return LINAC_WITH_SM90A && choice != "sm80" && gpu_compute_capability() == 90 ? "sm90" : "sm80";
}

namespace {

// The GPU kernels' chunk (kC) and scan segment (kSegChunks chunks), as taylor_attn_common.cuh sets them.
constexpr int64_t kGpuChunk = 64, kGpuSegChunks = 32;

size_t align256(int64_t x) { return static_cast<size_t>((x + 255) / 256 * 256); }

// f32 segment carries of P pairs, [P, segments, F*F+2F, Dv+16]; none with one segment.
size_t carries_bytes(int64_t P, int64_t T, int64_t F, int64_t Dv) {
  const int64_t nseg = ((T + kGpuChunk - 1) / kGpuChunk + kGpuSegChunks - 1) / kGpuSegChunks;
  return nseg > 1 ? static_cast<size_t>(P * nseg * (F * F + 2 * F) * (Dv + 16)) * sizeof(float) : 0;
}

}  // namespace

size_t taylor_attn_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv, DType act) {
  if (!taylor_attn_fused_case(act, Dv)) return taylor_attn_launches_workspace_bytes(B, T, H, F, Dv, act);
  // Fused (bwd_fused in taylor_attn_fused.cu): g~ [P, N*C, Dv+16], then the segment carries.
  const int64_t N = (T + kGpuChunk - 1) / kGpuChunk, P = B * H;
  return align256(P * N * kGpuChunk * (Dv + 16) * static_cast<int64_t>(dtype_size(act))) + carries_bytes(P, T, F, Dv);
}

size_t taylor_attn_launches_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv, DType act) {
  // q^, k^ [P, N*C, F]; v~, g~ [P, N*C, Dv+16]; states [P, N, F*F+2F, Dv+16]; the carries, one
  // segment's included (the carve in taylor_attn_fwd.cu).
  constexpr int64_t C = kGpuChunk;
  const int64_t N = (T + C - 1) / C, P = B * H, rows = F * F + 2 * F, W = Dv + 16;
  const int64_t e = static_cast<int64_t>(dtype_size(act)), nseg = (N + kGpuSegChunks - 1) / kGpuSegChunks;
  return 2 * align256(P * N * C * F * e) + 2 * align256(P * N * C * W * e) + align256(P * N * rows * W * e) +
         align256(P * nseg * rows * W * 4);
}

size_t taylor_attn_saved_carries_bytes(int64_t B, int64_t T, int64_t H, int64_t F, int64_t Dv, DType act) {
  return taylor_attn_fused_case(act, Dv) ? carries_bytes(B * H, T, F, Dv) : 0;
}

}  // namespace linac
