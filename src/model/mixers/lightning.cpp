#include "model/mixers/lightning.h"

#include <algorithm>
#include <cmath>

#include "activation/activation.h"
#include "config/json_reader.h"
#include "lightning/lightning.h"
#include "lrpe/lrpe.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "srmsnorm/srmsnorm.h"

namespace linac {

namespace {

struct TnlState final : MixerState {
  OwnedTensor S;  // [B, H, Dk, dh]; LRPE's positions are the model's (env.decode_pos)
};

// ALiBi slopes 2^(-8(h+1)/n) for n a power of two; otherwise those of the largest power of two
// below n followed by every second slope of twice that (docs/transnormer.md §1.4).
std::vector<double> alibi_slopes(int64_t n) {
  auto pow2 = [](int64_t m) {
    std::vector<double> s;
    for (int64_t h = 0; h < m; ++h)
      s.push_back(std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(m)));
    return s;
  };
  int64_t p = 1;
  while (2 * p <= n) p *= 2;
  std::vector<double> s = pow2(p);
  const std::vector<double> twice = pow2(2 * p);
  for (int64_t i = 0; static_cast<int64_t>(s.size()) < n; i += 2) s.push_back(twice[static_cast<size_t>(i)]);
  return s;
}

}  // namespace

std::vector<double> lightning_decay_rates(const std::string& schedule, int64_t heads, int64_t layer, int64_t n_layers) {
  const double l = static_cast<double>(layer), L = static_cast<double>(n_layers);
  std::vector<double> s;
  if (schedule == "paper") {
    for (int64_t h = 0; h < heads; ++h)
      s.push_back(8.0 * static_cast<double>(h + 1) / static_cast<double>(heads) * (1.0 - l / L));
    return s;
  }
  // l / (L - 1) runs from 0 (the first layer: the full slopes) to 1 (the last: almost no decay).
  // A one-layer model has no last layer: its layer is the first, as in any deeper stack
  // (docs/transnormer.md §1.4); the released code divides by zero there.
  const double temperature = 1.0 - (n_layers > 1 ? l / (L - 1.0) : 0.0) + 1e-5;
  for (double slope : alibi_slopes(heads)) s.push_back(slope * temperature);
  return s;
}

LightningMixerOptions LightningMixerOptions::parse(const json& o, const std::string& path, const std::string& file) {
  LightningMixerOptions opt;
  JsonReader r(o, path, file);
  opt.heads = r.get_int("heads", opt.heads, 0, 1024);
  opt.lrpe = r.get_choice("lrpe", opt.lrpe, {"first", "all", "none"});
  opt.decay = r.get_choice("decay", opt.decay, {"code", "paper"});
  opt.norm_eps = r.get_double("norm_eps", opt.norm_eps, 0, 1);
  opt.block = r.get_int("block", opt.block, 1, 4096);
  r.finish();
  return opt;
}

LightningMixer::LightningMixer(ModelEnv& env, const ModelConfig& cfg, int layer, bool first_of_kind,
                               const LightningMixerOptions& opt, const std::string& path)
    : env_(env), opt_(opt), d_(cfg.d_model), E_(cfg.d_model) {
  H_ = opt_.heads > 0 ? opt_.heads : cfg.n_heads;
  if (E_ % H_ != 0)
    throw UserError(cfg.source + ": " + path + ".heads: " + std::to_string(H_) + " heads must divide model.d_model (" +
                    std::to_string(E_) + ")");
  dh_ = E_ / H_;
  lrpe_ = opt_.lrpe == "all" || (opt_.lrpe == "first" && first_of_kind);
  Dk_ = lrpe_ ? 2 * dh_ : dh_;
  if (env.ctx.is_gpu() && (dh_ % 16 != 0 || Dk_ > 256))
    throw UserError(cfg.source + ": the GPU lightning kernels need a head dim that is a multiple of 16 and at most " +
                    std::string(lrpe_ ? "128 with LRPE" : "256") + " (got " + std::to_string(dh_) + ")");
  // Parameter names keep the "tnl" of the first checkpoints (renaming them would orphan those).
  const std::string p = "layers." + std::to_string(layer) + ".tnl.";
  ParamStore& ps = *env.params;
  wqkvu_ = ps.add({p + "wqkvu", {4 * E_, d_}, Init::Normal, cfg.init_std, true});
  wo_ = ps.add({p + "wo", {d_, E_}, Init::Normal, cfg.init_std, true});
  if (lrpe_) {
    ParamSpec theta{p + "theta", {H_, dh_}, Init::Values, 0, false, {}, true};
    for (int64_t m = 0; m < E_; ++m)
      theta.values.push_back(std::pow(10000.0, -2.0 * static_cast<double>(m) / static_cast<double>(E_)));
    theta_ = ps.add(theta);
  }
  const std::vector<double> rates = lightning_decay_rates(opt_.decay, H_, layer, cfg.n_layers);
  OwnedTensor host(DType::F64, Device::CPU, {H_});
  std::copy(rates.begin(), rates.end(), host->data<double>());
  decay_ = to(host, env.device(), env.stat);
}

