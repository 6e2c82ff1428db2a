// Latte entry points: argument checks, the layout (shapes, batch/token strides), device/dtype/form
// dispatch, the decode state reset.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "latte/latte.h"

namespace linac {

namespace {

// A [B,T,H,X] argument shaped like b (X columns): last two dims contiguous, batch/token strides free.
void check_bthx(const Tensor& x, const Tensor& ref, int64_t X, const char* name) {
  LINAC_CHECK(x.defined(), std::string("latte: ") + name + " is required");
  LINAC_CHECK(x.ndim == 4, std::string("latte: ") + name + " must be [B,T,H,X], got " + x.shape_str());
  LINAC_CHECK(x.size(0) == ref.size(0) && x.size(1) == ref.size(1) && x.size(2) == ref.size(2) && x.size(3) == X,
              std::string("latte: ") + name + " has shape " + x.shape_str() + ", b has " + ref.shape_str());
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == X),
              std::string("latte: ") + name + " must have contiguous [H,X] rows");
  LINAC_CHECK(x.device == ref.device, std::string("latte: ") + name + " is on another device");
}

void check_contiguous(const Tensor& x, const std::vector<int64_t>& dims, const Tensor& ref, const char* name) {
  LINAC_CHECK(x.dims() == dims && x.is_contiguous(),
              std::string("latte: ") + name + " must be contiguous " + Tensor(nullptr, x.dtype, x.device, dims).shape_str() +
                  ", got " + x.shape_str());
  LINAC_CHECK(x.device == ref.device, std::string("latte: ") + name + " is on another device");
  LINAC_CHECK(ref.device == Device::CPU || x.dtype == DType::F32, std::string("latte (GPU): ") + name + " must be f32");
}

LatteLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

LatteLayout make_layout(const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& local, const Tensor& lse,
                        const LatteOpts& opts) {
  LINAC_CHECK(b.ndim == 4, "latte: b must be [B,T,H,L], got " + b.shape_str());
  LINAC_CHECK(v.ndim == 4, "latte: v must be [B,T,H,Dv], got " + v.shape_str());
  LatteLayout L;
  L.B = b.size(0), L.T = b.size(1), L.H = b.size(2), L.L = b.size(3), L.Dv = v.size(3);
  L.local = local.defined();
  LINAC_CHECK(L.L > 0 && L.Dv > 0, "latte: empty latent or value width");
  LINAC_CHECK(a.ndim == 4 && a.size(3) == L.La(),
              "latte: a must have L" + std::string(L.local ? " + 1" : "") + " = " + std::to_string(L.La()) +
                  " columns (a local state is given iff a has L + 1), got " + a.shape_str());
  check_bthx(a, b, L.La(), "a");
  check_bthx(b, b, L.L, "b");
  check_bthx(v, b, L.Dv, "v");
  if (L.local) check_bthx(local, b, L.Dv, "local");
  check_contiguous(lse, {L.B, L.T, L.H, L.L}, b, "lse");
  LINAC_CHECK(opts.chunk >= 1, "latte: chunk must be positive");
  L.chunk = opts.chunk;
  L.docs = opts.docs;  // [B, T] on the tensors' device (core/doc_bounds.h)
  if (const Tensor& s = opts.saved_states; s.defined()) {
    LINAC_CHECK(s.device == b.device && s.dtype == DType::F32 && s.is_contiguous() &&
                    static_cast<size_t>(s.numel()) * 4 >= latte_saved_state_bytes(L.B, L.T, L.H, L.L, L.Dv),
                "latte: saved_states must be contiguous f32 on the tensors' device, of latte_saved_state_bytes()");
    if (b.device != Device::CPU) L.saved_states = s.data<float>();
  }
  L.a = strides(a), L.b = strides(b), L.v = strides(v);
  if (L.local) L.local_s = strides(local);
  return L;
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts) LINAC_CHECK(!t->defined() || t->dtype == dt, "latte: CPU dtypes must agree");
}

}  // namespace

