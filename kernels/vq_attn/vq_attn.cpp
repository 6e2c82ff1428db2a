// VQ-attention entry points: argument checks, layouts (shapes, batch/token strides), device,
// dtype and (CPU) form dispatch.
#include "vq_attn/vq_attn.h"

#include <algorithm>
#include <string>

#include "activation/activation.h"
#include "core/buffer.h"
#include "core/dispatch.h"
#include "core/gpu.h"

namespace linac {

namespace {

// A [B,T,H,D] argument shaped like `like` in B, T, H: head and dim strides fixed, batch/token free.
void check_bthd(const Tensor& x, const Tensor& like, int64_t D, const char* name) {
  LINAC_CHECK(x.ndim == 4, std::string("vq_attn: ") + name + " must be [B,T,H,D], got " + x.shape_str());
  LINAC_CHECK(x.size(0) == like.size(0) && x.size(1) == like.size(1) && x.size(2) == like.size(2) && x.size(3) == D,
              std::string("vq_attn: ") + name + " has shape " + x.shape_str() + ", expected [B,T,H," +
                  std::to_string(D) + "] like " + like.shape_str());
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == D),
              std::string("vq_attn: ") + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == like.device, std::string("vq_attn: ") + name + " is on another device");
}

// A contiguous tensor of the given shape on like's device.
void check_dense(const Tensor& x, const Tensor& like, std::initializer_list<int64_t> dims, const char* name) {
  bool ok = x.ndim == static_cast<int>(dims.size()) && x.is_contiguous();
  int i = 0;
  for (int64_t d : dims) ok = ok && x.size(i++) == d;
  LINAC_CHECK(ok, std::string("vq_attn: ") + name + " has the wrong shape or is not contiguous: " + x.shape_str());
  LINAC_CHECK(x.device == like.device, std::string("vq_attn: ") + name + " is on another device");
}

void check_btoken(const Tensor& x, const Tensor& like, DType dt, const char* name) {
  check_dense(x, like, {like.size(0), like.size(1), like.size(2)}, name);
  LINAC_CHECK(x.dtype == dt, std::string("vq_attn: ") + name + " has dtype " + dtype_name(x.dtype));
}

VqAttnLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

void check_same_dtype(const char* what, std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts)
    LINAC_CHECK(!t->defined() || t->dtype == dt, std::string("vq_attn: ") + what + " dtypes must agree");
}

void check_float_act(const Tensor& x, const char* name) {
  LINAC_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16,
              std::string("vq_attn: ") + name + " must be bf16 or f32 on the GPU");
}

