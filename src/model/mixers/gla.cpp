#include "model/mixers/gla.h"

#include <algorithm>
#include <cmath>

#include "config/json_reader.h"
#include "elementwise/doc_start_fill.h"
#include "gla/gla.h"
#include "loggate/loggate.h"
#include "loggate/loggate_lowrank.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "norm_gate/norm_gate.h"

namespace linac {

namespace {

// Normal std with the variance of xavier_uniform(gain): gain * sqrt(2 / (fan_in + fan_out)).
double xavier_std(double gain, int64_t fan_in, int64_t fan_out) {
  return gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
}
constexpr double kQkGain = 0.17677669529663687;  // 2^-2.5, the v3 code's gain for Wq, Wk, Wa

struct GlaState final : MixerState {
  OwnedTensor S;  // [B, H, Dk, Dv]
};

}  // namespace

GlaMixerOptions GlaMixerOptions::parse(const json& o, const std::string& path, const std::string& file) {
  GlaMixerOptions opt;
  JsonReader r(o, path, file);
  opt.expand_k = r.get_double("expand_k", opt.expand_k, 1e-3, 16);
  opt.expand_v = r.get_double("expand_v", opt.expand_v, 1e-3, 16);
  opt.gate_rank = r.get_int("gate_rank", opt.gate_rank, 1, 4096);
  opt.gate_temperature = r.get_double("gate_temperature", opt.gate_temperature, 1e-3, 1e6);
  // null switches the clamp off (the reader treats null as absent, which would mean the default).
  const bool clamp_off = o.is_object() && o.contains("gate_clamp") && o.at("gate_clamp").is_null();
  opt.gate_clamp = r.get_double("gate_clamp", opt.gate_clamp, -1e6, 0);
  if (clamp_off) opt.gate_clamp = 0;
  opt.chunk = r.get_int("chunk", opt.chunk, 1, 4096);
  opt.scale = r.get_double("scale", opt.scale, 0, 1e6);
  opt.norm_eps = r.get_double("norm_eps", opt.norm_eps, 0, 1);
  r.finish();
  if (opt.chunk % 16 != 0 && opt.chunk > 16)
    throw UserError(file + ": " + path + ".chunk: must be at most 16 or a multiple of 16, got " +
                    std::to_string(opt.chunk));
  return opt;
}

GlaMixer::GlaMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const GlaMixerOptions& opt,
                   const std::string& path)
    : env_(env), opt_(opt), d_(cfg.d_model), H_(cfg.n_heads) {
  const double d = static_cast<double>(d_);
  dk_ = std::llround(opt_.expand_k * d);
  dv_ = std::llround(opt_.expand_v * d);
  R_ = opt_.gate_rank;
  P_ = 2 * dk_ + 2 * dv_ + R_;
  if (dk_ % H_ != 0 || dv_ % H_ != 0 || dk_ < H_ || dv_ < H_)
    throw UserError(cfg.source + ": " + path + ": expand_k * model.d_model (" + std::to_string(dk_) +
                    ") and expand_v * model.d_model (" + std::to_string(dv_) +
                    ") must be positive multiples of model.n_heads (" + std::to_string(H_) + ")");
  if (env.ctx.is_gpu() && ((dk_ / H_) % 16 != 0 || (dv_ / H_) % 16 != 0 || opt_.chunk != 64 || R_ % 8 != 0))
    throw UserError(cfg.source + ": the GPU GLA kernels need per-head key/value dims that are multiples of 16 (got " +
                    std::to_string(dk_ / H_) + ", " + std::to_string(dv_ / H_) + "), " + path + ".chunk 64 (got " +
                    std::to_string(opt_.chunk) + ") and a gate_rank that is a multiple of 8 (got " +
                    std::to_string(R_) + ")");
  scale_ = opt_.scale > 0 ? opt_.scale : 1.0 / std::sqrt(d / static_cast<double>(H_));
  const std::string p = "layers." + std::to_string(layer) + ".gla.";
  ParamStore& ps = *env.params;
  wqk_ = ps.add({p + "wqk", {2 * dk_, d_}, Init::Normal, xavier_std(kQkGain, d_, dk_), true});
  wvr_ = ps.add({p + "wvr", {2 * dv_, d_}, Init::Normal, cfg.init_std, true});
  wa1_ = ps.add({p + "wa1", {R_, d_}, Init::Normal, xavier_std(kQkGain, d_, R_), true});
  wa2_ = ps.add({p + "wa2", {dk_, R_}, Init::Normal, xavier_std(kQkGain, R_, dk_), true});
  ba_ = ps.add({p + "ba", {dk_}, Init::Zeros, 0, false, {}, true});
  br_ = ps.add({p + "br", {dv_}, Init::Zeros, 0, false, {}, true});
  wo_ = ps.add({p + "wo", {d_, dv_}, Init::Normal, cfg.init_std, true});
}

