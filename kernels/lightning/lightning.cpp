// Lightning Attention entry points: argument checks, the layout (shapes, batch/token strides),
// device/dtype/form dispatch.
#include <string>

#include "activation/activation.h"
#include "core/dispatch.h"
#include "lightning/lightning.h"

namespace linac {

namespace {

// A [B,T,H,D] argument: head and dim strides fixed, batch/token strides free.
void check_bthd(const Tensor& x, const Tensor& q, int64_t D, const char* name) {
  LINAC_CHECK(x.ndim == 4, std::string("lightning: ") + name + " must be [B,T,H,D], got " + x.shape_str());
  LINAC_CHECK(x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == q.size(2) && x.size(3) == D,
              std::string("lightning: ") + name + " has shape " + x.shape_str() + ", q has " + q.shape_str());
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == D),
              std::string("lightning: ") + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == q.device, std::string("lightning: ") + name + " is on another device");
}

void check_state(const Tensor& s, int64_t B, int64_t H, int64_t Dk, int64_t Dv, const Tensor& q, const char* name) {
  if (!s.defined()) return;
  LINAC_CHECK(s.ndim == 4 && s.is_contiguous() && s.size(0) == B && s.size(1) == H && s.size(2) == Dk &&
                  s.size(3) == Dv,
              std::string("lightning: ") + name + " must be [B,H,Dk,Dv] contiguous, got " + s.shape_str());
  LINAC_CHECK(s.device == q.device, std::string("lightning: ") + name + " is on another device");
}

void check_decay(const Tensor& decay, int64_t H, const Tensor& q) {
  LINAC_CHECK(decay.ndim == 1 && decay.size(0) == H && decay.is_contiguous(),
              "lightning: decay must be [H] contiguous, got " + decay.shape_str());
  LINAC_CHECK(decay.device == q.device, "lightning: decay is on another device");
  LINAC_CHECK(q.device != Device::CPU || decay.dtype == q.dtype, "lightning: CPU dtypes must agree");
  LINAC_CHECK(q.device == Device::CPU || decay.dtype == DType::F32, "lightning (GPU): decay must be f32");
}

LightningLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

LightningLayout make_layout(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                            const LightningOpts& opts) {
  LINAC_CHECK(q.ndim == 4, "lightning: q must be [B,T,H,Dk], got " + q.shape_str());
  LightningLayout L;
  L.B = q.size(0), L.T = q.size(1), L.H = q.size(2), L.Dk = q.size(3);
  LINAC_CHECK(v.ndim == 4, "lightning: v must be [B,T,H,Dv], got " + v.shape_str());
  L.Dv = v.size(3);
  check_bthd(q, q, L.Dk, "q");
  check_bthd(k, q, L.Dk, "k");
  check_bthd(v, q, L.Dv, "v");
  check_decay(decay, L.H, q);
  LINAC_CHECK(L.Dk > 0 && L.Dv > 0, "lightning: empty head dims");
  LINAC_CHECK(opts.block >= 1, "lightning: block must be positive");
  L.block = opts.block;
  LINAC_CHECK(!opts.docs.defined() || opts.docs.end, "lightning: document bounds need both start and end");
  L.docs = opts.docs;
  L.q = strides(q), L.k = strides(k), L.v = strides(v);
  return L;
}

void check_saved(const Tensor& saved, const LightningLayout& L, const Tensor& q) {
  check_saved_buffer(saved, q, lightning_saved_bytes(L.B, L.T, L.H, L.Dk, L.Dv, q.dtype), "lightning");
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts)
    LINAC_CHECK(!t->defined() || t->dtype == dt, "lightning: CPU dtypes must agree");
}

// The GPU kernels' blocks of a sequence of T tokens (C = 64, lightning_common.cuh's kC).
int64_t gpu_blocks(int64_t T) {
  constexpr int64_t C = 64;
  return (T + C - 1) / C;
}

}  // namespace

void lightning_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& o, const Tensor& s0, const Tensor& s_final, const LightningOpts& opts,
                   LightningForm form, const Tensor& saved) {
  LightningLayout L = make_layout(q, k, v, decay, opts);
  check_bthd(o, q, L.Dv, "o");
  L.o = strides(o);
  check_state(s0, L.B, L.H, L.Dk, L.Dv, q, "s0");
  check_state(s_final, L.B, L.H, L.Dk, L.Dv, q, "s_final");
  check_saved(saved, L, q);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == LightningForm::Block, "lightning: the GPU runs the block form only");
#if LINAC_WITH_CUDA
    lightning_fwd_cuda(ctx, L, q, k, v, decay, s0, o, s_final, saved);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &decay, &o, &s0, &s_final});
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == LightningForm::Block       ? lightning_fwd_block_cpu<F>
              : form == LightningForm::Recurrent ? lightning_fwd_recurrent_cpu<F>
                                                 : lightning_fwd_quadratic_cpu<F>;
    fn(L, q.data<F>(), k.data<F>(), v.data<F>(), decay.data<F>(), ptr_or_null<F>(s0), o.data<F>(),
       ptr_or_null<F>(s_final));
  });
}

