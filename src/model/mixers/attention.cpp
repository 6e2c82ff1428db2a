#include "model/mixers/attention.h"

#include <algorithm>
#include <cmath>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "config/json_reader.h"
#include "core/profiler.h"
#include "matmul/matmul.h"
#include "model/mixers/proj_views.h"
#include "rope/rope.h"
#include "rope/rope_linear.h"

namespace linac {

namespace {
// Slots a full-attention cache starts with; it doubles whenever a token finds it full.
constexpr int64_t kInitialCacheSlots = 256;
}  // namespace

struct AttentionCache final : MixerState {
  // [B, S, Hk, Dh] post-RoPE keys and values of each row's current document: every token so far
  // (full attention), or the last `window` of them (sliding window, ring buffer).
  OwnedTensor k, v;
  std::vector<int64_t> pos;  // per row: tokens of its current document seen
  OwnedTensor done;          // [B, H] int32 zeros: attention_decode_step's block counters
};

AttentionMixerOptions AttentionMixerOptions::parse(const json& o, const std::string& path, const std::string& file,
                                                   bool sliding, int64_t n_heads) {
  AttentionMixerOptions opt;
  JsonReader r(o, path, file);
  opt.rope = r.get_bool("rope", opt.rope);
  for (const char* key : {"rope_base", "rope_scaling"})
    if (!opt.rope && r.present(key)) r.fail(key, "does not apply with \"rope\": false (no rotation to configure)");
  opt.rope_freqs.base = r.get_double("rope_base", opt.rope_freqs.base, 1.0, 1e12);
  if (r.present("rope_scaling")) {
    JsonReader s = r.child("rope_scaling");
    s.get_choice("type", "llama3", {"llama3"});
    RopeFreqs& f = opt.rope_freqs;
    f.factor = s.get_double("factor", 8.0, kScalingFactorMin, kScalingMax);
    f.low_freq_factor = s.get_double("low_freq_factor", f.low_freq_factor, kFreqFactorMin, kScalingMax);
    f.high_freq_factor = s.get_double("high_freq_factor", f.high_freq_factor, kFreqFactorMin, kScalingMax);
    f.original_context = static_cast<double>(
        s.get_int("original_max_position_embeddings", static_cast<int64_t>(f.original_context), 1, int64_t(1) << 40));
    if (f.high_freq_factor <= f.low_freq_factor)
      s.fail("high_freq_factor", "must be larger than low_freq_factor (" + number_text(f.low_freq_factor) + ")");
    s.finish();
  }
  opt.window = r.get_int("window", sliding ? 64 : 0, sliding ? 1 : 0, int64_t(1) << 30);
  opt.kv_heads = r.get_int("kv_heads", 0, 0, n_heads);
  if (opt.kv_heads > 0 && n_heads % opt.kv_heads != 0)
    r.fail("kv_heads", "must divide model.n_heads (" + std::to_string(n_heads) + "), got " +
                           std::to_string(opt.kv_heads));
  // One key/value head per query head is the default written out: the same mixer, so the same
  // options (a resume compares them).
  if (opt.kv_heads == n_heads) opt.kv_heads = 0;
  r.finish();
  return opt;
}

AttentionMixer::AttentionMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const AttentionMixerOptions& opt)
    : env_(env), opt_(opt), d_(cfg.d_model), H_(cfg.n_heads), Hk_(opt.key_value_heads(cfg.n_heads)),
      Dh_(cfg.head_dim()), q_cols_(H_ * Dh_), kv_cols_(Hk_ * Dh_) {
  if (opt_.rope && (Dh_ % 2 != 0 || Dh_ > kRopeMaxDim))
    throw UserError(cfg.source + ": model.n_heads: RoPE rotates pairs of a head's dims, so the head dim " +
                    "model.d_model / model.n_heads = " + std::to_string(Dh_) + " must be even and at most " +
                    std::to_string(kRopeMaxDim) + " (layer " + std::to_string(layer) + ", " + kind() +
                    "; or \"rope\": false)");
  if (env.ctx.is_gpu() && !attention_gpu_head_dim_ok(Dh_))
    throw UserError(
        cfg.source +
        ": model.n_heads: the GPU attention kernels need a head dim (model.d_model / model.n_heads) that is a "
        "multiple of 16 from 64 to "
        "128, got " +
        std::to_string(Dh_) + " (layer " + std::to_string(layer) + ", " + kind() + ")");
  const std::string p = "layers." + std::to_string(layer) + ".attn.";
  // Residual-branch output projections start smaller (GPT-2): std / sqrt(2 * n_layers).
  const double out_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  wqkv_ = env.params->add({p + "wqkv", {q_cols_ + 2 * kv_cols_, d_}, Init::Normal, cfg.init_std, true});
  wo_ = env.params->add({p + "wo", {d_, q_cols_}, Init::Normal, out_std, true});
}