void GlaMixer::reserve(int64_t B, int64_t T) {
  capacity_ = B * T;
  const Device dev = env_.device();
  const size_t N = static_cast<size_t>(capacity_), act = dtype_size(env_.act), stat = dtype_size(env_.stat);
  proj_buf_ = env_.saved->take(N * static_cast<size_t>(P_) * act);
  o_buf_ = env_.saved->take(N * static_cast<size_t>(dv_) * act);
  zo_buf_ = env_.saved->take(N * static_cast<size_t>(dv_) * act);
  mean_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * stat);
  rstd_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * stat);
  core_buf_ = env_.saved->take(core_saved_bytes(B, T));
  // A row of ones: bias gradients are column sums, computed as ones^T dX (a deterministic GEMM).
  OwnedTensor ones(DType::F64, Device::CPU, {capacity_});
  std::fill_n(ones->data<double>(), capacity_, 1.0);
  OwnedTensor conv = to(ones, Device::CPU, env_.act);
  ones_buf_ = Buffer(N * act, dev);
  copy_tensor(ones_buf_.tensor(env_.act, {capacity_}), conv);
}

// One Dk x Dv matrix per head.
int64_t GlaMixer::state_elems(int64_t T) const {
  (void)T;
  return H_ * (dk_ / H_) * (dv_ / H_);
}

size_t GlaMixer::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T), act = dtype_size(env_.act), stat = dtype_size(env_.stat);
  return N * (static_cast<size_t>(P_ + 2 * dv_) * act + static_cast<size_t>(2 * H_) * stat) + core_saved_bytes(B, T);
}

size_t GlaMixer::core_saved_bytes(int64_t B, int64_t T) const {
  return env_.ctx.is_gpu() ? gla_saved_bytes(B, T, H_, dk_ / H_, dv_ / H_, env_.act) : 0;
}

Tensor GlaMixer::core_saved(int64_t B, int64_t T) const {
  const size_t need = core_saved_bytes(B, T);
  if (need == 0 || need > core_buf_.bytes()) return Tensor();
  return core_buf_.tensor(DType::U32, {static_cast<int64_t>(need / 4)});
}

double GlaMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_), dk = static_cast<double>(dk_), dv = static_cast<double>(dv_);
  const double R = static_cast<double>(R_), Dk = dk / static_cast<double>(H_), Dv = dv / static_cast<double>(H_);
  // Projections (2 FLOPs per weight per token forward, x3 with the backward).
  const double proj = 6.0 * (d * static_cast<double>(P_) + R * dk + dv * d);
  // Chunkwise GLA per head and token, forward: the state update and the inter-chunk output
  // (2 Dk Dv each) and the causal halves of P = Q K^T and P V (C (Dk + Dv)); x3 with the backward.
  const double C = static_cast<double>(std::min<int64_t>(opt_.chunk, T));
  const double core = 3.0 * static_cast<double>(H_) * (4.0 * Dk * Dv + C * (Dk + Dv));
  return proj + core;
}

std::vector<GlaMixer::InputGemm> GlaMixer::input_gemms(bool with_grads) {
  ParamStore& ps = *env_.params;
  // The three gradients are only written here, so their betas agree.
  ParamStore::GradWrite gqk{}, gvr{}, ga1{};
  if (with_grads) {
    gqk = ps.grad_write(wqk_);
    gvr = ps.grad_write(wvr_);
    ga1 = ps.grad_write(wa1_);
  }
  if (const Tensor w = adjacent_rows({ps.weight(wqk_), ps.weight(wvr_), ps.weight(wa1_)}); w.defined()) {
    const Tensor g = with_grads ? adjacent_rows({gqk.grad, gvr.grad, ga1.grad}) : Tensor();
    LINAC_CHECK(!with_grads || g.defined(),
                "GLA: the input projection's gradients are not back to back as its weights");
    return {{w, g, 0, gqk.beta}};
  }
  return {{ps.weight(wqk_), gqk.grad, 0, gqk.beta},
          {ps.weight(wvr_), gvr.grad, 2 * dk_, gvr.beta},
          {ps.weight(wa1_), ga1.grad, 2 * dk_ + 2 * dv_, ga1.beta}};
}

void GlaMixer::project(const Tensor& x, const Tensor& proj) {
  for (const InputGemm& p : input_gemms(false)) matmul(env_.ctx, x, false, p.w, true, cols(proj, p.c0, p.w.size(0)));
}

