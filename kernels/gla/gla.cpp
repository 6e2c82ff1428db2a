// GLA entry points: argument checks, the layout (shapes, batch/token strides), device/dtype/form
// dispatch.
#include <cstdint>
#include <string>

#include "core/dispatch.h"
#include "gla/gla.h"

namespace linac {

namespace {

// A [B,T,H,D] argument: head and dim strides fixed, batch/token strides free.
void check_bthd(const Tensor& x, const Tensor& q, int64_t D, const char* name) {
  LINAC_CHECK(x.ndim == 4, std::string("gla: ") + name + " must be [B,T,H,D], got " + x.shape_str());
  LINAC_CHECK(x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == q.size(2) && x.size(3) == D,
              std::string("gla: ") + name + " has shape " + x.shape_str() + ", q has " + q.shape_str());
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == D),
              std::string("gla: ") + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == q.device, std::string("gla: ") + name + " is on another device");
}

void check_state(const Tensor& s, const GlaLayout& L, const Tensor& q, const char* name) {
  if (!s.defined()) return;
  LINAC_CHECK(s.ndim == 4 && s.is_contiguous() && s.size(0) == L.B && s.size(1) == L.H && s.size(2) == L.Dk &&
                  s.size(3) == L.Dv,
              std::string("gla: ") + name + " must be [B,H,Dk,Dv] contiguous, got " + s.shape_str());
  LINAC_CHECK(s.device == q.device, std::string("gla: ") + name + " is on another device");
}

void check_saved(const Tensor& saved, const GlaLayout& L, const Tensor& q) {
  check_saved_buffer(saved, q, gla_saved_bytes(L.B, L.T, L.H, L.Dk, L.Dv, q.dtype), "gla");
}

GlaLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

GlaLayout make_layout(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const GlaOpts& opts) {
  LINAC_CHECK(q.ndim == 4, "gla: q must be [B,T,H,Dk], got " + q.shape_str());
  GlaLayout L;
  L.B = q.size(0), L.T = q.size(1), L.H = q.size(2), L.Dk = q.size(3);
  LINAC_CHECK(v.ndim == 4, "gla: v must be [B,T,H,Dv], got " + v.shape_str());
  L.Dv = v.size(3);
  check_bthd(q, q, L.Dk, "q");
  check_bthd(k, q, L.Dk, "k");
  check_bthd(v, q, L.Dv, "v");
  if (g.defined()) check_bthd(g, q, L.Dk, "g");  // only gla_bwd with saved intermediates goes without
  LINAC_CHECK(L.Dk > 0 && L.Dv > 0, "gla: empty head dims");
  LINAC_CHECK(opts.chunk >= 1 && opts.sub_chunk >= 1 && opts.chunk % opts.sub_chunk == 0,
              "gla: sub_chunk must divide chunk");
  L.scale = opts.scale;
  L.chunk = opts.chunk;
  L.sub_chunk = opts.sub_chunk;
  L.q = strides(q), L.k = strides(k), L.v = strides(v);
  if (g.defined()) L.g = strides(g);
  return L;
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts)
    LINAC_CHECK(!t->defined() || t->dtype == dt, "gla: CPU dtypes must agree");
}

}  // namespace

void gla_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& o,
             const Tensor& s0, const Tensor& s_final, const GlaOpts& opts, GlaForm form, const Tensor& saved) {
  LINAC_CHECK(g.defined(), "gla: g is required");
  GlaLayout L = make_layout(q, k, v, g, opts);
  check_bthd(o, q, L.Dv, "o");
  L.o = strides(o);
  check_state(s0, L, q, "s0");
  check_state(s_final, L, q, "s_final");
  check_saved(saved, L, q);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == GlaForm::Chunk, "gla: the GPU runs the chunkwise form only");
#if LINAC_WITH_CUDA
    gla_fwd_cuda(ctx, L, q, k, v, g, s0, o, s_final, saved);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &g, &o, &s0, &s_final});
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == GlaForm::Chunk       ? gla_fwd_chunk_cpu<F>
              : form == GlaForm::Recurrent ? gla_fwd_recurrent_cpu<F>
                                           : gla_fwd_parallel_cpu<F>;
    fn(L, q.data<F>(), k.data<F>(), v.data<F>(), g.data<F>(), ptr_or_null<F>(s0), o.data<F>(), ptr_or_null<F>(s_final));
  });
}