void AttentionMixer::reserve(int64_t B, int64_t T) {
  B_ = B;
  T_ = T;
  if (env_.ctx.is_gpu()) {
    const size_t need = attention_bwd_workspace_bytes(B, T, H_, Dh_, opt_.rope);
    if (need > env_.ctx.workspace_bytes)
      throw UserError("attention backward needs " + std::to_string((need >> 20) + 1) +
                      " MiB of GPU workspace for micro-batches of " + std::to_string(B) + "x" + std::to_string(T) +
                      "; set LINAC_WORKSPACE_MB or use a smaller train.micro_batch");
  }
  qkv_buf_ = env_.saved->take(static_cast<size_t>(B * T * (q_cols_ + 2 * kv_cols_)) * dtype_size(env_.act));
  o_buf_ = env_.saved->take(static_cast<size_t>(B * T * q_cols_) * dtype_size(env_.act));
  lse_buf_ = env_.saved->take(static_cast<size_t>(B * H_ * T) * dtype_size(env_.stat));
}

// Keys and values of every past token (2 Hk Dh T), or of the last `window` ones.
int64_t AttentionMixer::state_elems(int64_t T) const {
  return 2 * kv_cols_ * (opt_.window > 0 ? std::min(T, opt_.window) : T);
}

size_t AttentionMixer::activation_bytes(int64_t B, int64_t T) const {
  return static_cast<size_t>(B * T) *
         (static_cast<size_t>(2 * q_cols_ + 2 * kv_cols_) * dtype_size(env_.act) +
          static_cast<size_t>(H_) * dtype_size(env_.stat));
}

double AttentionMixer::flops_per_token(int64_t T) const {
  const double d = static_cast<double>(d_);
  // Projections: 2 FLOPs per weight per token forward, x3 with the backward.
  const double proj = 6.0 * d * static_cast<double>(2 * q_cols_ + 2 * kv_cols_);
  // Scores and weighted sum over the keys a query sees (T/2 on average when causal), forward
  // 4*d per key (H Dh = d), x3 with the backward.
  double keys = (static_cast<double>(T) + 1.0) / 2.0;
  if (opt_.window > 0 && opt_.window < T) keys = static_cast<double>(opt_.window);
  return proj + 12.0 * d * keys;
}

// q, k and v: [B, T, heads, Dh] views of the columns of a [B*T, P] projection buffer.
struct QkvViews {
  Tensor q, k, v;
};
static QkvViews qkv_views(const Tensor& qkv, int64_t B, int64_t T, int64_t H, int64_t Hk, int64_t Dh) {
  return {bthd(qkv, B, T, 0, H, Dh), bthd(qkv, B, T, H * Dh, Hk, Dh), bthd(qkv, B, T, (H + Hk) * Dh, Hk, Dh)};
}

void AttentionMixer::forward(const Tensor& x, const Tensor& out, const Tensor& add) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T, P = q_cols_ + 2 * kv_cols_;
  LINAC_CHECK(B * T <= B_ * T_, "AttentionMixer: batch larger than reserved");
  const Ctx& ctx = env_.ctx;
  Tensor qkv = qkv_buf_.tensor(env_.act, {N, P});
  Tensor o = o_buf_.tensor(env_.act, {B, T, H_, Dh_});
  Tensor lse = lse_buf_.tensor(env_.stat, {B, H_, T});
  // q and k side by side: one rotation over H + Hk heads.
  rope_linear_fwd(ctx, x.view({N, d_}), env_.params->weight(wqkv_), qkv, T, opt_.rope ? q_cols_ + kv_cols_ : 0, Dh_,
                  opt_.rope_freqs, env_.docs);
  const QkvViews in = qkv_views(qkv, B, T, H_, Hk_, Dh_);
  AttentionOpts ao;
  ao.window = opt_.window;
  ao.docs = env_.docs;
  {
    ProfileScope prof(ctx, "attention", Profiler::Level::Op);
    attention_fwd(ctx, in.q, in.k, in.v, o, lse, ao);
  }
  matmul_add(ctx, o.view({N, q_cols_}), false, env_.params->weight(wo_), true, addend_rows(add, N, d_),
             out.view({N, d_}));
}

