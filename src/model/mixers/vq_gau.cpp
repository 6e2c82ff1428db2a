#include "model/mixers/vq_gau.h"

#include <cmath>

#include "config/json_reader.h"
#include "core/dispatch.h"
#include "core/profiler.h"
#include "elementwise/elementwise.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "reduce/reduce.h"
#include "srmsnorm/srmsnorm.h"
#include "swiglu/swiglu.h"
#include "swiglu/swiglu_linear.h"
#include "vq_attn/vq_attn.h"

namespace linac {

namespace {

constexpr double kNormEps = 1e-6;

struct VqGauState final : MixerState {
  OwnedTensor khat, v, z, counts, means;  // see VqAttnState
  // The codebook and the position terms, functions of the weights alone: made once for the
  // state's steps rather than by every step.
  OwnedTensor codebook, rho;
  VqAttnState view() const { return {khat, v, z, counts, means}; }
};

}  // namespace

VqGauMixerOptions VqGauMixerOptions::parse(const json& o, const std::string& path, const std::string& file) {
  VqGauMixerOptions opt;
  JsonReader r(o, path, file);
  opt.heads = r.get_int("heads", opt.heads, 1, 256);
  opt.dk = r.get_int("dk", opt.dk, 1, 4096);
  opt.dv = r.get_int("dv", opt.dv, 0, 1 << 20);
  opt.codebook = r.get_int("codebook", opt.codebook, 1, 1 << 16);
  opt.block = r.get_int("block", opt.block, 1, 1 << 16);
  opt.beta = r.get_double("beta", opt.beta, 0, 1e3);
  opt.gamma = r.get_double("gamma", opt.gamma, 0, 1);
  r.finish();
  return opt;
}

VqGauMixer::VqGauMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const VqGauMixerOptions& opt,
                       const std::string& path)
    : env_(env), opt_(opt), d_(cfg.d_model), H_(opt.heads), Dk_(opt.dk), S_(opt.codebook), Lb_(opt.block) {
  Dv_ = opt_.dv > 0 ? opt_.dv : 2 * d_;
  if (Dv_ % H_ != 0)
    throw UserError(cfg.source + ": " + path + ".dv: " + std::to_string(Dv_) + " must split evenly over " +
                    std::to_string(H_) + " heads");
  if (d_ % 2 != 0) throw UserError(cfg.source + ": model.d_model: must be even for the VQ position sinusoids");
  Dvh_ = Dv_ / H_;
  Pqkv_ = 2 * H_ * Dk_ + Dv_;
  qk_scale_ = std::pow(static_cast<double>(Dk_), -0.25);
  const std::string p = "layers." + std::to_string(layer) + ".gau.";
  const double in_std = 1.0 / std::sqrt(static_cast<double>(d_)), out_std = 1.0 / std::sqrt(static_cast<double>(Dv_));
  ParamStore& ps = *env.params;
  wqkvg_ = ps.add({p + "wqkvg", {Pqkv_ + Dv_, d_}, Init::Normal, in_std, true});
  wr_ = ps.add({p + "wr", {H_ * Dk_, d_}, Init::Normal, in_std, true, {}, true});
  u_ = ps.add({p + "u", {H_, Dk_}, Init::Zeros, 0, false, {}, true});
  vr_ = ps.add({p + "vr", {H_, Dk_}, Init::Zeros, 0, false, {}, true});
  wo_ = ps.add({p + "wo", {d_, Dv_}, Init::Normal, out_std, true});
  c_sum_ = ps.add_buffer({p + "c_sum", {H_, S_, Dk_}, Init::Normal, 1.0 / std::sqrt(static_cast<double>(S_ * H_)), false});
  c_count_ = ps.add_buffer({p + "c_count", {H_, S_}, Init::Ones, 0, false});

  OwnedTensor e(DType::F64, Device::CPU, {Lb_ + 1, d_});
  const int64_t half = d_ / 2;
  for (int64_t dist = 0; dist <= Lb_; ++dist)
    for (int64_t i = 0; i < half; ++i) {
      const double w = std::pow(1e5, -2.0 * static_cast<double>(i) / static_cast<double>(d_));
      e->data<double>()[dist * d_ + i] = std::sin(static_cast<double>(dist) * w);
      e->data<double>()[dist * d_ + half + i] = std::cos(static_cast<double>(dist) * w);
    }
  sinusoids_ = to(e, env.device(), env.stat);
  acc_sums_ = OwnedTensor(env.stat, env.device(), {H_, S_, Dk_});
  acc_counts_ = OwnedTensor(env.stat, env.device(), {H_, S_});
  err_sum_ = OwnedTensor(env.stat, env.device(), {1});
  rho_ = OwnedTensor(env.stat, env.device(), {H_, Lb_ + 1, Dk_});
  zero_tensor(err_sum_);
  zero_tensor(acc_sums_);
  zero_tensor(acc_counts_);
}