VqAttnLayout make_layout(const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v, const Tensor& codebook,
                         const Tensor& u, const Tensor& vr, const Tensor& rho, const VqAttnOpts& opts) {
  LINAC_CHECK(q.ndim == 4 && v.ndim == 4, "vq_attn: q and v must be [B,T,H,D]");
  LINAC_CHECK(codebook.ndim == 3, "vq_attn: codebook must be [H,S,Dk], got " + codebook.shape_str());
  VqAttnLayout L;
  L.B = q.size(0), L.T = q.size(1), L.H = q.size(2), L.Dk = q.size(3), L.Dv = v.size(3);
  L.S = codebook.size(1), L.Lb = opts.block;
  LINAC_CHECK(L.Dk > 0 && L.Dv > 0 && L.S > 0, "vq_attn: empty head dims or codebook");
  LINAC_CHECK(L.Lb >= 1, "vq_attn: the block length must be positive");
  check_bthd(q, q, L.Dk, "q");
  check_bthd(khat, q, L.Dk, "khat");
  check_bthd(v, q, L.Dv, "v");
  check_btoken(z, q, DType::I32, "z");
  check_dense(codebook, q, {L.H, L.S, L.Dk}, "codebook");
  check_dense(u, q, {L.H, L.Dk}, "u");
  check_dense(vr, q, {L.H, L.Dk}, "vr");
  check_dense(rho, q, {L.H, L.Lb + 1, L.Dk}, "rho ([H, block+1, Dk])");
  L.q = strides(q), L.khat = strides(khat), L.v = strides(v);
  LINAC_CHECK(!opts.docs.defined() || opts.docs.end, "vq_attn: document bounds need both start and end");
  L.docs = opts.docs;
  if (opts.docs.defined()) L.doc_blocks = opts.doc_blocks;
  const bool docs = opts.docs.defined();
  if (const Tensor& c = opts.saved_cache; c.defined()) {
    LINAC_CHECK(c.device == q.device && c.is_contiguous() &&
                    c.nbytes() >= vq_attn_saved_cache_bytes(L.B, L.T, L.H, L.Dv, L.S, L.Lb, q.dtype, docs),
                "vq_attn: saved_cache must be contiguous on the inputs' device, of vq_attn_saved_cache_bytes()");
    if (q.device != Device::CPU) L.saved_cache = c.ptr;
  }
  if (const Tensor& sw = opts.saved_weights; sw.defined()) {
    LINAC_CHECK(sw.device == q.device && sw.is_contiguous() &&
                    sw.nbytes() >= vq_attn_saved_weights_bytes(L.B, L.T, L.H, L.S, L.Lb, q.dtype, docs),
                "vq_attn: saved_weights must be contiguous on the inputs' device, of vq_attn_saved_weights_bytes()");
    if (q.device != Device::CPU) L.saved_weights = sw.ptr;
  }
  if (const Tensor& du = opts.delta_units; du.defined()) {
    LINAC_CHECK(L.Dv % 8 == 0 && du.device == q.device && du.dtype == DType::F32 && du.is_contiguous() &&
                    du.ndim == 3 && du.size(0) == L.B && du.size(1) == L.T && du.size(2) == L.H * L.Dv / 8,
                "vq_attn: delta_units must be [B, T, H Dv / 8] f32 contiguous on the inputs' device (Dv a multiple of "
                "8), got " +
                    du.shape_str());
    if (q.device != Device::CPU) L.delta_units = du.data<float>();
  }
  return L;
}

// A decoding state (VqAttnState) of B sequences, H heads, Lb ring slots and S codes, on like's device.
void check_state(const VqAttnState& state, const Tensor& like, int64_t B, int64_t H, int64_t Lb, int64_t Dk, int64_t Dv,
                 int64_t S) {
  check_dense(state.khat, like, {B, H, Lb, Dk}, "state.khat");
  check_dense(state.v, like, {B, H, Lb, Dv}, "state.v");
  check_dense(state.z, like, {B, H, Lb}, "state.z");
  check_dense(state.counts, like, {B, H, S}, "state.counts");
  check_dense(state.means, like, {B, H, S, Dv}, "state.means");
  LINAC_CHECK(state.z.dtype == DType::I32, "vq_attn: state.z must be int32");
}

VqQuantLayout make_quant_layout(const Tensor& k, int64_t S) {
  LINAC_CHECK(k.ndim == 4, "vq_attn: k must be [B,T,H,Dk], got " + k.shape_str());
  VqQuantLayout L;
  L.B = k.size(0), L.T = k.size(1), L.H = k.size(2), L.Dk = k.size(3), L.S = S;
  check_bthd(k, k, L.Dk, "k");
  L.k = strides(k);
  return L;
}

}  // namespace

const char* vq_attn_score_grads_kernel(int64_t Lb, int64_t Dv, DType act) {
  const bool hopper = hopper_kernels_allowed("LINAC_VQ_KERNELS");
  if (LINAC_WITH_SM90A && hopper && act == DType::BF16 && Lb % 8 == 0 && Dv % 8 == 0 && gpu_compute_capability() == 90)
    return "gemm_epilogue_sm90";
  return "rows";
}