void latte_fwd(const Ctx& ctx, const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& local,
               const Tensor& y, const Tensor& lse, const Tensor& mu_final, const LatteOpts& opts, LatteForm form) {
  LatteLayout L = make_layout(a, b, v, local, lse, opts);
  check_bthx(y, b, L.Dv, "y");
  L.y = strides(y);
  if (mu_final.defined()) check_contiguous(mu_final, {L.B, L.H, L.L, L.Dv}, b, "mu_final");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == LatteForm::Chunked, "latte: the GPU runs the chunked form only");
#if LINAC_WITH_CUDA
    latte_fwd_cuda(ctx, L, a, b, v, local, y, lse, mu_final);
#endif
    return;
  }
  check_cpu_dtypes({&a, &b, &v, &local, &y, &lse, &mu_final});
  LINAC_CPU_DISPATCH(a.dtype, F, {
    auto fn = form == LatteForm::Chunked     ? latte_fwd_chunked_cpu<F>
              : form == LatteForm::Recurrent ? latte_fwd_recurrent_cpu<F>
                                             : latte_fwd_quadratic_cpu<F>;
    fn(L, a.data<F>(), b.data<F>(), v.data<F>(), ptr_or_null<F>(local), y.data<F>(), lse.data<F>(),
       ptr_or_null<F>(mu_final));
  });
}

void latte_bwd(const Ctx& ctx, const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& local,
               const Tensor& lse, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dv,
               const Tensor& dlocal, const LatteOpts& opts, LatteForm form) {
  LatteLayout L = make_layout(a, b, v, local, lse, opts);
  LINAC_CHECK(dlocal.defined() == L.local, "latte: dlocal must be given iff local is");
  check_bthx(dy, b, L.Dv, "dy");
  check_bthx(da, b, L.La(), "da");
  check_bthx(db, b, L.L, "db");
  check_bthx(dv, b, L.Dv, "dv");
  if (L.local) check_bthx(dlocal, b, L.Dv, "dlocal"), L.dlocal = strides(dlocal);
  L.dy = strides(dy), L.da = strides(da), L.db = strides(db), L.dv = strides(dv);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    LINAC_CHECK(form == LatteForm::Chunked, "latte: the GPU runs the chunked form only");
#if LINAC_WITH_CUDA
    latte_bwd_cuda(ctx, L, a, b, v, local, lse, dy, da, db, dv, dlocal);
#endif
    return;
  }
  check_cpu_dtypes({&a, &b, &v, &local, &lse, &dy, &da, &db, &dv, &dlocal});
  LINAC_CPU_DISPATCH(a.dtype, F, {
    auto fn = form == LatteForm::Chunked     ? latte_bwd_chunked_cpu<F>
              : form == LatteForm::Recurrent ? latte_bwd_recurrent_cpu<F>
                                             : latte_bwd_quadratic_cpu<F>;
    fn(L, a.data<F>(), b.data<F>(), v.data<F>(), ptr_or_null<F>(local), lse.data<F>(), dy.data<F>(), da.data<F>(),
       db.data<F>(), dv.data<F>(), ptr_or_null<F>(dlocal));
  });
}

