#include "model/mixers/latte.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "config/json_reader.h"
#include "latte/latte.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "rope/rope.h"
#include "rope/rope_linear.h"
#include "short_conv/short_conv.h"

namespace linac {

namespace {

struct LatteState final : MixerState {
  OwnedTensor lse, mu;  // [B, H, Lh], [B, H, Lh, Dh]: the latent summaries' log-normalisers and means
  OwnedTensor conv;     // [B, K-1, d]: the last K-1 conv inputs
  OwnedTensor k, v;     // [B, window, H, Dh]: the local attention's ring buffer (post-RoPE keys)
  OwnedTensor done;     // [B, H] int32 zeros: attention_decode_step's block counters (GPU)
};

}  // namespace

LatteMixerOptions LatteMixerOptions::parse(const json& o, const std::string& path, const std::string& file,
                                           bool macchiato) {
  LatteMixerOptions opt;
  JsonReader r(o, path, file);
  opt.heads = r.get_int("heads", opt.heads, 0, 1024);
  opt.latents = r.get_int("latents", opt.latents, 1, 1 << 16);
  opt.conv = r.get_int("conv", macchiato ? 3 : 0, 0, kShortConvMaxWidth);
  opt.vapor = r.get_bool("vapor", !macchiato);
  opt.window = r.get_int("window", macchiato ? 129 : 0, macchiato ? 1 : 0, int64_t(1) << 30);
  if (!opt.vapor && opt.window == 0 && r.present("rope_base"))
    r.fail("rope_base", "does not apply without VAPOR or a local window (nothing is rotated)");
  opt.rope_base = r.get_double("rope_base", opt.rope_base, 1.0, 1e12);
  opt.chunk = r.get_int("chunk", opt.chunk, 1, 4096);
  r.finish();
  if (opt.vapor && opt.window > 0)
    throw UserError(file + ": " + path + ": vapor and a local window exclude each other (the local attention needs "
                    "the unrotated values); set \"vapor\": false or \"window\": 0");
  return opt;
}

LatteMixer::LatteMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const LatteMixerOptions& opt, bool macchiato,
                       const std::string& path)
    : env_(env), opt_(opt), macchiato_(macchiato), d_(cfg.d_model) {
  H_ = opt_.heads > 0 ? opt_.heads : cfg.n_heads;
  if (d_ % H_ != 0)
    throw UserError(cfg.source + ": " + path + ".heads: " + std::to_string(H_) + " heads must divide model.d_model (" +
                    std::to_string(d_) + ")");
  if (opt_.latents % H_ != 0)
    throw UserError(cfg.source + ": " + path + ".latents: " + std::to_string(opt_.latents) +
                    " latents must split evenly over " + std::to_string(H_) + " heads");
  Dh_ = d_ / H_;
  Lh_ = opt_.latents / H_;
  La_ = Lh_ + (opt_.window > 0 ? 1 : 0);
  if ((opt_.vapor || opt_.window > 0) && Dh_ % 2 != 0)
    throw UserError(cfg.source + ": " + path + ": the head dim " + std::to_string(Dh_) +
                    " must be even for RoPE (VAPOR or the local window)");
  if (env.ctx.is_gpu() && (Lh_ > 64 || Dh_ > 128 || Dh_ % 4 != 0))
    throw UserError(cfg.source + ": " + path +
                    ": the GPU Latte kernels take up to 64 latents per head and a head dim that is a "
                    "multiple of 4 up to 128 (got " +
                    std::to_string(Lh_) + " latents, head dim " + std::to_string(Dh_) + ")");
  if (env.ctx.is_gpu() && opt_.window > 0 && !attention_gpu_head_dim_ok(Dh_))
    throw UserError(cfg.source + ": " + path +
                    ".window: the GPU attention kernels take head dims that are multiples of 16 "
                    "from 64 to 128 (got " +
                    std::to_string(Dh_) + ")");
  Px_ = opt_.window > 0 ? 3 * d_ : d_;
  Pa_ = H_ * La_ + opt_.latents;
  const std::string p = "layers." + std::to_string(layer) + ".latte.";
  ParamStore& ps = *env.params;
  wx_ = ps.add({p + "wx", {Px_, d_}, Init::Normal, cfg.init_std, true});
  wab_ = ps.add({p + "wab", {Pa_, d_}, Init::Normal, cfg.init_std, true});
  if (opt_.conv > 0)
    conv_ = ps.add({p + "conv", {d_, opt_.conv}, Init::Normal, 1.0 / std::sqrt(3.0 * static_cast<double>(opt_.conv)),
                    true, {}, true});
  wo_ = ps.add({p + "wo", {d_, d_}, Init::Normal, cfg.init_std, true});
  if (opt_.conv > 0) {
    OwnedTensor host(DType::F64, Device::CPU, {d_});
    std::fill_n(host->data<double>(), d_, 1.0);
    ones_ = to(host, env.device(), env.act);
  }
}