void AttentionMixer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = x.size(0), T = x.size(1), N = B * T, P = q_cols_ + 2 * kv_cols_;
  const Ctx& ctx = env_.ctx;
  ParamStore& ps = *env_.params;
  const QkvViews in = qkv_views(qkv_buf_.tensor(env_.act, {N, P}), B, T, H_, Hk_, Dh_);
  Tensor o = o_buf_.tensor(env_.act, {B, T, H_, Dh_});
  Tensor lse = lse_buf_.tensor(env_.stat, {B, H_, T});
  Tensor dy2 = dy.view({N, d_});

  Tensor d_o = env_.scratch->get("attn.do", env_.act, {B, T, H_, Dh_});
  matmul(ctx, dy2, false, ps.weight(wo_), false, d_o.view({N, q_cols_}));
  const ParamStore::GradWrite dwo = ps.grad_write(wo_);
  matmul(ctx, dy2, true, o.view({N, q_cols_}), false, dwo.grad, 1.f, dwo.beta);

  Tensor dqkv = env_.scratch->get("attn.dqkv", env_.act, {N, P});
  const QkvViews d = qkv_views(dqkv, B, T, H_, Hk_, Dh_);
  AttentionOpts ao;
  ao.window = opt_.window;
  ao.docs = env_.docs;
  if (opt_.rope) ao.rope = opt_.rope_freqs;  // dq, dk come back unrotated
  env_.open_comm_window();
  {
    ProfileScope prof(ctx, "attention", Profiler::Level::Op);
    attention_bwd(ctx, in.q, in.k, in.v, o, lse, d_o, d.q, d.k, d.v, ao);
  }

  matmul(ctx, dqkv, false, ps.weight(wqkv_), false, dx.view({N, d_}));
  const ParamStore::GradWrite dwqkv = ps.grad_write(wqkv_);
  matmul(ctx, dqkv, true, x.view({N, d_}), false, dwqkv.grad, 1.f, dwqkv.beta);
}

std::unique_ptr<MixerState> AttentionMixer::init_state(int64_t B) {
  auto st = std::make_unique<AttentionCache>();
  const int64_t slots = opt_.window > 0 ? opt_.window : kInitialCacheSlots;
  st->k = OwnedTensor(env_.act, env_.device(), {B, slots, Hk_, Dh_});
  st->v = OwnedTensor(env_.act, env_.device(), {B, slots, Hk_, Dh_});
  st->pos.assign(static_cast<size_t>(B), 0);
  st->done = OwnedTensor(DType::I32, env_.device(), {B, H_});
  zero_tensor(env_.ctx, st->done);
  return st;
}

// Full attention: grows the cache to hold at least n tokens per row, keeping each row's first
// `pos` (its current document).
static void reserve_slots(const Ctx& ctx, AttentionCache& st, int64_t n) {
  const int64_t B = st.k->size(0), S = st.k->size(1);
  if (n <= S) return;
  const int64_t grown = std::max(n, 2 * S);
  for (OwnedTensor* cache : {&st.k, &st.v}) {
    OwnedTensor bigger((*cache)->dtype, (*cache)->device, {B, grown, (*cache)->size(2), (*cache)->size(3)});
    for (int64_t b = 0; b < B; ++b) {
      const int64_t keep = st.pos[static_cast<size_t>(b)];
      if (keep > 0) copy_tensor(ctx, bigger->select(0, b).narrow(0, 0, keep), (*cache)->select(0, b).narrow(0, 0, keep));
    }
    *cache = std::move(bigger);
  }
}

void AttentionMixer::start_document(MixerState& state, int64_t row) {
  dynamic_cast<AttentionCache&>(state).pos[static_cast<size_t>(row)] = 0;
}