void lightning_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                   const Tensor& dout, const Tensor& s0, const Tensor& ds_final, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const Tensor& ds0, const LightningOpts& opts, LightningForm form,
                   const Tensor& saved) {
  LightningLayout L = make_layout(q, k, v, decay, opts);
  check_bthd(dout, q, L.Dv, "dout");
  check_bthd(dq, q, L.Dk, "dq");
  check_bthd(dk, q, L.Dk, "dk");
  check_bthd(dv, q, L.Dv, "dv");
  L.dout = strides(dout), L.dq = strides(dq), L.dk = strides(dk), L.dv = strides(dv);
  check_state(s0, L.B, L.H, L.Dk, L.Dv, q, "s0");
  check_state(ds_final, L.B, L.H, L.Dk, L.Dv, q, "ds_final");
  check_state(ds0, L.B, L.H, L.Dk, L.Dv, q, "ds0");
  check_saved(saved, L, q);
  if (opts.q_pre.defined()) {
    check_bthd(opts.q_pre, q, L.Dk, "q_pre");
    L.q_pre = strides(opts.q_pre);
  }
  if (opts.k_pre.defined()) {
    check_bthd(opts.k_pre, q, L.Dk, "k_pre");
    L.k_pre = strides(opts.k_pre);
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == LightningForm::Block, "lightning: the GPU runs the block form only");
#if LINAC_WITH_CUDA
    lightning_bwd_cuda(ctx, L, q, k, v, decay, s0, dout, ds_final, dq, dk, dv, ds0, saved, opts.q_pre, opts.k_pre);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &decay, &dout, &s0, &ds_final, &dq, &dk, &dv, &ds0, &opts.q_pre, &opts.k_pre});
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == LightningForm::Block       ? lightning_bwd_block_cpu<F>
              : form == LightningForm::Recurrent ? lightning_bwd_recurrent_cpu<F>
                                                 : lightning_bwd_quadratic_cpu<F>;
    fn(L, q.data<F>(), k.data<F>(), v.data<F>(), decay.data<F>(), ptr_or_null<F>(s0), dout.data<F>(),
       ptr_or_null<F>(ds_final), dq.data<F>(), dk.data<F>(), dv.data<F>(), ptr_or_null<F>(ds0));
    // The SiLU feature map's derivative (lightning.h): dq, dk become the gradients of the pre-activations.
    if (opts.q_pre.defined())
      silu_grad_inplace_cpu<F>(L.B, L.T, L.H * L.Dk, opts.q_pre.data<F>(), L.q_pre.b, L.q_pre.t, dq.data<F>(), L.dq.b,
                               L.dq.t);
    if (opts.k_pre.defined())
      silu_grad_inplace_cpu<F>(L.B, L.T, L.H * L.Dk, opts.k_pre.data<F>(), L.k_pre.b, L.k_pre.t, dk.data<F>(), L.dk.b,
                               L.dk.t);
  });
}

void lightning_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& decay,
                    const Tensor& state, const Tensor& o) {
  auto check_bhd = [&](const Tensor& x, int64_t D, const char* name) {
    LINAC_CHECK(x.ndim == 3 && x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == D,
                std::string("lightning_step: ") + name + " must be [B,H,D], got " + x.shape_str());
    LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == D),
                std::string("lightning_step: ") + name + " must have contiguous [H,D] rows");
    LINAC_CHECK(x.device == q.device, std::string("lightning_step: ") + name + " is on another device");
  };
  LINAC_CHECK(q.ndim == 3 && v.ndim == 3, "lightning_step: q and v must be [B,H,D]");
  LightningStepLayout L;
  L.B = q.size(0), L.H = q.size(1), L.Dk = q.size(2), L.Dv = v.size(2);
  check_bhd(q, L.Dk, "q");
  check_bhd(k, L.Dk, "k");
  check_bhd(v, L.Dv, "v");
  check_bhd(o, L.Dv, "o");
  check_decay(decay, L.H, q);
  check_state(state, L.B, L.H, L.Dk, L.Dv, q, "state");
  LINAC_CHECK(state.defined(), "lightning_step: the state is required");
  L.q = q.strides[0], L.k = k.strides[0], L.v = v.strides[0], L.o = o.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    lightning_step_cuda(ctx, L, q, k, v, decay, state, o);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &decay, &state, &o});
  LINAC_CPU_DISPATCH(q.dtype, F,
                     lightning_step_cpu<F>(L, q.data<F>(), k.data<F>(), v.data<F>(), decay.data<F>(),
                                           state.data<F>(), o.data<F>()));
}

size_t lightning_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act) {
  const int64_t N = gpu_blocks(T);
  // The forward states S_n and the reverse states R_n, N of each, in the activation dtype (they
  // only feed tensor-core matmuls), and the per-block scan terms in f32: the carve in lightning.cu.
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t n = static_cast<size_t>(H * N * Dk * Dv);
  return 2 * align(n * dtype_size(act)) + align(n * 4);
}

size_t lightning_saved_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act) {
  return static_cast<size_t>(B * H * gpu_blocks(T) * Dk * Dv) * dtype_size(act);
}

}  // namespace linac