// The VQ-attention kernels' scratch on the GPU: a scratch-pool buffer of the size the shape
// runs best with, handed to them as the context's workspace (the model's workspace stays free).
Ctx VqGauMixer::attn_ctx(int64_t B, int64_t T) const {
  Ctx c = env_.ctx;
  if (!c.is_gpu()) return c;
  const size_t bytes = vq_attn_workspace_bytes(B, T, H_, Dk_, Dvh_, S_, Lb_, env_.act, env_.docs.defined());
  const Tensor ws = env_.scratch->get("vq_gau.attn_workspace", DType::F32, {static_cast<int64_t>(bytes / 4 + 1)});
  c.workspace = ws.ptr;
  c.workspace_bytes = bytes;
  return c;
}

void VqGauMixer::reserve(int64_t B, int64_t T) {
  capacity_ = B * T;
  const size_t N = static_cast<size_t>(capacity_), act = dtype_size(env_.act), stat = dtype_size(env_.stat);
  const size_t HDk = static_cast<size_t>(H_ * Dk_);
  proj_buf_ = env_.saved->take(N * static_cast<size_t>(Pqkv_) * act);
  go_buf_ = env_.saved->take(N * 2 * static_cast<size_t>(Dv_) * act);
  q_buf_ = env_.saved->take(N * HDk * act);
  k_buf_ = env_.saved->take(N * HDk * act);
  khat_buf_ = env_.saved->take(N * HDk * act);
  v_buf_ = env_.saved->take(N * static_cast<size_t>(Dv_) * act);
  gated_buf_ = env_.saved->take(N * static_cast<size_t>(Dv_) * act);
  z_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * sizeof(int32_t));
  rstd_buf_ = env_.saved->take(N * 2 * static_cast<size_t>(H_) * stat);
  lse_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * stat);
  err_buf_ = env_.saved->take(N * static_cast<size_t>(H_) * stat);
  if (env_.ctx.is_gpu()) {
    cache_buf_ = env_.saved->take(vq_attn_saved_cache_bytes(B, T, H_, Dvh_, S_, Lb_, env_.act, env_.documents));
    weights_buf_ = env_.saved->take(vq_attn_saved_weights_bytes(B, T, H_, S_, Lb_, env_.act, env_.documents));
  }
}

VqAttnOpts VqGauMixer::attn_opts(int64_t B, int64_t T, const Ctx& attn) const {
  VqAttnOpts o;
  o.block = Lb_;
  o.docs = env_.docs;
  // The placement's tables live at the workspace's start: keyed by that buffer, and by the scratch
  // pool's allocations, which would have moved or emptied it.
  if (env_.docs.defined() && attn.is_gpu())
    o.doc_blocks =
        &env_.docs_derived["vq_attn.doc_blocks " + std::to_string(reinterpret_cast<uintptr_t>(attn.workspace)) + " " +
                           std::to_string(env_.scratch->allocations())];
  // The same B, T and documents in a step's forward and backward: both use the saved cache and
  // weights, or neither (with documents, where reserve() sized them for documents).
  auto view = [](const SavedBuf& buf, size_t bytes) {
    return bytes <= buf.bytes() ? buf.tensor(DType::F32, {static_cast<int64_t>(bytes / sizeof(float))}) : Tensor();
  };
  const bool docs = env_.docs.defined();
  o.saved_cache = view(cache_buf_, vq_attn_saved_cache_bytes(B, T, H_, Dvh_, S_, Lb_, env_.act, docs));
  o.saved_weights = view(weights_buf_, vq_attn_saved_weights_bytes(B, T, H_, S_, Lb_, env_.act, docs));
  return o;
}