void gla_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& dout,
             const Tensor& s0, const Tensor& ds_final, const Tensor& dq, const Tensor& dk, const Tensor& dv,
             const Tensor& dg, const Tensor& ds0, const GlaOpts& opts, GlaForm form, const Tensor& saved) {
  GlaLayout L = make_layout(q, k, v, g, opts);
  check_bthd(dout, q, L.Dv, "dout");
  check_bthd(dq, q, L.Dk, "dq");
  check_bthd(dk, q, L.Dk, "dk");
  check_bthd(dv, q, L.Dv, "dv");
  check_bthd(dg, q, L.Dk, "dg");
  L.dout = strides(dout), L.dq = strides(dq), L.dk = strides(dk), L.dv = strides(dv), L.dg = strides(dg);
  check_state(s0, L, q, "s0");
  check_state(ds_final, L, q, "ds_final");
  check_state(ds0, L, q, "ds0");
  check_saved(saved, L, q);
  LINAC_CHECK(g.defined() || saved.defined(), "gla: g is required unless saved intermediates are given");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == GlaForm::Chunk, "gla: the GPU runs the chunkwise form only");
#if LINAC_WITH_CUDA
    gla_bwd_cuda(ctx, L, q, k, v, g, s0, dout, ds_final, dq, dk, dv, dg, ds0, saved, opts.after_reverse_scan);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &g, &dout, &s0, &ds_final, &dq, &dk, &dv, &dg, &ds0});
  if (opts.after_reverse_scan) opts.after_reverse_scan();
  LINAC_CPU_DISPATCH(q.dtype, F, {
    auto fn = form == GlaForm::Chunk       ? gla_bwd_chunk_cpu<F>
              : form == GlaForm::Recurrent ? gla_bwd_recurrent_cpu<F>
                                           : gla_bwd_parallel_cpu<F>;
    fn(L, q.data<F>(), k.data<F>(), v.data<F>(), g.data<F>(), ptr_or_null<F>(s0), dout.data<F>(),
       ptr_or_null<F>(ds_final), dq.data<F>(), dk.data<F>(), dv.data<F>(), dg.data<F>(), ptr_or_null<F>(ds0));
  });
}

void gla_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& state, const Tensor& o, double scale) {
  auto check_bhd = [&](const Tensor& x, int64_t D, const char* name) {
    LINAC_CHECK(x.ndim == 3 && x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(2) == D,
                std::string("gla_step: ") + name + " must be [B,H,D], got " + x.shape_str());
    LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == D),
                std::string("gla_step: ") + name + " must have contiguous [H,D] rows");
    LINAC_CHECK(x.device == q.device, std::string("gla_step: ") + name + " is on another device");
  };
  LINAC_CHECK(q.ndim == 3 && v.ndim == 3, "gla_step: q and v must be [B,H,D]");
  GlaStepLayout L;
  L.B = q.size(0), L.H = q.size(1), L.Dk = q.size(2), L.Dv = v.size(2);
  L.scale = scale;
  check_bhd(q, L.Dk, "q");
  check_bhd(k, L.Dk, "k");
  check_bhd(g, L.Dk, "g");
  check_bhd(v, L.Dv, "v");
  check_bhd(o, L.Dv, "o");
  LINAC_CHECK(state.ndim == 4 && state.is_contiguous() && state.size(0) == L.B && state.size(1) == L.H &&
                  state.size(2) == L.Dk && state.size(3) == L.Dv,
              "gla_step: state must be [B,H,Dk,Dv] contiguous, got " + state.shape_str());
  L.q = q.strides[0], L.k = k.strides[0], L.v = v.strides[0], L.g = g.strides[0], L.o = o.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    gla_step_cuda(ctx, L, q, k, v, g, state, o);
#endif
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &g, &state, &o});
  LINAC_CPU_DISPATCH(q.dtype, F,
                     gla_step_cpu<F>(L, q.data<F>(), k.data<F>(), v.data<F>(), g.data<F>(), state.data<F>(),
                                     o.data<F>()));
}

namespace {

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The forward's chunk buffers of B sequences, each array 256-byte aligned: cumsums (f32),
// q*exp(B) and k*exp(bn-B) (act), chunk totals (f32), states S_0..S_N (act), P (act). The same
// carve as chunk_buffers() in gla_fwd.cu.
size_t chunk_buffer_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act) {
  constexpr int64_t C = 64;
  const int64_t N = (T + C - 1) / C, BH = B * H;
  const size_t e = dtype_size(act);
  return align256(static_cast<size_t>(BH * N * C * Dk) * 4) + 2 * align256(static_cast<size_t>(BH * N * C * Dk) * e) +
         align256(static_cast<size_t>(BH * N * Dk) * 4) + align256(static_cast<size_t>(BH * (N + 1) * Dk * Dv) * e) +
         align256(static_cast<size_t>(BH * N * C * C) * e);
}

}  // namespace

size_t gla_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act, bool saved) {
  const int64_t N = (T + 63) / 64;
  const size_t state_grads = align256(static_cast<size_t>(H * N * Dk * Dv) * dtype_size(act));
  return (saved ? 0 : chunk_buffer_bytes(1, T, H, Dk, Dv, act)) + state_grads;
}

size_t gla_saved_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, DType act) {
  return chunk_buffer_bytes(B, T, H, Dk, Dv, act);
}

}  // namespace linac