void GlaMixer::gate_fwd(const Tensor& proj, const Tensor& g) {
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor u = cols(proj, 2 * dk_ + 2 * dv_, R_);
  const LogGateOpts lg{opt_.gate_temperature, opt_.gate_clamp};
  if (loggate_lowrank_gpu_ok(ctx, dk_, R_, env_.act)) {
    loggate_lowrank_fwd(ctx, u, ps.weight(wa2_), ps.master(ba_), g, lg);
    return;
  }
  // z in the statistics dtype (f32 on the GPU: a bf16 x bf16 -> f32 GEMM), so the gate never sees bf16.
  Tensor z = env_.scratch->get("gla.z", env_.stat, {u.size(0), dk_});
  matmul(ctx, u, false, ps.weight(wa2_), true, z);
  loggate_fwd(ctx, z, ps.master(ba_), g, lg);
}

void GlaMixer::gate_bwd(const Tensor& proj, const Tensor& dg, const Tensor& dz) {
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const Tensor u = cols(proj, 2 * dk_ + 2 * dv_, R_);
  const LogGateOpts lg{opt_.gate_temperature, opt_.gate_clamp};
  if (loggate_lowrank_gpu_ok(ctx, dk_, R_, env_.act)) {
    loggate_lowrank_bwd(ctx, u, ps.weight(wa2_), ps.master(ba_), dg, dz, ps.grad(ba_), lg);
    return;
  }
  const int64_t N = u.size(0);
  Tensor z = env_.scratch->get("gla.z", env_.stat, {N, dk_});
  matmul(ctx, u, false, ps.weight(wa2_), true, z);
  loggate_bwd(ctx, z, ps.master(ba_), dg, dz, lg);
  matmul(ctx, ones_buf_.tensor(env_.act, {1, N}), false, dz, false, ps.grad(ba_).view({1, dk_}), 1.f, 1.f);
}

void GlaMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  forward_to_state(x, out, Tensor(), add);
}

void GlaMixer::forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(N <= capacity_, "GlaMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor proj = proj_buf_.tensor(env_.act, {N, P_});
  Tensor o = o_buf_.tensor(env_.act, {N, dv_});
  Tensor mean = mean_buf_.tensor(env_.stat, {N, H_}), rstd = rstd_buf_.tensor(env_.stat, {N, H_});
  project(x.view({N, d_}), proj);
  Tensor g = env_.scratch->get("gla.g", env_.stat, {N, dk_});
  gate_fwd(proj, g);
  doc_start_fill(ctx, g.view({B, T, dk_}), env_.docs, gla_doc_start_gate(env_.stat));
  const int64_t Dk = dk_ / H_, Dv = dv_ / H_;
  GlaOpts go;
  go.scale = scale_;
  go.chunk = opt_.chunk;
  go.sub_chunk = std::min<int64_t>(16, opt_.chunk);
  gla_fwd(ctx, bthd(proj, B, T, 0, H_, Dk), bthd(proj, B, T, dk_, H_, Dk), bthd(proj, B, T, 2 * dk_, H_, Dv),
          g.view({B, T, H_, Dk}), o.view({B, T, H_, Dv}), Tensor(), s_final, go, GlaForm::Chunk, core_saved(B, T));
  Tensor zo = zo_buf_.tensor(env_.act, {N, dv_});
  norm_gate_fwd(ctx, o, cols(proj, 2 * dk_ + dv_, dv_), ps.master(br_), zo, mean, rstd, opt_.norm_eps);
  matmul_add(ctx, zo, false, ps.weight(wo_), true, addend_rows(add, N, d_), out.view({N, d_}));
}

void GlaMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const int64_t Dk = dk_ / H_, Dv = dv_ / H_, cr = 2 * dk_ + dv_, ca = 2 * dk_ + 2 * dv_;
  Tensor proj = proj_buf_.tensor(env_.act, {N, P_});
  Tensor o = o_buf_.tensor(env_.act, {N, dv_});
  Tensor mean = mean_buf_.tensor(env_.stat, {N, H_}), rstd = rstd_buf_.tensor(env_.stat, {N, H_});
  Tensor ones = ones_buf_.tensor(env_.act, {1, N});
  Tensor x2 = x.view({N, d_}), dy2 = dy.view({N, d_});

  // Output projection and the gated per-head norm.
  Tensor dzo = env_.scratch->get("gla.dzo", env_.act, {N, dv_});
  matmul(ctx, dy2, false, ps.weight(wo_), false, dzo);
  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, zo_buf_.tensor(env_.act, {N, dv_}), false, dwo.grad, 1.f, dwo.beta);
  Tensor dproj = env_.scratch->get("gla.dproj", env_.act, {N, P_});
  Tensor d_o = env_.scratch->get("gla.do", env_.act, {N, dv_});
  norm_gate_bwd(ctx, o, cols(proj, cr, dv_), ps.master(br_), mean, rstd, dzo, d_o, cols(dproj, cr, dv_));
  matmul(ctx, ones, false, cols(dproj, cr, dv_), false, ps.grad(br_).view({1, dv_}), 1.f, 1.f);

  // The GLA core (g recomputed only where its saved intermediates are not kept), then the gate.
  const Tensor saved = core_saved(B, T);
  Tensor g;
  if (!saved.defined()) {
    g = env_.scratch->get("gla.g", env_.stat, {N, dk_});
    gate_fwd(proj, g);
    doc_start_fill(ctx, g.view({B, T, dk_}), env_.docs, gla_doc_start_gate(env_.stat));
    g = g.view({B, T, H_, Dk});
  }
  Tensor dg = env_.scratch->get("gla.dg", env_.stat, {N, dk_});
  GlaOpts go;
  go.scale = scale_;
  go.chunk = opt_.chunk;
  go.sub_chunk = std::min<int64_t>(16, opt_.chunk);
  go.after_reverse_scan = [this] { env_.open_comm_window(); };
  gla_bwd(ctx, bthd(proj, B, T, 0, H_, Dk), bthd(proj, B, T, dk_, H_, Dk), bthd(proj, B, T, 2 * dk_, H_, Dv), g,
          d_o.view({B, T, H_, Dv}), Tensor(), Tensor(), bthd(dproj, B, T, 0, H_, Dk), bthd(dproj, B, T, dk_, H_, Dk),
          bthd(dproj, B, T, 2 * dk_, H_, Dv), dg.view({B, T, H_, Dk}), Tensor(), go, GlaForm::Chunk, saved);
  // g is a constant at document starts.
  doc_start_fill(ctx, dg.view({B, T, dk_}), env_.docs, 0.0);
  Tensor dz = env_.scratch->get("gla.dz", env_.act, {N, dk_});
  gate_bwd(proj, dg, dz);
  const ParamStore::GradWrite dwa2 = ps.grad_write(wa2_);
  matmul(ctx, dz, true, cols(proj, ca, R_), false, dwa2.grad, 1.f, dwa2.beta);
  matmul(ctx, dz, false, ps.weight(wa2_), false, cols(dproj, ca, R_));

  // Input projections: weight gradients and dx.
  Tensor dx2 = dx.view({N, d_});
  float beta = 0.f;
  for (const InputGemm& p : input_gemms(true)) {
    const Tensor dp = cols(dproj, p.c0, p.w.size(0));
    matmul(ctx, dp, true, x2, false, p.grad, 1.f, p.grad_beta);
    matmul(ctx, dp, false, p.w, false, dx2, 1.f, beta);
    beta = 1.f;
  }
}

std::unique_ptr<MixerState> GlaMixer::init_state(int64_t B) {
  auto st = std::make_unique<GlaState>();
  // The recurrent state is f32 on the GPU (never rounded to bf16), the compute dtype on the CPU.
  st->S = OwnedTensor(env_.stat, env_.device(), {B, H_, dk_ / H_, dv_ / H_});
  zero_tensor(st->S);
  return st;
}

void GlaMixer::start_document(MixerState& state, int64_t row) {
  zero_tensor(env_.ctx, dynamic_cast<GlaState&>(state).S->select(0, row));
}

void GlaMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<GlaState&>(state);
  const int64_t B = x_t.size(0), Dk = dk_ / H_, Dv = dv_ / H_;
  LINAC_CHECK(st.S->size(0) == B, "GlaMixer::step: state was made for another batch size");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor proj = env_.scratch->get("gla.step.proj", env_.act, {B, P_});
  Tensor g = env_.scratch->get("gla.step.g", env_.stat, {B, dk_});
  Tensor o = env_.scratch->get("gla.step.o", env_.act, {B, dv_});
  Tensor zo = env_.scratch->get("gla.step.zo", env_.act, {B, dv_});
  Tensor mean = env_.scratch->get("gla.step.mean", env_.stat, {B, H_});
  Tensor rstd = env_.scratch->get("gla.step.rstd", env_.stat, {B, H_});
  project(x_t.view({B, d_}), proj);
  gate_fwd(proj, g);
  gla_step(ctx, bhd(proj, 0, H_, Dk), bhd(proj, dk_, H_, Dk), bhd(proj, 2 * dk_, H_, Dv), g.view({B, H_, Dk}), st.S,
           o.view({B, H_, Dv}), scale_);
  norm_gate_fwd(ctx, o, cols(proj, 2 * dk_ + dv_, dv_), ps.master(br_), zo, mean, rstd, opt_.norm_eps);
  matmul(ctx, zo, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

void GlaMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  (void)ctx;
  auto& st = dynamic_cast<GlaState&>(state);
  LINAC_CHECK(st.S->size(0) == x.size(0), "GlaMixer::prefill: state was made for another batch size");
  forward_to_state(x, out, st.S);
}

}  // namespace linac