// Per head: the current block's quantized keys and values, and the compressive cache (per code
// a count and a value mean). Independent of T.
int64_t VqGauMixer::state_elems(int64_t T) const {
  (void)T;
  return H_ * (Lb_ * (Dk_ + Dvh_) + S_ * (Dvh_ + 1));
}

size_t VqGauMixer::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T), HDk = static_cast<size_t>(H_ * Dk_);
  // GPU: the op's saved cache and weights (VqAttnOpts), besides the unit's own activations.
  const size_t saved = env_.ctx.is_gpu()
                           ? vq_attn_saved_cache_bytes(B, T, H_, Dvh_, S_, Lb_, env_.act, env_.documents) +
                                 vq_attn_saved_weights_bytes(B, T, H_, S_, Lb_, env_.act, env_.documents)
                           : 0;
  return N * ((static_cast<size_t>(Pqkv_ + 4 * Dv_) + 3 * HDk) * dtype_size(env_.act) +
              static_cast<size_t>(H_) * (sizeof(int32_t) + 3 * dtype_size(env_.stat))) +
         saved;
}

double VqGauMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_), Dk = static_cast<double>(Dk_), Dvh = static_cast<double>(Dvh_);
  // Projections (2 FLOPs per weight per token forward, x3 with the backward); per head the scores
  // and weighted sums over the keys a query sees (the present block's causal half, the previous
  // block, the S cache entries, forward 2 (Dk + Dv) each, x3), the quantizer's distances.
  const double keys = std::min<double>(static_cast<double>(T), 1.5 * static_cast<double>(Lb_)) + static_cast<double>(S_);
  return 6.0 * (static_cast<double>(Pqkv_ + Dv_) * d + static_cast<double>(Dv_) * d) +
         static_cast<double>(H_) * (6.0 * keys * (Dk + Dvh) + 2.0 * static_cast<double>(S_) * Dk);
}

Tensor VqGauMixer::codebook() {
  const ParamStore& ps = *env_.params;
  Tensor c = env_.scratch->get("gau.codebook", env_.stat, {H_, S_, Dk_});
  vq_codebook_from_stats(env_.ctx, ps.buffer(c_sum_), ps.buffer(c_count_), c);
  return c;
}

Tensor VqGauMixer::rho() {
  const Tensor wr = env_.params->master(wr_);
  for (int64_t h = 0; h < H_; ++h)
    matmul(env_.ctx, sinusoids_, false, wr.slice0(h * Dk_, (h + 1) * Dk_), true, rho_->select(0, h));
  return rho_;
}

void VqGauMixer::queries_keys(const Tensor& proj, const Tensor& q, const Tensor& k, const Tensor& rstd) {
  const int64_t N = proj.size(0);
  for (int64_t i = 0; i < 2 * H_; ++i)
    srmsnorm_scaled_fwd(env_.ctx, proj.narrow(1, i * Dk_, Dk_), (i < H_ ? q : k).narrow(1, (i % H_) * Dk_, Dk_),
                        rstd.narrow(0, i * N, N), kNormEps, qk_scale_);
}

void VqGauMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T, HDk = H_ * Dk_;
  LINAC_CHECK(N <= capacity_, "VqGauMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvg_), x2 = x.view({N, d_});
  Tensor proj = proj_buf_.tensor(env_.act, {N, Pqkv_});
  Tensor go = go_buf_.tensor(env_.act, {N, 2 * Dv_});
  Tensor q = q_buf_.tensor(env_.act, {N, HDk}), k = k_buf_.tensor(env_.act, {N, HDk});
  Tensor khat = khat_buf_.tensor(env_.act, {B, T, H_, Dk_});
  Tensor z = z_buf_.tensor(DType::I32, {B, T, H_});
  Tensor rstd = rstd_buf_.tensor(env_.stat, {2 * H_ * N});
  Tensor lse = lse_buf_.tensor(env_.stat, {B, T, H_});
  Tensor err = err_buf_.tensor(env_.stat, {B, T, H_});
  // [Qr | Kr | V'] and V = SiLU(V') from one GEMM (its epilogue on Hopper), then G'.
  Tensor v = v_buf_.tensor(env_.act, {N, Dv_});
  silu_linear_fwd(ctx, x2, W.slice0(0, Pqkv_), proj, v, 2 * HDk);
  matmul(ctx, x2, false, W.slice0(Pqkv_, Pqkv_ + Dv_), true, go.narrow(1, 0, Dv_));
  queries_keys(proj, q, k, rstd);
  const Tensor C = codebook();
  {
    ProfileScope prof(ctx, "VQ quantizer", Profiler::Level::Op);
    vq_quantize(ctx, k.view({B, T, H_, Dk_}), C, z, khat, err);
  }
  const Tensor r = rho();
  {
    ProfileScope prof(ctx, "VQ-attention", Profiler::Level::Op);
    const Ctx actx = attn_ctx(B, T);
    vq_attn_fwd(actx, q.view({B, T, H_, Dk_}), khat, z, v.view({B, T, H_, Dvh_}), C, ps.master(u_), ps.master(vr_), r,
                bthd(go, B, T, Dv_, H_, Dvh_), lse, attn_opts(B, T, actx));
  }
  Tensor gated = gated_buf_.tensor(env_.act, {N, Dv_});
  swiglu_fwd(ctx, go, gated, GluAct::Silu);
  matmul_add(ctx, gated, false, ps.weight(wo_), true, addend_rows(add, N, d_), out.view({N, d_}));
  sum(ctx, err, err_sum_);
}