void vq_quantize(const Ctx& ctx, const Tensor& k, const Tensor& codebook, const Tensor& z, const Tensor& khat,
                 const Tensor& err) {
  LINAC_CHECK(codebook.ndim == 3, "vq_quantize: codebook must be [H,S,Dk], got " + codebook.shape_str());
  VqQuantLayout L = make_quant_layout(k, codebook.size(1));
  check_dense(codebook, k, {L.H, L.S, L.Dk}, "codebook");
  check_bthd(khat, k, L.Dk, "khat");
  check_btoken(z, k, DType::I32, "z");
  L.khat = strides(khat);
  LINAC_CHECK(khat.dtype == k.dtype, "vq_quantize: khat must have k's dtype");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    check_float_act(k, "k");
    LINAC_CHECK(codebook.dtype == DType::F32, "vq_quantize: the codebook must be f32 on the GPU");
    if (err.defined()) check_btoken(err, k, DType::F32, "err");
#if LINAC_WITH_CUDA
    vq_quantize_cuda(ctx, L, k, codebook, z, khat, err);
#endif
    return;
  }
  if (err.defined()) check_btoken(err, k, k.dtype, "err");
  check_same_dtype("CPU", {&k, &codebook, &khat, &err});
  LINAC_CPU_DISPATCH(k.dtype, F,
                     vq_quantize_cpu<F>(L, k.data<F>(), codebook.data<F>(), z.data<int32_t>(), khat.data<F>(),
                                        ptr_or_null<F>(err)));
}

void vq_code_stats(const Ctx& ctx, const Tensor& k, const Tensor& z, const Tensor& sums, const Tensor& counts) {
  LINAC_CHECK(sums.ndim == 3, "vq_code_stats: sums must be [H,S,Dk], got " + sums.shape_str());
  const VqQuantLayout L = make_quant_layout(k, sums.size(1));
  check_btoken(z, k, DType::I32, "z");
  check_dense(sums, k, {L.H, L.S, L.Dk}, "sums");
  check_dense(counts, k, {L.H, L.S}, "counts");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    check_float_act(k, "k");
    LINAC_CHECK(sums.dtype == DType::F32 && counts.dtype == DType::F32, "vq_code_stats: sums, counts must be f32");
#if LINAC_WITH_CUDA
    vq_code_stats_cuda(ctx, L, k, z, sums, counts);
#endif
    return;
  }
  check_same_dtype("CPU", {&k, &sums, &counts});
  LINAC_CPU_DISPATCH(k.dtype, F,
                     vq_code_stats_cpu<F>(L, k.data<F>(), z.data<int32_t>(), sums.data<F>(), counts.data<F>()));
}

void vq_ema_update(const Ctx& ctx, const Tensor& sums, const Tensor& counts, const Tensor& c_sum, const Tensor& c_count,
                   double gamma) {
  LINAC_CHECK(sums.ndim == 3, "vq_ema_update: sums must be [H,S,Dk], got " + sums.shape_str());
  const int64_t H = sums.size(0), S = sums.size(1), Dk = sums.size(2);
  check_dense(sums, sums, {H, S, Dk}, "sums");
  check_dense(c_sum, sums, {H, S, Dk}, "c_sum");
  check_dense(counts, sums, {H, S}, "counts");
  check_dense(c_count, sums, {H, S}, "c_count");
  check_same_dtype("codebook statistics", {&sums, &counts, &c_sum, &c_count});
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(sums.dtype == DType::F32, "vq_ema_update: statistics must be f32 on the GPU");
#if LINAC_WITH_CUDA
    vq_ema_update_cuda(ctx, sums, counts, c_sum, c_count, gamma);
#endif
    return;
  }
  LINAC_CPU_DISPATCH(sums.dtype, F,
                     vq_ema_update_cpu<F>(H, S, Dk, sums.data<F>(), counts.data<F>(), c_sum.data<F>(),
                                          c_count.data<F>(), gamma));
}

void vq_codebook_from_stats(const Ctx& ctx, const Tensor& c_sum, const Tensor& c_count, const Tensor& codebook) {
  LINAC_CHECK(c_sum.ndim == 3, "vq_codebook_from_stats: c_sum must be [H,S,Dk], got " + c_sum.shape_str());
  const int64_t H = c_sum.size(0), S = c_sum.size(1), Dk = c_sum.size(2);
  check_dense(c_sum, c_sum, {H, S, Dk}, "c_sum");
  check_dense(c_count, c_sum, {H, S}, "c_count");
  check_dense(codebook, c_sum, {H, S, Dk}, "codebook");
  check_same_dtype("codebook statistics", {&c_sum, &c_count, &codebook});
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(c_sum.dtype == DType::F32, "vq_codebook_from_stats: statistics must be f32 on the GPU");
#if LINAC_WITH_CUDA
    vq_codebook_from_stats_cuda(ctx, c_sum, c_count, codebook);
#endif
    return;
  }
  LINAC_CPU_DISPATCH(c_sum.dtype, F,
                     vq_codebook_from_stats_cpu<F>(H, S, Dk, c_sum.data<F>(), c_count.data<F>(), codebook.data<F>()));
}