void LatteMixer::reserve(int64_t B, int64_t T) {
  if (env_.ctx.is_gpu()) {
    auto require = [&](size_t need, const std::string& what, const std::string& unit) {
      if (need > env_.ctx.workspace_bytes)
        throw UserError(what + " needs " + std::to_string((need >> 20) + 1) + " MiB of GPU workspace for " + unit +
                        "; set LINAC_WORKSPACE_MB or use a smaller train.micro_batch / data.seq_len");
    };
    require(latte_workspace_bytes_per_seq(T, H_, Lh_, Dh_, env_.act), "the Latte core",
            "sequences of " + std::to_string(T) + " tokens");
    if (opt_.window > 0)
      require(attention_bwd_workspace_bytes(B, T, H_, Dh_, true), "the local attention's backward",
              "micro-batches of " + std::to_string(B) + "x" + std::to_string(T));
    if (opt_.conv > 0)
      require(short_conv_bwd_workspace_bytes(B, T, d_, opt_.conv), "the logits' convolution backward",
              "micro-batches of " + std::to_string(B) + "x" + std::to_string(T));
  }
  B_ = B, T_ = T;
  const size_t N = static_cast<size_t>(B * T), act = dtype_size(env_.act), stat = dtype_size(env_.stat);
  xv_buf_ = env_.saved->take(N * static_cast<size_t>(Px_) * act);
  ab_buf_ = env_.saved->take(N * static_cast<size_t>(Pa_) * act);
  y_buf_ = env_.saved->take(N * static_cast<size_t>(d_) * act);
  lse_buf_ = env_.saved->take(N * static_cast<size_t>(opt_.latents) * stat);
  if (opt_.conv > 0) z_buf_ = env_.saved->take(N * static_cast<size_t>(d_) * act);
  if (env_.ctx.is_gpu()) states_buf_ = env_.saved->take(latte_saved_state_bytes(B, T, H_, Lh_, Dh_));
  if (opt_.window > 0) {
    oloc_buf_ = env_.saved->take(N * static_cast<size_t>(d_) * act);
    lse_loc_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * stat);
  }
}

// Per head and latent the running log-normaliser and value summary; Macchiato adds its
// convolution inputs and the local window's keys and values.
int64_t LatteMixer::state_elems(int64_t T) const {
  int64_t n = H_ * Lh_ * (Dh_ + 1);
  if (opt_.conv > 0) n += (opt_.conv - 1) * d_;
  if (opt_.window > 0) n += 2 * std::min(T, opt_.window) * H_ * Dh_;
  return n;
}

size_t LatteMixer::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T), act = dtype_size(env_.act), stat = dtype_size(env_.stat);
  const size_t local = opt_.window > 0 ? N * (static_cast<size_t>(d_) * act + static_cast<size_t>(H_) * stat) : 0;
  const size_t conv = opt_.conv > 0 ? N * static_cast<size_t>(d_) * act : 0;
  const size_t states = env_.ctx.is_gpu() ? latte_saved_state_bytes(B, T, H_, Lh_, Dh_) : 0;
  return N * (static_cast<size_t>(Px_ + Pa_ + d_) * act + static_cast<size_t>(opt_.latents) * stat) + local + conv +
         states;
}

double LatteMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_), Lh = static_cast<double>(Lh_), Dh = static_cast<double>(Dh_);
  const double C = static_cast<double>(std::min<int64_t>(opt_.chunk, T));
  // Projections (2 FLOPs per weight per token forward, x3 with the backward); the chunked Latte
  // core per head and token, forward: the causal halves of the C x C scores and their product
  // with V (C (Lh + Dh)), the inter-chunk read-out and state update (4 Lh Dh); x3 with the
  // backward; the local attention like a windowed attention layer; the convolution.
  double f = 6.0 * static_cast<double>(Px_ + Pa_ + d_) * d + 3.0 * static_cast<double>(H_) * (C * (Lh + Dh) + 4.0 * Lh * Dh);
  if (opt_.window > 0) f += 12.0 * d * static_cast<double>(std::min<int64_t>(opt_.window, T));
  if (opt_.conv > 0) f += 6.0 * d * static_cast<double>(opt_.conv);
  return f;
}

Tensor LatteMixer::unit_gate(int64_t B, int64_t T) const {
  // Every (batch, token) row reads the same d ones: zero batch and token strides.
  if (T == 0) {
    Tensor g(ones_->ptr, env_.act, env_.device(), {B, d_});
    g.strides[0] = 0;
    return g;
  }
  Tensor g(ones_->ptr, env_.act, env_.device(), {B, T, d_});
  g.strides[0] = g.strides[1] = 0;
  return g;
}

ShortConvOpts LatteMixer::conv_opts() const {
  ShortConvOpts so = step_conv_opts();
  so.docs = env_.docs;
  return so;
}

// A decoding step's: the state holds only the current document's inputs.
ShortConvOpts LatteMixer::step_conv_opts() {
  ShortConvOpts so;
  so.silu = false;
  return so;
}

LatteOpts LatteMixer::core_opts(int64_t B, int64_t T) const {
  LatteOpts lo;
  lo.chunk = opt_.chunk;
  lo.docs = env_.docs;
  // The same B, T in a step's forward and backward: both use the saved chunk states, or neither.
  const size_t states = latte_saved_state_bytes(B, T, H_, Lh_, Dh_);
  if (states > 0 && states <= states_buf_.bytes())
    lo.saved_states = states_buf_.tensor(DType::F32, {static_cast<int64_t>(states / 4)});
  return lo;
}

void LatteMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  forward_to_state(x, out, Tensor(), add);
}