double VqGauMixer::aux_loss_sum() const { return opt_.beta * to_doubles(env_.ctx, err_sum_)[0]; }

void VqGauMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T, HDk = H_ * Dk_;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvg_), x2 = x.view({N, d_}), dy2 = dy.view({N, d_});
  const Tensor proj = proj_buf_.tensor(env_.act, {N, Pqkv_});
  const Tensor go = go_buf_.tensor(env_.act, {N, 2 * Dv_});
  const Tensor q = q_buf_.tensor(env_.act, {N, HDk}), k = k_buf_.tensor(env_.act, {N, HDk});
  const Tensor khat = khat_buf_.tensor(env_.act, {B, T, H_, Dk_});
  const Tensor z = z_buf_.tensor(DType::I32, {B, T, H_});
  const Tensor rstd = rstd_buf_.tensor(env_.stat, {2 * H_ * N});
  const Tensor lse = lse_buf_.tensor(env_.stat, {B, T, H_});

  // Output projection and gate: the gate's backward in the epilogue of d(o * g) = dy Wo where the
  // GPU allows (swiglu_linear.h), as the channel mixer's.
  const Tensor gated = gated_buf_.tensor(env_.act, {N, Dv_});
  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, gated, false, dwo.grad, 1.f, dwo.beta);
  Tensor dgo = env_.scratch->get("gau.dgo", env_.act, {N, 2 * Dv_});
  const Tensor dgated = swiglu_linear_bwd_writes_da(ctx, dy2, ps.weight(wo_), go, dgo)
                            ? env_.scratch->get("gau.dgated", env_.act, {N, Dv_})
                            : Tensor();
  // On the GPU the gate also sums d(o) o per 8 value dims, from which the op takes its delta
  // (VqAttnOpts::delta_units) instead of reading d(o) and o again.
  const Tensor dots =
      ctx.is_gpu() && Dvh_ % 8 == 0 ? env_.scratch->get("gau.dots", DType::F32, {N, Dv_ / 8}) : Tensor();
  swiglu_linear_bwd(ctx, dy2, ps.weight(wo_), go, dgated, dgo, GluAct::Silu, dots);

  // VQ-attention backward; straight-through keys (the commitment term joins dk in the keys' norm, below).
  const Tensor v = v_buf_.tensor(env_.act, {N, Dv_});
  const Tensor C = codebook();
  Tensor dq = env_.scratch->get("gau.dq", env_.act, {N, HDk}), dk = env_.scratch->get("gau.dk", env_.act, {N, HDk});
  // The op takes SiLU's derivative itself (v_pre) and writes dV' into the projection's gradient.
  Tensor dproj = env_.scratch->get("gau.dproj", env_.act, {N, Pqkv_});
  Tensor du = env_.scratch->get("gau.du", env_.stat, {H_, Dk_}), dvr = env_.scratch->get("gau.dvr", env_.stat, {H_, Dk_});
  Tensor drho = env_.scratch->get("gau.drho", env_.stat, {H_, Lb_ + 1, Dk_});
  const Tensor r = rho_;  // this step's forward made it from the same Wr
  const Ctx actx = attn_ctx(B, T);
  VqAttnOpts opts = attn_opts(B, T, actx);
  opts.v_pre = bthd(proj, B, T, 2 * HDk, H_, Dvh_);
  if (dots.defined()) opts.delta_units = dots.view({B, T, Dv_ / 8});
  {
    ProfileScope prof(ctx, "VQ-attention", Profiler::Level::Op);
    vq_attn_bwd(actx, q.view({B, T, H_, Dk_}), khat, z, v.view({B, T, H_, Dvh_}), C, ps.master(u_), ps.master(vr_), r,
                bthd(go, B, T, Dv_, H_, Dvh_), lse, bthd(dgo, B, T, Dv_, H_, Dvh_), dq.view({B, T, H_, Dk_}),
                dk.view({B, T, H_, Dk_}), bthd(dproj, B, T, 2 * HDk, H_, Dvh_), du, dvr, drho, opts);
  }
  add_inplace(ctx, ps.grad(u_), du, 1.f);
  add_inplace(ctx, ps.grad(vr_), dvr, 1.f);
  for (int64_t h = 0; h < H_; ++h)
    matmul(ctx, drho.select(0, h), true, sinusoids_, false, ps.grad(wr_).slice0(h * Dk_, (h + 1) * Dk_), 1.f, 1.f);

  // This step's codebook statistics (the backward runs only in training steps).
  Tensor sums = env_.scratch->get("gau.sums", env_.stat, {H_, S_, Dk_});
  Tensor counts = env_.scratch->get("gau.counts", env_.stat, {H_, S_});
  {
    ProfileScope prof(ctx, "VQ codebook statistics", Profiler::Level::Op);
    vq_code_stats(ctx, k.view({B, T, H_, Dk_}), z, sums, counts);
  }
  add_inplace(ctx, acc_sums_, sums, 1.f);
  add_inplace(ctx, acc_counts_, counts, 1.f);

  // Normalisations back into d[Qr|Kr] (dV' and dG' are in place). The keys' norm adds the
  // commitment term's gradient 2 beta (k - khat) to dk as it reads it (srmsnorm.h's pull).
  const double pull = 2.0 * opt_.beta * env_.grad_scale;
  for (int64_t i = 0; i < 2 * H_; ++i) {
    const int64_t h = i % H_;
    const Tensor target = i >= H_ && pull > 0 ? khat.view({N, HDk}).narrow(1, h * Dk_, Dk_) : Tensor();
    srmsnorm_scaled_bwd(ctx, proj.narrow(1, i * Dk_, Dk_), rstd.narrow(0, i * N, N),
                        (i < H_ ? dq : dk).narrow(1, h * Dk_, Dk_), dproj.narrow(1, i * Dk_, Dk_), qk_scale_,
                        /*accumulate=*/false, target, pull);
  }
  const Tensor dg = dgo.narrow(1, 0, Dv_);
  matmul(ctx, dproj, false, W.slice0(0, Pqkv_), false, dx.view({N, d_}));
  matmul(ctx, dg, false, W.slice0(Pqkv_, Pqkv_ + Dv_), false, dx.view({N, d_}), 1.f, 1.f);
  const ParamStore::GradWrite dw = ps.grad_write(wqkvg_);  // its two row blocks cover it
  matmul(ctx, dproj, true, x2, false, dw.grad.slice0(0, Pqkv_), 1.f, dw.beta);
  matmul(ctx, dg, true, x2, false, dw.grad.slice0(Pqkv_, Pqkv_ + Dv_), 1.f, dw.beta);
}

