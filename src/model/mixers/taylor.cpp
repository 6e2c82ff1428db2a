#include "model/mixers/taylor.h"

#include <algorithm>
#include <cmath>

#include "config/json_reader.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "taylor_attn/taylor_attn.h"

namespace linac {

namespace {
struct TaylorState final : MixerState {
  OwnedTensor S;  // [B, H, taylor_attn_state_rows(F), Dv + 1]
};
}  // namespace

TaylorMixerOptions TaylorMixerOptions::parse(const json& o, const std::string& path, const std::string& file) {
  TaylorMixerOptions opt;
  JsonReader r(o, path, file);
  opt.heads = r.get_int("heads", opt.heads, 0, 1024);
  opt.feature_dim = r.get_int("feature_dim", opt.feature_dim, 1, 64);
  opt.head_dim = r.get_int("head_dim", opt.head_dim, 0, 4096);
  opt.chunk = r.get_int("chunk", opt.chunk, 1, 4096);
  opt.eps = r.get_double("eps", opt.eps, 0, 1);
  r.finish();
  return opt;
}

TaylorMixer::TaylorMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const TaylorMixerOptions& opt,
                         const std::string& path)
    : env_(env), opt_(opt), d_(cfg.d_model) {
  H_ = opt_.heads > 0 ? opt_.heads : cfg.n_heads;
  F_ = opt_.feature_dim;
  if (opt_.head_dim == 0 && d_ % H_ != 0)
    throw UserError(cfg.source + ": " + path + ".heads: " + std::to_string(H_) + " heads must divide model.d_model (" +
                    std::to_string(d_) + ") unless head_dim is given");
  Dv_ = opt_.head_dim > 0 ? opt_.head_dim : d_ / H_;
  P_ = H_ * (2 * F_ + Dv_);
  if (env.ctx.is_gpu() && (F_ != 16 || Dv_ % 16 != 0 || Dv_ > 128))
    throw UserError(cfg.source + ": " + path + ": the GPU taylor kernels need feature_dim 16 (got " +
                    std::to_string(F_) + ") and a value head dim that is a multiple of 16 up to 128 (got " +
                    std::to_string(Dv_) + ")");
  const std::string p = "layers." + std::to_string(layer) + ".taylor.";
  const double out_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  wqkv_ = env.params->add({p + "wqkv", {P_, d_}, Init::Normal, cfg.init_std, true});
  wo_ = env.params->add({p + "wo", {d_, H_ * Dv_}, Init::Normal, out_std, true});
}

void TaylorMixer::reserve(int64_t B, int64_t T) {
  B_ = B;
  T_ = T;
  const size_t N = static_cast<size_t>(B * T), act = dtype_size(env_.act);
  proj_buf_ = env_.saved->take(N * static_cast<size_t>(P_) * act);
  o_buf_ = env_.saved->take(N * static_cast<size_t>(H_ * Dv_) * act);
  den_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * dtype_size(env_.stat));
  if (env_.ctx.is_gpu()) carries_buf_ = env_.saved->take(taylor_attn_saved_carries_bytes(B, T, H_, F_, Dv_, env_.act));
}

// The paper's count (docs/based.md §7.4): per head, a (Dv + 1) x D_sym state with D_sym = 1 + F +
// F(F+1)/2 distinct features (the kernels store the full F^2 second-order block).
int64_t TaylorMixer::state_elems(int64_t T) const {
  (void)T;
  return H_ * (Dv_ + 1) * (1 + F_ + F_ * (F_ + 1) / 2);
}

size_t TaylorMixer::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T);
  // GPU: the op's saved carries (TaylorAttnOpts; T > 2048 only), besides the unit's own activations.
  const size_t carries = env_.ctx.is_gpu() ? taylor_attn_saved_carries_bytes(B, T, H_, F_, Dv_, env_.act) : 0;
  return N * (static_cast<size_t>(P_ + H_ * Dv_) * dtype_size(env_.act) +
              static_cast<size_t>(H_) * dtype_size(env_.stat)) +
         carries;
}

double TaylorMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_), F = static_cast<double>(F_), Dv = static_cast<double>(Dv_);
  // Projections: 2 FLOPs per weight per token forward, x3 with the backward.
  const double proj = 6.0 * d * static_cast<double>(P_ + H_ * Dv_);
  // Chunked linear attention per head and token, forward: the state update and the inter-chunk
  // read-out over the 1 + F + F^2 expanded features (2 D (Dv + 1) each), and the causal halves of
  // the C x C scores and their product with [v, 1] (C (F + Dv + 1)); x3 with the backward.
  const double D = 1.0 + F + F * F;
  const double C = static_cast<double>(std::min<int64_t>(opt_.chunk, T));
  return proj + 3.0 * static_cast<double>(H_) * (4.0 * D * (Dv + 1.0) + C * (F + Dv + 1.0));
}