void LightningMixer::reserve(int64_t B, int64_t T) {
  if (env_.ctx.is_gpu()) {
    // The lightning kernels need room for at least one sequence (they run the batch in groups
    // that fit); the LRPE backward needs its whole micro-batch at once.
    auto require = [&](size_t need, const std::string& what, const std::string& unit) {
      if (need > env_.ctx.workspace_bytes)
        throw UserError(what + " needs " + std::to_string((need >> 20) + 1) + " MiB of GPU workspace for " + unit +
                        "; set LINAC_WORKSPACE_MB or use a smaller train.micro_batch / data.seq_len");
    };
    require(lightning_workspace_bytes_per_seq(T, H_, Dk_, dh_, env_.act), "lightning attention",
            "sequences of " + std::to_string(T) + " tokens");
    if (lrpe_)
      require(lrpe_bwd_workspace_bytes(B, T, H_, dh_), "the LRPE backward",
              "micro-batches of " + std::to_string(B) + "x" + std::to_string(T));
  }
  capacity_ = B * T;
  const size_t N = static_cast<size_t>(capacity_), E = static_cast<size_t>(E_), act = dtype_size(env_.act);
  proj_buf_ = env_.saved->take(N * 4 * E * act);
  o_buf_ = env_.saved->take(N * E * act);
  rstd_buf_ = env_.saved->take(N * dtype_size(env_.stat));
  qa_buf_ = env_.saved->take(N * 2 * E * act);
  g_buf_ = env_.saved->take(N * E * act);
  states_buf_ = env_.saved->take(core_saved_bytes(B, T));
}

size_t LightningMixer::core_saved_bytes(int64_t B, int64_t T) const {
  return env_.ctx.is_gpu() ? lightning_saved_bytes(B, T, H_, Dk_, dh_, env_.act) : 0;
}

Tensor LightningMixer::core_saved(int64_t B, int64_t T) const {
  const size_t need = core_saved_bytes(B, T);
  if (need == 0 || need > states_buf_.bytes()) return Tensor();
  return states_buf_.tensor(DType::U32, {static_cast<int64_t>(need / 4)});
}

// One Dk x Dh matrix per head.
int64_t LightningMixer::state_elems(int64_t T) const {
  (void)T;
  return H_ * Dk_ * dh_;
}

size_t LightningMixer::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T);
  return N * (8 * static_cast<size_t>(E_) * dtype_size(env_.act) + dtype_size(env_.stat)) + core_saved_bytes(B, T);
}

double LightningMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_), E = static_cast<double>(E_);
  const double Dk = static_cast<double>(Dk_), Dv = static_cast<double>(dh_);
  // Projections (2 FLOPs per weight per token forward, x3 with the backward); the block form per
  // head and token, forward: the state update and the inter-block read-out (2 Dk Dv each) and the
  // causal halves of Q K^T and its product with V (C (Dk + Dv)); x3 with the backward.
  const double C = static_cast<double>(std::min<int64_t>(opt_.block, T));
  return 6.0 * (4.0 * E * d + E * d) + 3.0 * static_cast<double>(H_) * (4.0 * Dk * Dv + C * (Dk + Dv));
}

void LightningMixer::queries_keys(const Tensor& proj, int64_t B, int64_t T, const Tensor& qa, const Tensor& qk,
                                  const Tensor& positions) {
  silu_fwd(env_.ctx, proj.narrow(1, 0, 2 * E_), qa);  // [SiLU(Qr) | SiLU(Kr)]
  rotate(B, T, qa, qk, positions);
}