void VqGauMixer::update_buffers(const std::function<void(const Tensor&)>& sum_ranks) {
  const ParamStore& ps = *env_.params;
  sum_ranks(acc_sums_);
  sum_ranks(acc_counts_);
  vq_ema_update(env_.ctx, acc_sums_, acc_counts_, ps.buffer(c_sum_), ps.buffer(c_count_), opt_.gamma);
  zero_tensor(env_.ctx, acc_sums_);
  zero_tensor(env_.ctx, acc_counts_);
}

std::unique_ptr<MixerState> VqGauMixer::init_state(int64_t B) {
  auto st = std::make_unique<VqGauState>();
  const Device dev = env_.device();
  st->khat = OwnedTensor(env_.stat, dev, {B, H_, Lb_, Dk_});
  st->v = OwnedTensor(env_.stat, dev, {B, H_, Lb_, Dvh_});
  st->z = OwnedTensor(DType::I32, dev, {B, H_, Lb_});
  st->counts = OwnedTensor(env_.stat, dev, {B, H_, S_});
  st->means = OwnedTensor(env_.stat, dev, {B, H_, S_, Dvh_});
  vq_attn_state_reset(env_.ctx, st->view());
  st->codebook = OwnedTensor(env_.stat, dev, {H_, S_, Dk_});
  st->rho = OwnedTensor(env_.stat, dev, {H_, Lb_ + 1, Dk_});
  copy_tensor(env_.ctx, st->codebook, codebook());
  copy_tensor(env_.ctx, st->rho, rho());
  return st;
}