void AttentionMixer::step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
  auto& st = dynamic_cast<AttentionCache&>(state);
  const int64_t B = x_t.size(0);
  LINAC_CHECK(st.k->size(0) == B, "AttentionMixer::step: state was made for another batch size");
  LINAC_CHECK(env_.decode_pos.ptr, "AttentionMixer::step: runs inside Model::decode_step (env.decode_pos)");
  const Ctx& ctx = env_.ctx;
  const ParamStore& ps = *env_.params;
  Tensor qkv = env_.scratch->get("attn.step.qkv", env_.act, {B, q_cols_ + 2 * kv_cols_});
  Tensor o = env_.scratch->get("attn.step.o", env_.act, {B, q_cols_});
  matmul(ctx, x_t.view({B, d_}), false, ps.weight(wqkv_), true, qkv);
  Ctx step_ctx = ctx;
  if (step_grows(st)) {
    reserve_slots(ctx, st, *std::max_element(st.pos.begin(), st.pos.end()) + 1);
    // The step reads cached slots before its dependent-launch wait (cuda_common.cuh); those
    // loads must not race the copies that just filled the grown cache, whatever form the driver
    // gives them: this step launches in plain stream order.
    step_ctx.dependent_launches = false;
  }
  // Every row at its own document position, read on the device (env.decode_pos mirrors st.pos).
  attention_decode_step(step_ctx, bhd(qkv, 0, H_, Dh_), bhd(qkv, q_cols_, Hk_, Dh_), bhd(qkv, q_cols_ + kv_cols_, Hk_, Dh_),
                        env_.decode_pos, st.k, st.v, opt_.rope ? opt_.rope_freqs : RopeFreqs(), opt_.window,
                        o.view({B, H_, Dh_}), st.done);
  advance(st);
  matmul(ctx, o, false, ps.weight(wo_), true, out_t.view({B, d_}));
}

bool AttentionMixer::step_grows(const MixerState& state) const {
  const auto& st = dynamic_cast<const AttentionCache&>(state);
  return opt_.window == 0 && *std::max_element(st.pos.begin(), st.pos.end()) + 1 > st.k->size(1);
}

void AttentionMixer::reserve_state(MixerState& state, int64_t tokens) {
  if (opt_.window == 0) reserve_slots(env_.ctx, dynamic_cast<AttentionCache&>(state), tokens);
}

void AttentionMixer::advance(MixerState& state) {
  for (int64_t& p : dynamic_cast<AttentionCache&>(state).pos) ++p;
}

void AttentionMixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  auto& st = dynamic_cast<AttentionCache&>(state);
  const int64_t B = x.size(0), T = x.size(1);
  LINAC_CHECK(st.k->size(0) == B, "AttentionMixer::prefill: state was made for another batch size");
  LINAC_CHECK(std::all_of(st.pos.begin(), st.pos.end(), [](int64_t p) { return p == 0; }),
              "AttentionMixer::prefill: the state must be fresh");
  forward(x, out);
  // forward left the post-RoPE keys and values of the prompt in qkv_buf_; each row keeps those of
  // its last document.
  const QkvViews in = qkv_views(qkv_buf_.tensor(env_.act, {B * T, q_cols_ + 2 * kv_cols_}), B, T, H_, Hk_, Dh_);
  const Tensor& k = in.k;
  const Tensor& v = in.v;
  if (opt_.window == 0) reserve_slots(ctx, st, T);  // before the rows' positions: nothing to keep yet
  st.pos = last_doc_lengths(env_, B, T);
  // Rows [b0, b0 + n), whose last document starts at s: its tokens, or a window's last `window` of
  // them, go into the cache in one call, token t into slot t - s (mod the window).
  auto hand_over = [&](int64_t b0, int64_t n, int64_t s) {
    const int64_t first = opt_.window > 0 ? std::max(s, T - opt_.window) : s;
    const int64_t slot = opt_.window > 0 ? (first - s) % opt_.window : 0;
    attention_cache_write(ctx, k.narrow(0, b0, n).narrow(1, first, T - first),
                          v.narrow(0, b0, n).narrow(1, first, T - first), st.k->narrow(0, b0, n),
                          st.v->narrow(0, b0, n), slot);
  };
  if (rows_agree(st.pos)) {
    hand_over(0, B, T - st.pos[0]);
  } else {
    for (int64_t b = 0; b < B; ++b) hand_over(b, 1, T - st.pos[static_cast<size_t>(b)]);
  }
}

}  // namespace linac