void vq_attn_fwd(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                 const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho, const Tensor& o,
                 const Tensor& lse, const VqAttnOpts& opts, VqAttnForm form) {
  VqAttnLayout L = make_layout(q, khat, z, v, codebook, u, vr, rho, opts);
  check_bthd(o, q, L.Dv, "o");
  check_dense(lse, q, {L.B, L.T, L.H}, "lse");
  L.o = strides(o);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == VqAttnForm::Block, "vq_attn_fwd: the GPU runs the block form only");
    check_float_act(q, "q");
    check_same_dtype("activation", {&q, &khat, &v, &o});
    check_same_dtype("f32", {&codebook, &u, &vr, &rho, &lse});
    LINAC_CHECK(codebook.dtype == DType::F32 && lse.dtype == DType::F32,
                "vq_attn_fwd: codebook, u, vr, rho, lse must be f32 on the GPU");
#if LINAC_WITH_CUDA
    vq_attn_fwd_cuda(ctx, L, q, khat, z, v, codebook, u, vr, rho, o, lse);
#endif
    return;
  }
  check_same_dtype("CPU", {&q, &khat, &v, &codebook, &u, &vr, &rho, &o, &lse});
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == VqAttnForm::Block ? vq_attn_fwd_block_cpu<F> : vq_attn_fwd_quadratic_cpu<F>;
    fn(L, q.data<F>(), khat.data<F>(), z.data<int32_t>(), v.data<F>(), codebook.data<F>(), u.data<F>(),
       vr.data<F>(), rho.data<F>(), o.data<F>(), lse.data<F>());
  });
}

void vq_attn_bwd(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                 const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho, const Tensor& o,
                 const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat, const Tensor& dv,
                 const Tensor& du, const Tensor& dvr, const Tensor& drho, const VqAttnOpts& opts,
                 VqAttnForm form) {
  VqAttnLayout L = make_layout(q, khat, z, v, codebook, u, vr, rho, opts);
  check_bthd(o, q, L.Dv, "o");
  check_bthd(dout, q, L.Dv, "dout");
  check_bthd(dq, q, L.Dk, "dq");
  check_bthd(dkhat, q, L.Dk, "dkhat");
  check_bthd(dv, q, L.Dv, "dv");
  check_dense(lse, q, {L.B, L.T, L.H}, "lse");
  check_dense(du, q, {L.H, L.Dk}, "du");
  check_dense(dvr, q, {L.H, L.Dk}, "dvr");
  check_dense(drho, q, {L.H, L.Lb + 1, L.Dk}, "drho");
  L.o = strides(o), L.dout = strides(dout), L.dq = strides(dq), L.dkhat = strides(dkhat), L.dv = strides(dv);
  const Tensor& v_pre = opts.v_pre;
  if (v_pre.defined()) {
    check_bthd(v_pre, q, L.Dv, "v_pre");
    L.v_pre = strides(v_pre);
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == VqAttnForm::Block, "vq_attn_bwd: the GPU runs the block form only");
    check_float_act(q, "q");
    check_same_dtype("activation", {&q, &khat, &v, &o, &dout, &dq, &dkhat, &dv, &v_pre});
    check_same_dtype("f32", {&codebook, &u, &vr, &rho, &lse, &du, &dvr, &drho});
    LINAC_CHECK(codebook.dtype == DType::F32, "vq_attn_bwd: codebook, u, vr, rho, lse, du, dvr, drho must be f32");
#if LINAC_WITH_CUDA
    vq_attn_bwd_cuda(ctx, L, q, khat, z, v, codebook, u, vr, rho, o, lse, dout, dq, dkhat, dv, du, dvr, drho, v_pre);
#endif
    return;
  }
  check_same_dtype(
      "CPU", {&q, &khat, &v, &codebook, &u, &vr, &rho, &o, &lse, &dout, &dq, &dkhat, &dv, &du, &dvr, &drho, &v_pre});
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == VqAttnForm::Block ? vq_attn_bwd_block_cpu<F> : vq_attn_bwd_quadratic_cpu<F>;
    fn(L, q.data<F>(), khat.data<F>(), z.data<int32_t>(), v.data<F>(), codebook.data<F>(), u.data<F>(),
       vr.data<F>(), rho.data<F>(), o.data<F>(), lse.data<F>(), dout.data<F>(), dq.data<F>(), dkhat.data<F>(),
       dv.data<F>(), du.data<F>(), dvr.data<F>(), drho.data<F>());
    if (v_pre.defined())
      silu_grad_inplace_cpu<F>(L.B, L.T, L.H * L.Dv, v_pre.data<F>(), L.v_pre.b, L.v_pre.t, dv.data<F>(), L.dv.b,
                               L.dv.t);
  });
}