void VqGauMixer::start_document(MixerState& state, int64_t row) {
  vq_attn_state_start_document(env_.ctx, dynamic_cast<VqGauState&>(state).view(), row);
}

// The prompt through the block forward, then its keys, codes and values handed to the state at
// once (vq_attn_state_prefill: the state its steps would leave, each row keeping its last document).
void VqGauMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  auto& st = dynamic_cast<VqGauState&>(state);
  const int64_t B = x.size(0), T = x.size(1);
  LINAC_CHECK(st.counts->size(0) == B, "VqGauMixer::prefill: state was made for another batch size");
  forward(x, out);
  Ctx pctx = ctx;
  if (pctx.is_gpu()) {
    const size_t bytes = vq_attn_state_prefill_workspace_bytes(B, T, H_, S_);
    pctx.workspace =
        env_.scratch->get("vq_gau.prefill_workspace", DType::F32, {static_cast<int64_t>(bytes / 4 + 1)}).ptr;
    pctx.workspace_bytes = bytes;
  }
  vq_attn_state_prefill(pctx, khat_buf_.tensor(env_.act, {B, T, H_, Dk_}), z_buf_.tensor(DType::I32, {B, T, H_}),
                        v_buf_.tensor(env_.act, {B, T, H_, Dvh_}), st.view(), env_.docs);
}

void VqGauMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<VqGauState&>(state);
  const int64_t B = x_t.size(0), HDk = H_ * Dk_;
  LINAC_CHECK(st.counts->size(0) == B, "VqGauMixer::step: state was made for another batch size");
  LINAC_CHECK(env_.decode_pos.ptr, "VqGauMixer::step: runs inside Model::decode_step (env.decode_pos)");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  const Tensor W = ps.weight(wqkvg_), x2 = x_t.view({B, d_});
  Tensor proj = env_.scratch->get("gau.step.proj", env_.act, {B, Pqkv_});
  Tensor go = env_.scratch->get("gau.step.go", env_.act, {B, 2 * Dv_});
  Tensor q = env_.scratch->get("gau.step.q", env_.act, {B, HDk}), k = env_.scratch->get("gau.step.k", env_.act, {B, HDk});
  Tensor rstd = env_.scratch->get("gau.step.rstd", env_.stat, {2 * H_ * B});
  Tensor khat = env_.scratch->get("gau.step.khat", env_.act, {B, 1, H_, Dk_});
  Tensor z = env_.scratch->get("gau.step.z", DType::I32, {B, 1, H_});
  Tensor v = env_.scratch->get("gau.step.v", env_.act, {B, Dv_});
  Tensor gated = env_.scratch->get("gau.step.gated", env_.act, {B, Dv_});
  silu_linear_fwd(ctx, x2, W.slice0(0, Pqkv_), proj, v, 2 * HDk);
  matmul(ctx, x2, false, W.slice0(Pqkv_, Pqkv_ + Dv_), true, go.narrow(1, 0, Dv_));
  queries_keys(proj, q, k, rstd);
  vq_quantize(ctx, k.view({B, 1, H_, Dk_}), st.codebook, z, khat, Tensor());
  vq_attn_step(ctx, q.view({B, H_, Dk_}), khat.view({B, H_, Dk_}), z.view({B, H_}), v.view({B, H_, Dvh_}), st.codebook,
               ps.master(u_), ps.master(vr_), st.rho, st.view(), env_.decode_pos, bhd(go, Dv_, H_, Dvh_));
  swiglu_fwd(ctx, go, gated, GluAct::Silu);
  matmul(ctx, gated, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

}  // namespace linac