void LightningMixer::rotate(int64_t B, int64_t T, const Tensor& qa, const Tensor& qk, const Tensor& positions) {
  if (!lrpe_) return;
  const Tensor theta = env_.params->master(theta_);
  for (const int64_t half : {0, 1}) {  // queries, then keys
    const Tensor in = bthd(qa, B, T, half * E_, H_, dh_), out = bthd(qk, B, T, half * H_ * Dk_, H_, Dk_);
    if (positions.ptr)
      lrpe_fwd_at(env_.ctx, in, theta, out, positions);
    else
      lrpe_fwd(env_.ctx, in, theta, out, 0, env_.docs);
  }
}

void LightningMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  forward_to_state(x, out, Tensor(), add);
}

void LightningMixer::forward_to_state(const Tensor& x, const Tensor& out, const Tensor& s_final, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(N <= capacity_, "LightningMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvu_), x2 = x.view({N, d_});
  Tensor proj = proj_buf_.tensor(env_.act, {N, 4 * E_});
  Tensor o = o_buf_.tensor(env_.act, {N, E_});
  Tensor rstd = rstd_buf_.tensor(env_.stat, {N});
  matmul(ctx, x2, false, W, true, proj);
  Tensor qa = qa_buf_.tensor(env_.act, {N, 2 * E_});
  Tensor qk = lrpe_ ? env_.scratch->get("lightning.qk", env_.act, {N, 2 * H_ * Dk_}) : qa;
  queries_keys(proj, B, T, qa, qk);
  lightning_fwd(ctx, bthd(qk, B, T, 0, H_, Dk_), bthd(qk, B, T, H_ * Dk_, H_, Dk_), bthd(proj, B, T, 2 * E_, H_, dh_),
                decay_, o.view({B, T, H_, dh_}), Tensor(), s_final, {opt_.block, env_.docs, {}, {}},
                LightningForm::Block, core_saved(B, T));
  Tensor g = g_buf_.tensor(env_.act, {N, E_});
  srmsnorm_gate_fwd(ctx, o, proj.narrow(1, 3 * E_, E_), g, rstd, opt_.norm_eps);
  matmul_add(ctx, g, false, ps.weight(wo_), true, addend_rows(add, N, d_), out.view({N, d_}));
}

void LightningMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvu_), x2 = x.view({N, d_}), dy2 = dy.view({N, d_});
  Tensor proj = proj_buf_.tensor(env_.act, {N, 4 * E_});
  Tensor o = o_buf_.tensor(env_.act, {N, E_});
  Tensor rstd = rstd_buf_.tensor(env_.stat, {N});
  const Tensor u = proj.narrow(1, 3 * E_, E_);

  // Output projection and gate: the gradients of Wo, of o and of U (the last quarter of
  // d[Qr|Kr|V|U]).
  const Tensor g = g_buf_.tensor(env_.act, {N, E_});
  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, g, false, dwo.grad, 1.f, dwo.beta);
  Tensor dg = env_.scratch->get("lightning.dg", env_.act, {N, E_});
  matmul(ctx, dy2, false, ps.weight(wo_), false, dg);
  Tensor dproj = env_.scratch->get("lightning.dproj", env_.act, {N, 4 * E_});
  Tensor d_o = env_.scratch->get("lightning.do", env_.act, {N, E_});
  srmsnorm_gate_bwd(ctx, o, u, rstd, dg, d_o, dproj.narrow(1, 3 * E_, E_));

  // Lightning attention, LRPE and SiLU backward into d[Qr|Kr|V]. Without LRPE the attention's
  // backward applies SiLU's derivative itself (LightningOpts::q_pre) and writes d[Qr|Kr] directly.
  const Tensor qa = qa_buf_.tensor(env_.act, {N, 2 * E_});
  const Tensor qk = lrpe_ ? env_.scratch->get("lightning.qk", env_.act, {N, 2 * H_ * Dk_}) : qa;
  rotate(B, T, qa, qk);  // LRPE's output is not kept: the LRPE layer rotates again
  LightningOpts lo{opt_.block, env_.docs, {}, {}};
  if (!lrpe_) {
    lo.q_pre = bthd(proj, B, T, 0, H_, dh_);
    lo.k_pre = bthd(proj, B, T, E_, H_, dh_);
  }
  const Tensor dqk = lrpe_ ? env_.scratch->get("lightning.dqk", env_.act, {N, 2 * H_ * Dk_}) : dproj;
  env_.open_comm_window();
  lightning_bwd(ctx, bthd(qk, B, T, 0, H_, Dk_), bthd(qk, B, T, H_ * Dk_, H_, Dk_), bthd(proj, B, T, 2 * E_, H_, dh_),
                decay_, d_o.view({B, T, H_, dh_}), Tensor(), Tensor(), bthd(dqk, B, T, 0, H_, Dk_),
                bthd(dqk, B, T, H_ * Dk_, H_, Dk_), bthd(dproj, B, T, 2 * E_, H_, dh_), Tensor(), lo,
                LightningForm::Block, core_saved(B, T));
  if (lrpe_) {
    Tensor dqa = env_.scratch->get("lightning.dqa", env_.act, {N, 2 * E_});
    const Tensor theta = ps.master(theta_), dtheta = ps.grad(theta_);
    lrpe_bwd(ctx, bthd(qa, B, T, 0, H_, dh_), theta, bthd(dqk, B, T, 0, H_, Dk_), bthd(dqa, B, T, 0, H_, dh_), dtheta,
             0, env_.docs);
    lrpe_bwd(ctx, bthd(qa, B, T, E_, H_, dh_), theta, bthd(dqk, B, T, H_ * Dk_, H_, Dk_), bthd(dqa, B, T, E_, H_, dh_),
             dtheta, 0, env_.docs);
    silu_bwd(ctx, proj.narrow(1, 0, 2 * E_), dqa, dproj.narrow(1, 0, 2 * E_));
  }

  // The input projection [Qr|Kr|V|U] = x Wqkvu^T.
  matmul(ctx, dproj, false, W, false, dx.view({N, d_}));
  const ParamStore::GradWrite dw = ps.grad_write(wqkvu_);
  matmul(ctx, dproj, true, x2, false, dw.grad, 1.f, dw.beta);
}