void vq_attn_step(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                  const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                  const VqAttnState& state, const Tensor& pos, const Tensor& o) {
  auto check_bhd = [&](const Tensor& x, int64_t D, const char* name) {
    LINAC_CHECK(x.ndim == 3 && x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == D,
                std::string("vq_attn_step: ") + name + " must be [B,H,D], got " + x.shape_str());
    LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == D),
                std::string("vq_attn_step: ") + name + " must have contiguous [H,D] rows");
    LINAC_CHECK(x.device == q.device, std::string("vq_attn_step: ") + name + " is on another device");
  };
  LINAC_CHECK(q.ndim == 3 && v.ndim == 3 && codebook.ndim == 3 && rho.ndim == 3,
              "vq_attn_step: q, v must be [B,H,D], codebook [H,S,Dk], rho [H,Lb+1,Dk]");
  VqStepLayout L;
  L.B = q.size(0), L.H = q.size(1), L.Dk = q.size(2), L.Dv = v.size(2), L.S = codebook.size(1);
  L.Lb = rho.size(1) - 1;
  LINAC_CHECK(L.Lb >= 1, "vq_attn_step: rho must cover distances 0..Lb with Lb >= 1");
  LINAC_CHECK(
      pos.dtype == DType::I32 && pos.ndim == 1 && pos.size(0) == L.B && pos.is_contiguous() && pos.device == q.device,
      "vq_attn_step: pos must be int32 [B] on q's device, got " + pos.shape_str());
  check_bhd(q, L.Dk, "q");
  check_bhd(khat, L.Dk, "khat");
  check_bhd(v, L.Dv, "v");
  check_bhd(o, L.Dv, "o");
  check_dense(z, q, {L.B, L.H}, "z");
  LINAC_CHECK(z.dtype == DType::I32, "vq_attn_step: z must be int32");
  check_dense(codebook, q, {L.H, L.S, L.Dk}, "codebook");
  check_dense(u, q, {L.H, L.Dk}, "u");
  check_dense(vr, q, {L.H, L.Dk}, "vr");
  check_dense(rho, q, {L.H, L.Lb + 1, L.Dk}, "rho");
  check_state(state, q, L.B, L.H, L.Lb, L.Dk, L.Dv, L.S);
  L.q = q.strides[0], L.khat = khat.strides[0], L.v = v.strides[0], L.o = o.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    check_float_act(q, "q");
    check_same_dtype("activation", {&q, &khat, &v, &o});
    check_same_dtype("f32", {&codebook, &u, &vr, &rho, &state.khat, &state.v, &state.counts, &state.means});
    LINAC_CHECK(codebook.dtype == DType::F32, "vq_attn_step: codebook, u, vr, rho and the state must be f32");
#if LINAC_WITH_CUDA
    vq_attn_step_cuda(ctx, L, q, khat, z, v, codebook, u, vr, rho, state, pos, o);
#endif
    return;
  }
  check_same_dtype("CPU", {&q, &khat, &v, &codebook, &u, &vr, &rho, &o, &state.khat, &state.v, &state.counts,
                           &state.means});
  for (int64_t b = 0; b < L.B; ++b)
    LINAC_CHECK(pos.data<int32_t>()[b] >= 0, "vq_attn_step: negative position in row " + std::to_string(b));
  LINAC_CPU_DISPATCH(
      q.dtype, F,
      vq_attn_step_cpu<F>(L, q.data<F>(), khat.data<F>(), z.data<int32_t>(), v.data<F>(), codebook.data<F>(),
                          u.data<F>(), vr.data<F>(), rho.data<F>(), state.khat.data<F>(), state.v.data<F>(),
                          state.z.data<int32_t>(), state.counts.data<F>(), state.means.data<F>(), pos.data<int32_t>(),
                          o.data<F>()));
}