void LatteMixer::forward_to_state(const Tensor& x, const Tensor& out, const Tensor& mu_final, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  LINAC_CHECK(N <= B_ * T_, "LatteMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor xv = xv_buf_.tensor(env_.act, {N, Px_});
  Tensor ab = ab_buf_.tensor(env_.act, {N, Pa_});
  Tensor y = y_buf_.tensor(env_.act, {B, T, H_, Dh_});
  Tensor lse = lse_buf_.tensor(env_.stat, {B, T, H_, Lh_});
  const DocBounds& docs = env_.docs;  // positions restart at each document (rope.h)
  if (opt_.window > 0)                // q and k, columns [d, 3d) of [v | q | k], rotated as they are computed
    rope_linear_fwd(ctx, x.view({N, d_}), ps.weight(wx_), xv, T, 2 * d_, Dh_, opt_.rope_base, docs, d_);
  else
    matmul(ctx, x.view({N, d_}), false, ps.weight(wx_), true, xv);
  Tensor z = x;  // the latent logits' input stream: x, or its convolution (kept for the backward)
  if (opt_.conv > 0) {
    z = z_buf_.tensor(env_.act, {B, T, d_});
    short_conv_fwd(ctx, x, unit_gate(B, T), ps.master(conv_), Tensor(), Tensor(), z, conv_opts());
  }
  matmul(ctx, z.view({N, d_}), false, ps.weight(wab_), true, ab);
  const Tensor v = bthd(xv, B, T, 0, H_, Dh_);
  Tensor local;
  if (opt_.window > 0) {
    const Tensor q = bthd(xv, B, T, d_, H_, Dh_), k = bthd(xv, B, T, 2 * d_, H_, Dh_);
    local = oloc_buf_.tensor(env_.act, {B, T, H_, Dh_});
    AttentionOpts ao;
    ao.window = opt_.window;
    ao.docs = docs;
    attention_fwd(ctx, q, k, v, local, lse_loc_buf_.tensor(env_.stat, {B, H_, T}), ao);
  }
  if (opt_.vapor) rope_bwd(ctx, v, opt_.rope_base, 0, docs);  // v_s -> R^(-s) v_s, kept for the backward
  latte_fwd(ctx, bthd(ab, B, T, 0, H_, La_), bthd(ab, B, T, H_ * La_, H_, Lh_), v, local, y, lse, mu_final,
            core_opts(B, T));
  if (opt_.vapor) rope_fwd(ctx, y, opt_.rope_base, 0, docs);  // y_t -> R^t y_t
  matmul_add(ctx, y.view({N, d_}), false, ps.weight(wo_), true, addend_rows(add, N, d_), out.view({N, d_}));
}

void LatteMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const Tensor xv = xv_buf_.tensor(env_.act, {N, Px_});
  const Tensor ab = ab_buf_.tensor(env_.act, {N, Pa_});
  const Tensor y = y_buf_.tensor(env_.act, {N, d_});
  const Tensor lse = lse_buf_.tensor(env_.stat, {B, T, H_, Lh_});
  const Tensor dy2 = dy.view({N, d_}), x2 = x.view({N, d_}), W = ps.weight(wx_);
  const Tensor v = bthd(xv, B, T, 0, H_, Dh_);
  const Tensor local = opt_.window > 0 ? oloc_buf_.tensor(env_.act, {B, T, H_, Dh_}) : Tensor();

  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, y, false, dwo.grad, 1.f, dwo.beta);
  Tensor dY = env_.scratch->get("latte.dy", env_.act, {B, T, H_, Dh_});
  matmul(ctx, dy2, false, ps.weight(wo_), false, dY.view({N, d_}));
  const DocBounds& docs = env_.docs;
  if (opt_.vapor) rope_bwd(ctx, dY, opt_.rope_base, 0, docs);

  Tensor dab = env_.scratch->get("latte.dab", env_.act, {N, Pa_});
  // dxv is laid out as xv ([v | q | k] or [v]), so Wx's input and weight gradients are one GEMM each.
  Tensor dxv = env_.scratch->get("latte.dxv", env_.act, {N, Px_});
  const Tensor dV = bthd(dxv, B, T, 0, H_, Dh_);
  Tensor dlocal = opt_.window > 0 ? env_.scratch->get("latte.dlocal", env_.act, {B, T, H_, Dh_}) : Tensor();
  env_.open_comm_window();
  latte_bwd(ctx, bthd(ab, B, T, 0, H_, La_), bthd(ab, B, T, H_ * La_, H_, Lh_), v, local, lse, dY,
            bthd(dab, B, T, 0, H_, La_), bthd(dab, B, T, H_ * La_, H_, Lh_), dV, dlocal, core_opts(B, T));
  if (opt_.vapor) rope_fwd(ctx, dV, opt_.rope_base, 0, docs);  // the rotation's transpose

  // The logits' path: dz = dAB Wab; through the convolution when there is one.
  const Tensor z = opt_.conv > 0 ? z_buf_.tensor(env_.act, {B, T, d_}) : x;
  const ParamStore::GradWrite dwab = ps.grad_write(wab_);
  matmul(ctx, dab, true, z.view({N, d_}), false, dwab.grad, 1.f, dwab.beta);
  if (opt_.conv > 0) {
    Tensor dz = env_.scratch->get("latte.dz", env_.act, {B, T, d_});
    matmul(ctx, dab, false, ps.weight(wab_), false, dz.view({N, d_}));
    short_conv_bwd(ctx, x, unit_gate(B, T), ps.master(conv_), Tensor(), Tensor(), dz, dx, Tensor(), ps.grad(conv_),
                   Tensor(), Tensor(), conv_opts());
  } else {
    matmul(ctx, dab, false, ps.weight(wab_), false, dx.view({N, d_}));
  }

  // The local path: attention backward into dq, dk (for the unrotated q and k: the kernel turns
  // them back where it can, attention.h) and, added to dV, the values' second share.
  if (opt_.window > 0) {
    AttentionOpts ao;
    ao.window = opt_.window;
    ao.docs = docs;
    ao.accumulate_dv = true;
    ao.rope = opt_.rope_base;
    attention_bwd(ctx, bthd(xv, B, T, d_, H_, Dh_), bthd(xv, B, T, 2 * d_, H_, Dh_), v, local,
                  lse_loc_buf_.tensor(env_.stat, {B, H_, T}), dlocal, bthd(dxv, B, T, d_, H_, Dh_),
                  bthd(dxv, B, T, 2 * d_, H_, Dh_), dV, ao);
  }
  const ParamStore::GradWrite dw = ps.grad_write(wx_);
  matmul(ctx, dxv, false, W, false, dx.view({N, d_}), 1.f, 1.f);
  matmul(ctx, dxv, true, x2, false, dw.grad, 1.f, dw.beta);
}

