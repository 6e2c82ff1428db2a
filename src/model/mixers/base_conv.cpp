#include "model/mixers/base_conv.h"

#include <algorithm>
#include <cmath>

#include "config/json_reader.h"
#include "elementwise/elementwise.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "short_conv/short_conv.h"

namespace linac {

namespace {
struct BaseConvState final : MixerState {
  OwnedTensor inputs;  // [B, W-1, E]: the last W-1 conv inputs
};

// [B, T, C] view of columns [c0, c0 + C) of a [B*T, P] buffer.
Tensor btc(const Tensor& proj, int64_t B, int64_t T, int64_t c0, int64_t C) {
  return bthd(proj, B, T, c0, 1, C).select(2, 0);
}
}  // namespace

BaseConvMixerOptions BaseConvMixerOptions::parse(const json& o, const std::string& path, const std::string& file) {
  BaseConvMixerOptions opt;
  JsonReader r(o, path, file);
  opt.expand = r.get_double("expand", opt.expand, 0.01, 64);
  opt.kernel_size = r.get_int("kernel_size", opt.kernel_size, 1, 8);
  opt.activation = r.get_choice("activation", opt.activation, {"silu", "none"});
  r.finish();
  return opt;
}

BaseConvMixer::BaseConvMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const BaseConvMixerOptions& opt,
                             const std::string& path)
    : env_(env), opt_(opt), d_(cfg.d_model), W_(opt.kernel_size) {
  const double width = opt_.expand * static_cast<double>(d_);
  E_ = std::llround(width / 2);
  if (E_ < 1 || std::abs(width - 2.0 * static_cast<double>(E_)) > 1e-9)
    throw UserError(cfg.source + ": " + path +
                    ".expand: expand * model.d_model must be an even number of channels, got " + std::to_string(width));
  const std::string p = "layers." + std::to_string(layer) + ".conv.";
  const double out_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  ParamStore& ps = *env.params;
  w_in_ = ps.add({p + "w_in", {2 * E_, d_}, Init::Normal, cfg.init_std, true});
  b_in_ = ps.add({p + "b_in", {2 * E_}, Init::Zeros, 0, false, {}, true});
  filter_ =
      ps.add({p + "filter", {E_, W_}, Init::Normal, 1.0 / std::sqrt(3.0 * static_cast<double>(W_)), true, {}, true});
  w_out_ = ps.add({p + "w_out", {d_, E_}, Init::Normal, out_std, true});
  b_out_ = ps.add({p + "b_out", {d_}, Init::Zeros, 0, false, {}, true});
}

void BaseConvMixer::fill_ones(int64_t N) {
  if (N <= ones_n_) return;
  ones_n_ = N;
  const Device dev = env_.device();
  OwnedTensor ones(DType::F64, Device::CPU, {N});
  std::fill_n(ones->data<double>(), N, 1.0);
  ones_act_ = Buffer(static_cast<size_t>(N) * dtype_size(env_.act), dev);
  copy_tensor(ones_act_.tensor(env_.act, {N}), to(ones, Device::CPU, env_.act));
}

void BaseConvMixer::reserve(int64_t B, int64_t T) {
  if (env_.ctx.is_gpu()) {
    const size_t need = short_conv_bwd_workspace_bytes(B, T, E_, W_);
    if (need > env_.ctx.workspace_bytes)
      throw UserError("the base_conv backward needs " + std::to_string((need >> 20) + 1) +
                      " MiB of GPU workspace for micro-batches of " + std::to_string(B) + "x" + std::to_string(T) +
                      "; set LINAC_WORKSPACE_MB or use a smaller train.micro_batch");
  }
  capacity_ = B * T;
  proj_buf_ = env_.saved->take(static_cast<size_t>(capacity_ * 2 * E_) * dtype_size(env_.act));
  z_buf_ = env_.saved->take(static_cast<size_t>(capacity_ * E_) * dtype_size(env_.act));
  fill_ones(capacity_);
}

// The last W - 1 convolution inputs of each of the E channels.
int64_t BaseConvMixer::state_elems(int64_t T) const {
  (void)T;
  return std::max<int64_t>(W_ - 1, 0) * E_;
}

size_t BaseConvMixer::activation_bytes(int64_t B, int64_t T) const {
  return static_cast<size_t>(B * T * 3 * E_) * dtype_size(env_.act);
}

double BaseConvMixer::flops_per_token(int64_t) const {
  const double d = static_cast<double>(d_), E = static_cast<double>(E_), W = static_cast<double>(W_);
  // Projections (2 FLOPs per weight per token forward, x3 with the backward) and the
  // convolution with its gate (2 W + 2 per channel forward, x3).
  return 6.0 * (2.0 * E * d + E * d) + 3.0 * E * (2.0 * W + 2.0);
}

Tensor BaseConvMixer::out_bias() {
  // The master bias rounded like the output it is added to.
  Tensor b = env_.params->master(b_out_);
  if (b.dtype == env_.act) return b;
  const Tensor rounded = env_.scratch->get("conv.b_out", env_.act, {d_});
  cast(env_.ctx, rounded, b);
  return rounded;
}

void BaseConvMixer::add_out_bias(const Tensor& out, int64_t N) {
  // out += 1 b^T (a one-column GEMM): decoding's few rows, which the skinny GEMM takes without a bias.
  matmul(env_.ctx, ones_act_.tensor(env_.act, {N, 1}), false, out_bias().view({1, d_}), false, out, 1.f, 1.f);
}

void BaseConvMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(N <= capacity_, "BaseConvMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor proj = proj_buf_.tensor(env_.act, {N, 2 * E_});
  Tensor z = z_buf_.tensor(env_.act, {N, E_});
  const Tensor b_in = ps.master(b_in_);
  matmul(ctx, x.view({N, d_}), false, ps.weight(w_in_), true, proj);
  short_conv_fwd(ctx, btc(proj, B, T, 0, E_), btc(proj, B, T, E_, E_), ps.master(filter_), b_in.narrow(0, 0, E_),
                 b_in.narrow(0, E_, E_), z.view({B, T, E_}), {opt_.activation == "silu", env_.docs});
  matmul_bias(ctx, z, false, ps.weight(w_out_), true, out_bias(), out.view({N, d_}), addend_rows(add, N, d_));
}

void BaseConvMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const ShortConvOpts so{opt_.activation == "silu", env_.docs};
  Tensor proj = proj_buf_.tensor(env_.act, {N, 2 * E_});
  Tensor a = btc(proj, B, T, 0, E_), g = btc(proj, B, T, E_, E_);
  const Tensor b_in = ps.master(b_in_), db_in = ps.grad(b_in_);
  Tensor dy2 = dy.view({N, d_});

  Tensor z = z_buf_.tensor(env_.act, {N, E_});
  const ParamStore::GradWrite dw_out = ps.grad_write(w_out_);
  matmul(ctx, dy2, true, z, false, dw_out.grad, 1.f, dw_out.beta);
  matmul(ctx, ones_act_.tensor(env_.act, {1, N}), false, dy2, false, ps.grad(b_out_).view({1, d_}), 1.f, 1.f);
  Tensor dz = env_.scratch->get("conv.dz", env_.act, {N, E_});
  matmul(ctx, dy2, false, ps.weight(w_out_), false, dz);

  Tensor dproj = env_.scratch->get("conv.dproj", env_.act, {N, 2 * E_});
  short_conv_bwd(ctx, a, g, ps.master(filter_), b_in.narrow(0, 0, E_), b_in.narrow(0, E_, E_), dz.view({B, T, E_}),
                 btc(dproj, B, T, 0, E_), btc(dproj, B, T, E_, E_), ps.grad(filter_), db_in.narrow(0, 0, E_),
                 db_in.narrow(0, E_, E_), so);
  matmul(ctx, dproj, false, ps.weight(w_in_), false, dx.view({N, d_}));
  const ParamStore::GradWrite dw_in = ps.grad_write(w_in_);
  matmul(ctx, dproj, true, x.view({N, d_}), false, dw_in.grad, 1.f, dw_in.beta);
}

std::unique_ptr<MixerState> BaseConvMixer::init_state(int64_t B) {
  auto st = std::make_unique<BaseConvState>();
  st->inputs = OwnedTensor(env_.stat, env_.device(), {B, std::max<int64_t>(W_ - 1, 0), E_});
  zero_tensor(st->inputs);
  fill_ones(B);
  return st;
}

void BaseConvMixer::start_document(MixerState& state, int64_t row) {
  auto& st = dynamic_cast<BaseConvState&>(state);
  if (W_ > 1) zero_tensor(env_.ctx, st.inputs->select(0, row));
}

void BaseConvMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  auto& st = dynamic_cast<BaseConvState&>(state);
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(st.inputs->size(0) == B, "BaseConvMixer::prefill: state was made for another batch size");
  forward(x, out);
  if (W_ == 1) return;
  // The fresh (zero) state takes the last inputs of each row's last document through the decode
  // step, so it holds exactly what stepping would have left (the step's outputs are discarded).
  const ParamStore& ps = *env_.params;
  const Tensor b_in = ps.master(b_in_);
  const Tensor proj = proj_buf_.tensor(env_.act, {N, 2 * E_});
  const Tensor a = btc(proj, B, T, 0, E_), g = btc(proj, B, T, E_, E_);
  Tensor z = env_.scratch->get("conv.step.z", env_.act, {B, E_});
  std::vector<int64_t> n = last_doc_lengths(env_, B, T);
  for (int64_t& len : n) len = std::min(W_ - 1, len);
  const ShortConvOpts so{opt_.activation == "silu", {}};
  auto push = [&](int64_t b0, int64_t rows, int64_t count) {
    for (int64_t t = T - count; t < T; ++t)
      short_conv_step(ctx, a.narrow(0, b0, rows).select(1, t), g.narrow(0, b0, rows).select(1, t), ps.master(filter_),
                      b_in.narrow(0, 0, E_), b_in.narrow(0, E_, E_), st.inputs->narrow(0, b0, rows),
                      z.narrow(0, b0, rows), so);
  };
  if (std::all_of(n.begin(), n.end(), [&](int64_t c) { return c == n[0]; }))
    push(0, B, n[0]);
  else
    for (int64_t b = 0; b < B; ++b) push(b, 1, n[static_cast<size_t>(b)]);
}

void BaseConvMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<BaseConvState&>(state);
  const int64_t B = x_t.size(0);
  LINAC_CHECK(st.inputs->size(0) == B, "BaseConvMixer::step: state was made for another batch size");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor b_in = ps.master(b_in_);
  Tensor proj = env_.scratch->get("conv.step.proj", env_.act, {B, 2 * E_});
  Tensor z = env_.scratch->get("conv.step.z", env_.act, {B, E_});
  matmul(ctx, x_t.view({B, d_}), false, ps.weight(w_in_), true, proj);
  short_conv_step(ctx, proj.narrow(1, 0, E_), proj.narrow(1, E_, E_), ps.master(filter_), b_in.narrow(0, 0, E_),
                  b_in.narrow(0, E_, E_), st.inputs, z, {opt_.activation == "silu", {}});
  matmul(ctx, z, false, ps.weight(w_out_), true, out_t.view({B, d_}));
  add_out_bias(out_t.view({B, d_}), B);
}

}  // namespace linac