void vq_attn_state_prefill(const Ctx& ctx, const Tensor& khat, const Tensor& z, const Tensor& v,
                           const VqAttnState& state, const DocBounds& docs) {
  LINAC_CHECK(khat.ndim == 4 && v.ndim == 4 && state.khat.ndim == 4 && state.counts.ndim == 3,
              "vq_attn_state_prefill: khat and v must be [B,T,H,D], the state that of vq_attn.h");
  VqAttnLayout L;
  L.B = khat.size(0), L.T = khat.size(1), L.H = khat.size(2), L.Dk = khat.size(3), L.Dv = v.size(3);
  L.S = state.counts.size(2), L.Lb = state.khat.size(2);
  LINAC_CHECK(L.T >= 1 && L.Lb >= 1 && L.S >= 1, "vq_attn_state_prefill: empty prompt, window or codebook");
  check_bthd(khat, khat, L.Dk, "khat");
  check_bthd(v, khat, L.Dv, "v");
  check_btoken(z, khat, DType::I32, "z");
  check_state(state, khat, L.B, L.H, L.Lb, L.Dk, L.Dv, L.S);
  L.khat = strides(khat), L.v = strides(v);
  L.docs = docs;
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    check_float_act(khat, "khat");
    check_same_dtype("activation", {&khat, &v});
    check_same_dtype("f32", {&state.khat, &state.v, &state.counts, &state.means});
    LINAC_CHECK(state.khat.dtype == DType::F32, "vq_attn_state_prefill: the state must be f32 on the GPU");
    LINAC_CHECK(ctx.workspace_bytes >= vq_attn_state_prefill_workspace_bytes(L.B, L.T, L.H, L.S),
                "vq_attn_state_prefill: ctx.workspace holds less than vq_attn_state_prefill_workspace_bytes()");
#if LINAC_WITH_CUDA
    vq_attn_state_prefill_cuda(ctx, L, khat, z, v, state);
#endif
    return;
  }
  check_same_dtype("CPU", {&khat, &v, &state.khat, &state.v, &state.counts, &state.means});
  LINAC_CPU_DISPATCH(khat.dtype, F,
                     vq_attn_state_prefill_cpu<F>(L, khat.data<F>(), z.data<int32_t>(), v.data<F>(),
                                                  state.khat.data<F>(), state.v.data<F>(), state.z.data<int32_t>(),
                                                  state.counts.data<F>(), state.means.data<F>()));
}

void vq_attn_state_reset(const Ctx& ctx, const VqAttnState& state) {
  for (const Tensor* t : {&state.khat, &state.v, &state.z, &state.counts, &state.means}) {
    LINAC_CHECK(t->defined() && t->is_contiguous(), "vq_attn_state_reset: every state tensor must be contiguous");
    if (ctx.is_gpu())
      gpu_memset_zero_async(ctx, t->ptr, t->nbytes());
    else
      zero_tensor(*t);
  }
}

void vq_attn_state_start_document(const Ctx& ctx, const VqAttnState& state, int64_t row) {
  LINAC_CHECK(state.z.ndim == 3 && row >= 0 && row < state.z.size(0), "vq_attn_state_start_document: row out of range");
  for (const Tensor* t : {&state.khat, &state.v, &state.z, &state.counts, &state.means})
    LINAC_CHECK(t->defined() && t->is_contiguous() && t->size(0) == state.z.size(0),
                "vq_attn_state_start_document: every state tensor must be contiguous with the batch first");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    vq_attn_state_start_document_cuda(ctx, state, row);
#endif
    return;
  }
  zero_tensor(state.counts.select(0, row));
  zero_tensor(state.means.select(0, row));
  const Tensor z = state.z.select(0, row);
  std::fill(z.data<int32_t>(), z.data<int32_t>() + z.numel(), -1);
}

}  // namespace linac