void latte_step(const Ctx& ctx, const Tensor& a_t, const Tensor& b_t, const Tensor& v_t, const Tensor& local_t,
                const Tensor& lse_state, const Tensor& mu_state, const Tensor& y_t) {
  LINAC_CHECK(b_t.ndim == 3 && v_t.ndim == 3, "latte_step: b_t and v_t must be [B,H,X]");
  LatteStepLayout L;
  L.B = b_t.size(0), L.H = b_t.size(1), L.L = b_t.size(2), L.Dv = v_t.size(2);
  L.local = local_t.defined();
  const int64_t La = L.local ? L.L + 1 : L.L;
  auto check_bhx = [&](const Tensor& x, int64_t X, const char* name) {
    LINAC_CHECK(x.ndim == 3 && x.size(0) == L.B && x.size(1) == L.H && x.size(2) == X,
                std::string("latte_step: ") + name + " must be [B,H," + std::to_string(X) + "], got " + x.shape_str());
    LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == X),
                std::string("latte_step: ") + name + " must have contiguous [H,X] rows");
    LINAC_CHECK(x.device == b_t.device, std::string("latte_step: ") + name + " is on another device");
  };
  check_bhx(a_t, La, "a_t (L + 1 columns iff local_t is given)");
  check_bhx(b_t, L.L, "b_t");
  check_bhx(v_t, L.Dv, "v_t");
  check_bhx(y_t, L.Dv, "y_t");
  if (L.local) check_bhx(local_t, L.Dv, "local_t"), L.local_s = local_t.strides[0];
  check_contiguous(lse_state, {L.B, L.H, L.L}, b_t, "lse_state");
  check_contiguous(mu_state, {L.B, L.H, L.L, L.Dv}, b_t, "mu_state");
  L.a = a_t.strides[0], L.b = b_t.strides[0], L.v = v_t.strides[0], L.y = y_t.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    latte_step_cuda(ctx, L, a_t, b_t, v_t, local_t, lse_state, mu_state, y_t);
#endif
    return;
  }
  check_cpu_dtypes({&a_t, &b_t, &v_t, &local_t, &lse_state, &mu_state, &y_t});
  LINAC_CPU_DISPATCH(a_t.dtype, F,
                     latte_step_cpu<F>(L, a_t.data<F>(), b_t.data<F>(), v_t.data<F>(), ptr_or_null<F>(local_t),
                                       lse_state.data<F>(), mu_state.data<F>(), y_t.data<F>()));
}

void latte_state_reset(const Ctx& ctx, const Tensor& lse_state, const Tensor& mu_state) {
  LINAC_CHECK(lse_state.ndim == 3 && mu_state.ndim == 4,
              "latte_state_reset: lse_state must be [B,H,L] and mu_state [B,H,L,Dv], got " + lse_state.shape_str() +
                  " and " + mu_state.shape_str());
  check_contiguous(lse_state, {mu_state.size(0), mu_state.size(1), mu_state.size(2)}, mu_state, "lse_state");
  check_contiguous(mu_state, mu_state.dims(), lse_state, "mu_state");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    latte_state_reset_cuda(ctx, lse_state, mu_state);
#endif
    return;
  }
  check_cpu_dtypes({&lse_state, &mu_state});
  LINAC_CPU_DISPATCH(lse_state.dtype, F, {
    std::fill_n(lse_state.data<F>(), lse_state.numel(), -std::numeric_limits<F>::infinity());
    std::fill_n(mu_state.data<F>(), mu_state.numel(), F(0));
  });
}

size_t latte_saved_state_bytes(int64_t B, int64_t T, int64_t H, int64_t L, int64_t Dv) {
  const int64_t N = (T + 63) / 64;  // GPU chunks of 64 tokens
  return 4 * static_cast<size_t>(B * H * N * L * (latte_state_row(Dv) + 1));
}

size_t latte_workspace_bytes_per_seq(int64_t T, int64_t H, int64_t L, int64_t Dv, DType) {
  constexpr int64_t C = 64;
  const int64_t N = (T + C - 1) / C;
  // The carve in latte_common.cuh: chunk terms and states [H, N, L, Wd], the per-chunk lse
  // carries [H, N, L] and the backward's gP [H, T, Lg], all f32 (Wd = Dv + 1 and Lg = L + 1 rounded
  // up to 4: aligned rows); plus the 256-byte alignment of each of the four, so that a group of B
  // sequences fits in B times this.
  const int64_t Wd = latte_state_row(Dv), Lg = (L + 4) / 4 * 4;
  return 4 * static_cast<size_t>(2 * H * N * L * Wd + H * N * L + H * T * Lg) + 4 * 256;
}

}  // namespace linac