std::unique_ptr<MixerState> LightningMixer::init_state(int64_t B) {
  auto st = std::make_unique<TnlState>();
  st->S = OwnedTensor(env_.stat, env_.device(), {B, H_, Dk_, dh_});
  zero_tensor(st->S);
  return st;
}

void LightningMixer::start_document(MixerState& state, int64_t row) {
  auto& st = dynamic_cast<TnlState&>(state);
  zero_tensor(env_.ctx, st.S->select(0, row));
}

void LightningMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<TnlState&>(state);
  const int64_t B = x_t.size(0);
  LINAC_CHECK(st.S->size(0) == B, "LightningMixer::step: state was made for another batch size");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvu_), x2 = x_t.view({B, d_});
  Tensor proj = env_.scratch->get("lightning.step.proj", env_.act, {B, 4 * E_});
  Tensor qa = env_.scratch->get("lightning.step.qa", env_.act, {B, 2 * E_});
  Tensor qk = lrpe_ ? env_.scratch->get("lightning.step.qk", env_.act, {B, 2 * H_ * Dk_}) : qa;
  Tensor o = env_.scratch->get("lightning.step.o", env_.act, {B, E_});
  Tensor rstd = env_.scratch->get("lightning.step.rstd", env_.stat, {B});
  Tensor g = env_.scratch->get("lightning.step.g", env_.act, {B, E_});
  matmul(ctx, x2, false, W, true, proj);
  // LRPE at each row's document position, read on the device (env.decode_pos), so that a CUDA graph
  // of this step replays every later one.
  LINAC_CHECK(!lrpe_ || env_.decode_pos.ptr, "LightningMixer::step: runs inside Model::decode_step (env.decode_pos)");
  queries_keys(proj, B, 1, qa, qk, env_.decode_pos);
  lightning_step(ctx, bhd(qk, 0, H_, Dk_), bhd(qk, H_ * Dk_, H_, Dk_), bhd(proj, 2 * E_, H_, dh_), decay_, st.S,
                 o.view({B, H_, dh_}));
  srmsnorm_gate_fwd(ctx, o, proj.narrow(1, 3 * E_, E_), g, rstd, opt_.norm_eps);
  matmul(ctx, g, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

void LightningMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  (void)ctx;
  auto& st = dynamic_cast<TnlState&>(state);
  LINAC_CHECK(st.S->size(0) == x.size(0), "LightningMixer::prefill: state was made for another batch size");
  // With documents the final state is already that of each row's last document.
  forward_to_state(x, out, st.S);
}

}  // namespace linac