std::unique_ptr<MixerState> LatteMixer::init_state(int64_t B) {
  auto st = std::make_unique<LatteState>();
  const Device dev = env_.device();
  st->lse = OwnedTensor(env_.stat, dev, {B, H_, Lh_});
  st->mu = OwnedTensor(env_.stat, dev, {B, H_, Lh_, Dh_});
  latte_state_reset(env_.ctx, st->lse, st->mu);
  if (opt_.conv > 0) {
    st->conv = OwnedTensor(env_.stat, dev, {B, opt_.conv - 1, d_});
    zero_tensor(st->conv);
  }
  if (opt_.window > 0) {
    st->k = OwnedTensor(env_.act, dev, {B, opt_.window, H_, Dh_});
    st->v = OwnedTensor(env_.act, dev, {B, opt_.window, H_, Dh_});
    st->done = OwnedTensor(DType::I32, dev, {B, H_});
    zero_tensor(env_.ctx, st->done);
  }
  return st;
}

// Row `row` as init_state leaves it: an empty latent state and conv history (the model sets its
// position back to 0; the ring buffer's old slots are never read again: a step reads the first
// min(pos + 1, window)).
void LatteMixer::start_document(MixerState& state, int64_t row) {
  auto& st = dynamic_cast<LatteState&>(state);
  const Ctx& ctx = env_.ctx;
  latte_state_reset(ctx, st.lse->narrow(0, row, 1), st.mu->narrow(0, row, 1));
  if (opt_.conv > 0) zero_tensor(ctx, st.conv->narrow(0, row, 1));
}

void LatteMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<LatteState&>(state);
  const int64_t B = x_t.size(0);
  LINAC_CHECK(st.lse->size(0) == B, "LatteMixer::step: state was made for another batch size");
  LINAC_CHECK(env_.decode_pos.ptr, "LatteMixer::step: runs inside Model::decode_step (env.decode_pos)");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor x2 = x_t.view({B, d_});
  Tensor xv = env_.scratch->get("latte.step.xv", env_.act, {B, Px_});
  Tensor ab = env_.scratch->get("latte.step.ab", env_.act, {B, Pa_});
  Tensor y = env_.scratch->get("latte.step.y", env_.act, {B, d_});
  matmul(ctx, x2, false, ps.weight(wx_), true, xv);
  Tensor z = x2;
  if (opt_.conv > 0) {
    z = env_.scratch->get("latte.step.z", env_.act, {B, d_});
    short_conv_step(ctx, x2, unit_gate(B, 0), ps.master(conv_), Tensor(), Tensor(), st.conv, z, step_conv_opts());
  }
  matmul(ctx, z, false, ps.weight(wab_), true, ab);
  // Every row at its own document position, read on the device (env.decode_pos): the local
  // attention (RoPE, ring buffer write, window read) and VAPOR's rotations of v before the latent
  // core and of y after it. One-token [B, 1, H, Dh] views for RoPE.
  Tensor local;
  if (opt_.window > 0) {
    local = env_.scratch->get("latte.step.local", env_.act, {B, H_, Dh_});
    attention_decode_step(ctx, bhd(xv, d_, H_, Dh_), bhd(xv, 2 * d_, H_, Dh_), bhd(xv, 0, H_, Dh_), env_.decode_pos,
                          st.k, st.v, RopeFreqs(opt_.rope_base), opt_.window, local, st.done);
  }
  if (opt_.vapor) rope_bwd(ctx, bthd(xv, B, 1, 0, H_, Dh_), opt_.rope_base, env_.decode_pos);
  latte_step(ctx, bhd(ab, 0, H_, La_), bhd(ab, H_ * La_, H_, Lh_), bhd(xv, 0, H_, Dh_), local, st.lse, st.mu,
             y.view({B, H_, Dh_}));
  if (opt_.vapor) rope_fwd(ctx, y.view({B, 1, H_, Dh_}), opt_.rope_base, env_.decode_pos);
  matmul(ctx, y, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

// One chunked forward that hands over each row's last document's state: the latent state from
// the core (mu_final and lse's last row: latte.h), the conv history by stepping the conv over the
// document's last K-1 inputs from zeros, the ring buffer from the post-RoPE keys and values the
// forward left in xv.
void LatteMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  auto& st = dynamic_cast<LatteState&>(state);
  const int64_t B = x.size(0), T = x.size(1);
  LINAC_CHECK(st.lse->size(0) == B, "LatteMixer::prefill: state was made for another batch size");
  forward_to_state(x, out, st.mu);
  const Tensor lse = lse_buf_.tensor(env_.stat, {B, T, H_, Lh_});
  const Tensor xv = xv_buf_.tensor(env_.act, {B * T, Px_});
  for (int64_t b = 0; b < B; ++b) copy_tensor(ctx, st.lse->select(0, b), lse.select(0, b).select(0, T - 1));
  const std::vector<int64_t> lengths = last_doc_lengths(env_, B, T);
  // Rows [b0, b0 + n), whose last document starts at s.
  auto hand_over = [&](int64_t b0, int64_t n, int64_t s) {
    if (opt_.conv > 0) {
      const Tensor conv = st.conv->narrow(0, b0, n);
      Tensor z = env_.scratch->get("latte.prefill.z", env_.act, {n, d_});
      for (int64_t t = std::max(s, T - (opt_.conv - 1)); t < T; ++t)
        short_conv_step(ctx, x.narrow(0, b0, n).select(1, t), unit_gate(n, 0), env_.params->master(conv_), Tensor(),
                        Tensor(), conv, z, step_conv_opts());
    }
    if (opt_.window > 0) {
      const Tensor kc = st.k->narrow(0, b0, n), vc = st.v->narrow(0, b0, n);
      const Tensor k = bthd(xv, B, T, 2 * d_, H_, Dh_).narrow(0, b0, n), v = bthd(xv, B, T, 0, H_, Dh_).narrow(0, b0, n);
      const int64_t first = std::max(s, T - opt_.window);
      attention_cache_write(ctx, k.narrow(1, first, T - first), v.narrow(1, first, T - first), kc, vc,
                            (first - s) % opt_.window);
    }
  };
  if (rows_agree(lengths)) {
    hand_over(0, B, T - lengths[0]);
  } else {
    for (int64_t b = 0; b < B; ++b) hand_over(b, 1, T - lengths[static_cast<size_t>(b)]);
  }
}

}  // namespace linac