TaylorAttnOpts TaylorMixer::attn_opts(int64_t B, int64_t T) const {
  TaylorAttnOpts ao;
  ao.chunk = opt_.chunk;
  ao.eps = opt_.eps;
  ao.docs = env_.docs;
  // The same B and T in a step's forward and backward: both use the saved carries, or neither (a
  // call larger than reserve()'s in carries keeps none).
  const size_t bytes = taylor_attn_saved_carries_bytes(B, T, H_, F_, Dv_, env_.act);
  if (bytes > 0 && bytes <= carries_buf_.bytes())
    ao.saved_carries = carries_buf_.tensor(DType::F32, {static_cast<int64_t>(bytes / sizeof(float))});
  return ao;
}

void TaylorMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  forward_to_state(x, out, Tensor(), add);
}

void TaylorMixer::forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(N <= B_ * T_, "TaylorMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor proj = proj_buf_.tensor(env_.act, {N, P_});
  Tensor o = o_buf_.tensor(env_.act, {B, T, H_, Dv_});
  Tensor den = den_buf_.tensor(env_.stat, {B, H_, T});
  matmul(ctx, x.view({N, d_}), false, ps.weight(wqkv_), true, proj);
  taylor_attn_fwd(ctx, bthd(proj, B, T, 0, H_, F_), bthd(proj, B, T, H_ * F_, H_, F_),
                  bthd(proj, B, T, 2 * H_ * F_, H_, Dv_), o, den, s_final, attn_opts(B, T));
  matmul_add(ctx, o.view({N, H_ * Dv_}), false, ps.weight(wo_), true, addend_rows(add, N, d_), out.view({N, d_}));
}

void TaylorMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  Tensor proj = proj_buf_.tensor(env_.act, {N, P_});
  Tensor o = o_buf_.tensor(env_.act, {B, T, H_, Dv_});
  Tensor den = den_buf_.tensor(env_.stat, {B, H_, T});
  Tensor dy2 = dy.view({N, d_});

  Tensor d_o = env_.scratch->get("taylor.do", env_.act, {B, T, H_, Dv_});
  matmul(ctx, dy2, false, ps.weight(wo_), false, d_o.view({N, H_ * Dv_}));
  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, o.view({N, H_ * Dv_}), false, dwo.grad, 1.f, dwo.beta);

  Tensor dproj = env_.scratch->get("taylor.dproj", env_.act, {N, P_});
  const TaylorAttnOpts ao = attn_opts(B, T);
  env_.open_comm_window();
  taylor_attn_bwd(ctx, bthd(proj, B, T, 0, H_, F_), bthd(proj, B, T, H_ * F_, H_, F_),
                  bthd(proj, B, T, 2 * H_ * F_, H_, Dv_), o, den, d_o, bthd(dproj, B, T, 0, H_, F_),
                  bthd(dproj, B, T, H_ * F_, H_, F_), bthd(dproj, B, T, 2 * H_ * F_, H_, Dv_), ao);
  matmul(ctx, dproj, false, ps.weight(wqkv_), false, dx.view({N, d_}));
  const ParamStore::GradWrite dwqkv = ps.grad_write(wqkv_);
  matmul(ctx, dproj, true, x.view({N, d_}), false, dwqkv.grad, 1.f, dwqkv.beta);
}

std::unique_ptr<MixerState> TaylorMixer::init_state(int64_t B) {
  auto st = std::make_unique<TaylorState>();
  // f32 on the GPU: the sums grow with the sequence and must not be rounded to bf16 (docs/based.md §10.1).
  st->S = OwnedTensor(env_.stat, env_.device(), {B, H_, taylor_attn_state_rows(F_), Dv_ + 1});
  zero_tensor(st->S);
  return st;
}

void TaylorMixer::start_document(MixerState& state, int64_t row) {
  zero_tensor(env_.ctx, dynamic_cast<TaylorState&>(state).S->select(0, row));
}

void TaylorMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  (void)ctx;
  auto& st = dynamic_cast<TaylorState&>(state);
  LINAC_CHECK(st.S->size(0) == x.size(0), "TaylorMixer::prefill: state was made for another batch size");
  forward_to_state(x, out, st.S);
}

void TaylorMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<TaylorState&>(state);
  const int64_t B = x_t.size(0);
  LINAC_CHECK(st.S->size(0) == B, "TaylorMixer::step: state was made for another batch size");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor proj = env_.scratch->get("taylor.step.proj", env_.act, {B, P_});
  Tensor o = env_.scratch->get("taylor.step.o", env_.act, {B, H_ * Dv_});
  matmul(ctx, x_t.view({B, d_}), false, ps.weight(wqkv_), true, proj);
  taylor_attn_step(ctx, bhd(proj, 0, H_, F_), bhd(proj, H_ * F_, H_, F_), bhd(proj, 2 * H_ * F_, H_, Dv_), st.S,
                   o.view({B, H_, Dv_}), opt_.eps);
  matmul(ctx, o, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

}  // namespace linac
