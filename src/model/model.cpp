#include "model/model.h"

#include <algorithm>

#include "core/profiler.h"
#include "elementwise/elementwise.h"
#include "embedding/embedding.h"
#include "model/channel/swiglu_mlp.h"
#include "model/layer_plan.h"
#include "reduce/reduce.h"
#include "rmsnorm/rmsnorm.h"
#include "srmsnorm/srmsnorm.h"

namespace linac {

Precision Precision::resolve(Device device, const std::string& precision, bool bf16_residual) {
  if (device == Device::CUDA) {
    if (precision == "bf16") return {DType::F32, DType::BF16, bf16_residual ? DType::BF16 : DType::F32, DType::F32};
    if (precision == "fp32") return {DType::F32, DType::F32, DType::F32, DType::F32};
    throw UserError("train.precision '" + precision + "' is not available on the GPU (use bf16 or fp32)");
  }
  // The CPU computes in the master dtype: bf16 configs run in fp32 there.
  if (precision == "fp64") return {DType::F64, DType::F64, DType::F64, DType::F64};
  return {DType::F32, DType::F32, DType::F32, DType::F32};
}

const char* precision_in_effect(DType act) { return act == DType::BF16 ? "bf16" : act == DType::F64 ? "fp64" : "fp32"; }

ModelOptions ModelOptions::for_training(const Config& cfg, int rank, int world) {
  const TrainConfig& tc = cfg.train;
  const bool zero = tc.zero > 0 && world > 1;
  // A dtype key of auto | f32 | bf16 whose auto means bf16 under bf16 precision.
  auto bf16 = [&](const std::string& key) { return key == "bf16" || (key == "auto" && tc.precision == "bf16"); };
  return {.precision = tc.precision,
          .with_optimizer = true,
          .zero_world = zero ? world : 1,
          .zero_rank = zero ? rank : 0,
          .zero_grads = zero && tc.zero == 2,
          .bf16_logits = bf16(tc.logits_dtype),
          .bf16_residual = bf16(tc.residual_dtype),
          .documents = cfg.data.packing == "document"};
}

Model::Model(const ModelConfig& cfg, const Ctx& ctx, const ModelOptions& opts)
    : cfg_(cfg), scratch_(ctx.device), saved_(ctx.device) {
  const Precision p = Precision::resolve(ctx.device, opts.precision, opts.bf16_residual);
  env_.ctx = ctx;
  env_.params = &params_;
  env_.act = p.act;
  env_.resid = p.resid;
  env_.stat = p.stat;
  env_.documents = opts.documents;
  bf16_logits_ = opts.bf16_logits && p.act == DType::BF16;
  env_.scratch = &scratch_;
  env_.saved = &saved_;

  const std::vector<LayerSpec> plan = resolve_layers(cfg, "config");
  const int64_t d = cfg.d_model;
  simple_norm_ = model_norm(cfg) == "srmsnorm";
  embed_scale_ = model_embed_scale(cfg);
  const std::string channel_mixer = model_channel_mixer(cfg);
  const GluAct glu = channel_mixer == "sglu" ? GluAct::Identity : GluAct::Silu;
  has_mlp_ = channel_mixer != "none";
  auto add_norm = [&](const std::string& name) {
    return simple_norm_ ? -1 : params_.add({name, {d}, Init::Ones, 0, false, {}, true});
  };
  embed_ = params_.add({"embed.weight", {cfg.vocab_size, d}, Init::Normal,
                        cfg.embed_init_std > 0 ? cfg.embed_init_std : cfg.init_std, false, {}, true});
  blocks_.resize(static_cast<size_t>(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    Block& b = blocks_[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    const int first = params_.count();
    b.norm1 = add_norm(p + "norm1.weight");
    const LayerSpec& spec = plan[static_cast<size_t>(l)];
    b.mixer = find_mixer_kind(spec.kind, spec.path, "config").make(env_, cfg, l, spec);
    b.mixer_fwd = "token mixer forward (" + spec.kind + ")";
    b.mixer_bwd = "token mixer backward (" + spec.kind + ")";
    if (has_mlp_) {
      b.norm2 = add_norm(p + "norm2.weight");
      b.mlp = std::make_unique<SwiGluMlp>(env_, cfg, l, glu);
    }
    for (int id = first; id < params_.count(); ++id) b.param_ids.push_back(id);
  }
  if (cfg.final_norm) norm_f_ = add_norm("norm_f.weight");
  if (!cfg.tie_embeddings) head_ = params_.add({"head.weight", {cfg.vocab_size, d}, Init::Normal, cfg.init_std, true});
  if (cfg.head_bias) head_bias_ = params_.add({"head.bias", {cfg.vocab_size}, Init::Zeros, 0, false, {}, true});
  if (opts.zero_world > 1) params_.shard(opts.zero_rank, opts.zero_world, opts.zero_grads);
  if (opts.allocate)
    params_.allocate(ctx.device, p.master, p.act, opts.with_optimizer);
  else
    params_.plan();
}

Model::~Model() = default;

void Model::init_params(uint64_t seed) { params_.init(seed, env_.ctx); }

int64_t Model::n_embedding_params() const {
  int64_t n = params_.numel(embed_);
  if (head_ >= 0) n += params_.numel(head_);
  if (head_bias_ >= 0) n += params_.numel(head_bias_);
  return n;
}

void Model::set_recompute(Recompute r) {
  recompute_ = r;
  if (B_ > 0) reserve(B_, T_);
}

void Model::reserve(int64_t B, int64_t T) {
  ++reserves_;
  B_ = B;
  T_ = T;
  const int64_t N = B * T, d = cfg_.d_model;
  const Device dev = env_.device();
  const size_t rows = static_cast<size_t>(N);
  const size_t resid_bytes = rows * static_cast<size_t>(d) * dtype_size(env_.resid);
  const size_t act_bytes = rows * static_cast<size_t>(d) * dtype_size(env_.act), stat_bytes = rows * dtype_size(env_.stat);
  // Block inputs R[2l] stay private; everything a block saves goes into a shared group when the
  // backward recomputes it (the mixer's part only, or the whole block).
  const int per_layer = has_mlp_ ? 2 : 1;
  saved_.clear();
  saved_.begin_group(false);
  resid_.assign(static_cast<size_t>(per_layer * cfg_.n_layers + 1), SavedBuf());
  resid_[0] = saved_.take(resid_bytes);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    saved_.begin_group(recompute_ == Recompute::Block);
    b.xn1 = saved_.take(act_bytes);
    b.rstd1 = saved_.take(stat_bytes);
    if (recompute_ == Recompute::Mixer) saved_.begin_group(true);
    b.mixer->reserve(B, T);
    if (recompute_ == Recompute::Mixer) saved_.begin_group(false);
    if (b.mlp) {
      // Under block recompute R[2l+1] shares the region with block l+1's saves, after block l's
      // xn1 and rstd1: block l+1's first norm reads it while writing its own xn1 and rstd1, which
      // lie before it.
      resid_[per_layer * l + 1] = saved_.take(resid_bytes);
      b.xn2 = saved_.take(act_bytes);
      b.rstd2 = saved_.take(stat_bytes);
      b.mlp->reserve(B, T);
    }
    saved_.begin_group(false);
    resid_[per_layer * (l + 1)] = saved_.take(resid_bytes);
  }
  if (head_bias_ >= 0) {
    const DType logit_dt = decode_logit_dtype();
    OwnedTensor host(DType::F64, Device::CPU, {N});
    std::fill_n(host->data<double>(), N, 1.0);
    ones_logit_ = Buffer(static_cast<size_t>(N) * dtype_size(logit_dt), dev);
    copy_tensor(ones_logit_.tensor(logit_dt, {N}), to(host, Device::CPU, logit_dt));
    ones_act_ = Buffer(static_cast<size_t>(N) * dtype_size(env_.act), dev);
    copy_tensor(ones_act_.tensor(env_.act, {N}), to(host, Device::CPU, env_.act));
  }
  xf_ = saved_.take(act_bytes);
  rstd_f_ = saved_.take(stat_bytes);
  losses_ = saved_.take(stat_bytes);
  saved_.allocate();
}

int64_t Model::state_elems(int64_t T) const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += b.mixer->state_elems(T);
  return n;
}

size_t Model::activation_bytes(int64_t B, int64_t T) const {
  const size_t N = static_cast<size_t>(B * T), d = static_cast<size_t>(cfg_.d_model);
  const size_t resid_row = N * d * dtype_size(env_.resid), norm = N * (d * dtype_size(env_.act) + dtype_size(env_.stat));
  // Block inputs and the final norm's output, rstd and losses are always kept.
  size_t keep = (static_cast<size_t>(cfg_.n_layers) + 1) * resid_row + N * (d * dtype_size(env_.act) + 2 * dtype_size(env_.stat));
  size_t shared = 0;
  for (const auto& b : blocks_) {
    const size_t mixer = b.mixer->activation_bytes(B, T);
    const size_t block = norm + mixer + (b.mlp ? resid_row + norm + b.mlp->activation_bytes(B, T) : 0);
    switch (recompute_) {
      case Recompute::None: keep += block; break;
      case Recompute::Mixer: keep += block - mixer, shared = std::max(shared, mixer); break;
      case Recompute::Block: shared = std::max(shared, block); break;
    }
  }
  return keep + shared;
}

double Model::flops_per_token(int64_t T) const {
  double f = 0;
  for (const auto& b : blocks_) f += b.mixer->flops_per_token(T) + (b.mlp ? b.mlp->flops_per_token(T) : 0.0);
  return f + 6.0 * static_cast<double>(cfg_.vocab_size * cfg_.d_model);  // LM head
}

std::vector<Model::LayerRow> Model::layer_table() const {
  std::vector<LayerRow> rows;
  auto count_prefix = [&](const std::string& prefix) {
    int64_t n = 0;
    for (int i = 0; i < params_.count(); ++i)
      if (params_.spec(i).name.rfind(prefix, 0) == 0) n += params_.numel(i);
    return n;
  };
  rows.push_back({"embed", "embedding", params_.numel(embed_)});
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    rows.push_back({p + "mixer", blocks_[l].mixer->kind(), count_prefix(p) - count_prefix(p + "mlp.")});
    if (blocks_[l].mlp) rows.push_back({p + "mlp", blocks_[l].mlp->kind(), count_prefix(p + "mlp.")});
  }
  if (cfg_.final_norm)
    rows.push_back({"norm_f", simple_norm_ ? "srmsnorm" : "rmsnorm", norm_f_ >= 0 ? params_.numel(norm_f_) : 0});
  if (head_ >= 0 || head_bias_ >= 0)
    rows.push_back({"head", head_bias_ >= 0 ? "linear + bias" : "linear",
                    (head_ >= 0 ? params_.numel(head_) : 0) + (head_bias_ >= 0 ? params_.numel(head_bias_) : 0)});
  return rows;
}

void Model::norm_fwd(int id, const Tensor& x, const Tensor& y, const Tensor& rstd, const Tensor& add,
                     const Tensor& h) const {
  const double eps = cfg_.norm_eps;
  if (id >= 0) return rmsnorm_fwd(env_.ctx, x, params_.master(id), y, rstd, eps, add, h);
  srmsnorm_fwd(env_.ctx, x, y, rstd, eps, add, h);
}

void Model::norm_bwd(int id, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                     const Tensor& dx_copy) const {
  if (id >= 0) return rmsnorm_bwd(env_.ctx, x, params_.master(id), rstd, dy, dx, params_.grad(id), dx_copy);
  srmsnorm_bwd(env_.ctx, x, rstd, dy, dx, /*accumulate=*/true);
  if (dx_copy.ptr) cast(env_.ctx, dx_copy, dx);
}

double Model::aux_loss_sum() const {
  double sum = 0;
  for (const auto& b : blocks_) sum += b.mixer->aux_loss_sum();
  return sum;
}

void Model::update_buffers(const std::function<void(const Tensor&)>& sum_ranks) {
  for (auto& b : blocks_) b.mixer->update_buffers(sum_ranks);
}

void Model::recompute_block(int l, int64_t B, int64_t T) {
  Block& b = blocks_[static_cast<size_t>(l)];
  const int64_t N = B * T, d = cfg_.d_model;
  const Tensor r0 = resid(2 * l, B, T), xn1 = b.xn1.tensor(env_.act, {B, T, d});
  norm_fwd(b.norm1, r0.view({N, d}), xn1.view({N, d}), b.rstd1.tensor(env_.stat, {N}));
  // R[2l+2] is the next block's input, kept: the last sub-layer's output is not needed.
  Tensor y = scratch_.get("model.y", env_.act, {B, T, d});
  if (!b.mlp) return b.mixer->forward(xn1, y);
  // R[2l+1] is among the block's saved buffers: written again as the forward wrote it (same bits).
  const Tensor xn2 = b.xn2.tensor(env_.act, {B, T, d}), r1 = resid(2 * l + 1, B, T);
  if (gemm_adds_residual()) {
    b.mixer->forward(xn1, r1, r0);
    norm_fwd(b.norm2, r1.view({N, d}), xn2.view({N, d}), b.rstd2.tensor(env_.stat, {N}));
  } else {
    b.mixer->forward(xn1, y);
    norm_fwd(b.norm2, r0.view({N, d}), xn2.view({N, d}), b.rstd2.tensor(env_.stat, {N}), y.view({N, d}),
             r1.view({N, d}));
  }
  b.mlp->forward(xn2, y);
}

Tensor Model::resid(int i, int64_t B, int64_t T) const {
  // Without channel mixers R[2l+2] (after the MLP) is R[2l+1] (after the mixer).
  const int slot = has_mlp_ ? i : (i + 1) / 2;
  return resid_[static_cast<size_t>(slot)].tensor(env_.resid, {B, T, cfg_.d_model});
}

void Model::final_norm_fwd(const Tensor& x, const Tensor& y, const Tensor& rstd, const Tensor& add,
                           const Tensor& h) const {
  if (cfg_.final_norm) return norm_fwd(norm_f_, x, y, rstd, add, h);
  if (!add.ptr) return cast(env_.ctx, y, x);
  copy_tensor(env_.ctx, h, x);
  add_inplace(env_.ctx, h, add, 1.f);
  cast(env_.ctx, y, h);
}

std::string Model::mixer_without_documents() const {
  for (const Block& b : blocks_)
    if (!b.mixer->supports_documents() || (b.mlp && !b.mlp->supports_documents()))
      return b.mixer->supports_documents() ? b.mlp->kind() : b.mixer->kind();
  return "";
}

void Model::check_documents() const {
  if (const std::string kind = mixer_without_documents(); !kind.empty())
    throw UserError("data.packing \"document\": the '" + kind +
                    "' mixer does not support document packing yet; use \"stream\" for this architecture");
}

// Sets env_.docs from a [2, B, T] bounds tensor for the scope of one pass.
class Model::DocScope {
 public:
  DocScope(Model& m, const Tensor& docs, int64_t B, int64_t T) : env_(m.env_) {
    if (!docs.ptr) return;
    LINAC_CHECK(docs.dtype == DType::I32 && docs.ndim == 3 && docs.size(0) == 2 && docs.size(1) == B &&
                    docs.size(2) == T && docs.is_contiguous() && docs.device == m.env_.device(),
                "Model: document bounds must be [2, B, T] int32 on the model's device, got " + docs.shape_str());
    m.check_documents();
    env_.docs = {docs.data<int32_t>(), docs.data<int32_t>() + B * T};
    env_.docs_derived.clear();
  }
  ~DocScope() {
    env_.docs = {};
    env_.docs_derived.clear();
  }
  DocScope(const DocScope&) = delete;
  DocScope& operator=(const DocScope&) = delete;

 private:
  ModelEnv& env_;
};

double Model::forward_backward(const Tensor& tokens, const Tensor& targets, float grad_scale, double* hits,
                               const Tensor& docs) {
  launch_forward_backward(tokens, targets, grad_scale, docs, hits);
  return read_loss_sum();
}

double Model::read_loss_sum() { return to_doubles(env_.ctx, scratch_.get("model.loss_sum", env_.stat, {1}))[0]; }

bool Model::training_graph_safe(bool documents) const {
  return std::all_of(blocks_.begin(), blocks_.end(), [documents](const Block& b) {
    return b.mixer->graph_safe_training(documents) && (!b.mlp || b.mlp->graph_safe_training(documents));
  });
}

void Model::launch_forward_backward(const Tensor& tokens, const Tensor& targets, float grad_scale, const Tensor& docs,
                                    double* hits) {
  const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, d = cfg_.d_model;
  LINAC_CHECK(B <= B_ && T <= T_ && N <= B_ * T_, "Model: reserve() a larger batch first");
  LINAC_CHECK(tokens.dtype == DType::I32 && targets.dtype == DType::I32, "Model: tokens must be i32");
  const DocScope doc_scope(*this, docs, B, T);
  last_tokens_ = N;
  const Ctx& ctx = env_.ctx;
  const bool backward = grad_scale != 0.f;
  env_.grad_scale = grad_scale;
  const int L = static_cast<int>(cfg_.n_layers);
  auto act = [&](const SavedBuf& b) { return b.tensor(env_.act, {B, T, d}); };
  auto stat = [&](const SavedBuf& b) { return b.tensor(env_.stat, {N}); };

  {
    ProfileScope prof(ctx, "embedding");
    embedding_fwd(ctx, tokens.view({N}), params_.master(embed_), resid(0, B, T).view({N, d}));
    if (embed_scale_ != 1) scale_inplace(ctx, resid(0, B, T), embed_scale_);
  }
  // Sub-layer i reads Norm(R[i]) and adds its output to the stream: R[i+1] = R[i] + out. Where
  // the stream has the activation dtype, its output projection writes R[i+1] with R[i] added in
  // the GEMM's epilogue (Mixer::forward's `add`); otherwise it writes y, and the next norm adds y
  // to R[i] in the same pass as it normalises the sum.
  Tensor y = scratch_.get("model.y", env_.act, {N, d});
  Tensor prev;  // R[i] while sub-layer i's output is pending in y
  auto norm_in = [&](int id, int i, const Tensor& xn, const Tensor& rstd) {
    ProfileScope prof(ctx, "norms and residual adds");
    const Tensor r = resid(i, B, T).view({N, d});
    if (prev.ptr)
      norm_fwd(id, prev, xn.view({N, d}), rstd, y, r);
    else
      norm_fwd(id, r, xn.view({N, d}), rstd);
    prev = Tensor();
  };
  auto sublayer = [&](Mixer& m, int i, const Tensor& xn) {
    if (gemm_adds_residual()) return m.forward(xn, resid(i + 1, B, T), resid(i, B, T));
    m.forward(xn, y.view({B, T, d}));
    prev = resid(i, B, T).view({N, d});
  };
  for (int l = 0; l < L; ++l) {
    Block& b = blocks_[static_cast<size_t>(l)];
    norm_in(b.norm1, 2 * l, act(b.xn1), stat(b.rstd1));
    {
      ProfileScope prof(ctx, b.mixer_fwd.c_str());
      sublayer(*b.mixer, 2 * l, act(b.xn1));
    }
    if (!b.mlp) continue;
    norm_in(b.norm2, 2 * l + 1, act(b.xn2), stat(b.rstd2));
    ProfileScope prof(ctx, "channel mixer forward");
    sublayer(*b.mlp, 2 * l + 1, act(b.xn2));
  }
  Tensor rl = resid(2 * L, B, T).view({N, d});
  Tensor xf = xf_.tensor(env_.act, {N, d});
  {
    ProfileScope prof(ctx, "norms and residual adds");
    if (prev.ptr)
      final_norm_fwd(prev, xf, stat(rstd_f_), y, rl);
    else
      final_norm_fwd(rl, xf, stat(rstd_f_));
  }

  Tensor losses = stat(losses_);
  Tensor dxf = backward ? scratch_.get("model.dxn", env_.act, {N, d}) : Tensor();
  Tensor loss_sum = scratch_.get("model.loss_sum", env_.stat, {1});
  const std::vector<int> head_group = backward ? head_grad_group() : std::vector<int>();
  {
    ProfileScope prof(ctx, "LM head and loss, forward and backward");
    const Tensor hit_rows = hits ? scratch_.get("model.hits", env_.stat, {N}) : Tensor();
    if (backward && grad_begin_) grad_begin_(head_group);
    run_head(xf, targets.view({N}), grad_scale, dxf, losses, hit_rows);
    sum(ctx, losses, loss_sum);
    if (hits) {
      Tensor hit_sum = scratch_.get("model.hit_sum", env_.stat, {1});
      sum(ctx, hit_rows, hit_sum);
      *hits = to_doubles(ctx, hit_sum)[0];
    }
  }
  if (!backward) return;

  // Backward: dr holds dL/dR[i] as i walks down; norms add their input gradient into it. The
  // sub-layers read it as dy, in the activation dtype: a copy each norm's backward writes.
  Tensor dr = scratch_.get("model.dr", env_.resid, {N, d});
  Tensor dy = env_.act == env_.resid ? dr : scratch_.get("model.dy", env_.act, {N, d});
  const Tensor dy_copy = dy.ptr != dr.ptr ? dy : Tensor();
  {
    ProfileScope prof(ctx, "norms and residual adds");
    if (cfg_.final_norm) {
      zero_tensor(ctx, dr);
      norm_bwd(norm_f_, rl, stat(rstd_f_), dxf, dr, dy_copy);
    } else {
      cast(ctx, dr, dxf);
      if (dy_copy.ptr) cast(ctx, dy_copy, dr);
    }
  }
  if (!head_group.empty()) grads_ready(head_group, L - 1);
  Tensor dxn = scratch_.get("model.dxn", env_.act, {N, d});
  for (int l = L - 1; l >= 0; --l) {
    Block& b = blocks_[static_cast<size_t>(l)];
    if (recompute_ == Recompute::Block) {
      ProfileScope prof(ctx, "recompute (the block's forward)");
      recompute_block(l, B, T);
    }
    if (grad_begin_) grad_begin_(b.param_ids);
    if (b.mlp) {
      {
        ProfileScope prof(ctx, "channel mixer backward");
        b.mlp->backward(act(b.xn2), dy.view({B, T, d}), dxn.view({B, T, d}));
      }
      ProfileScope prof(ctx, "norms and residual adds");
      norm_bwd(b.norm2, resid(2 * l + 1, B, T).view({N, d}), stat(b.rstd2), dxn, dr, dy_copy);
    }
    {
      ProfileScope prof(ctx, b.mixer_bwd.c_str());
      if (recompute_ == Recompute::Mixer) b.mixer->forward(act(b.xn1), scratch_.get("model.y", env_.act, {B, T, d}));
      b.mixer->backward(act(b.xn1), dy.view({B, T, d}), dxn.view({B, T, d}));
    }
    {
      ProfileScope prof(ctx, "norms and residual adds");
      // The embedding's backward reads dr itself.
      norm_bwd(b.norm1, resid(2 * l, B, T).view({N, d}), stat(b.rstd1), dxn, dr, l > 0 ? dy_copy : Tensor());
    }
    grads_ready(b.param_ids, l - 1);
  }
  {
    ProfileScope prof(ctx, "embedding");
    if (embed_scale_ != 1) scale_inplace(ctx, dr, embed_scale_);
    embedding_bwd(ctx, tokens.view({N}), dr, params_.grad(embed_));
  }
  grads_ready({embed_}, -1);
  params_.end_grad_pass(true);
}

std::vector<double> Model::token_losses() const {
  return to_doubles(env_.ctx, losses_.tensor(env_.stat, {last_tokens_}));
}

std::vector<int> Model::head_grad_group() const {
  std::vector<int> g;
  for (int id : {norm_f_, head_, head_bias_})
    if (id >= 0) g.push_back(id);
  return g;
}

std::vector<std::vector<int>> Model::grad_groups() const {
  std::vector<std::vector<int>> g{head_grad_group()};
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) g.push_back(b->param_ids);
  g.push_back({embed_});
  return g;
}

void Model::grads_ready(const std::vector<int>& ids, int next) const {
  if (grad_ready_) grad_ready_(ids, next >= 0 && blocks_[static_cast<size_t>(next)].mixer->opens_comm_window());
}

Model::DecodeState Model::init_decode(int64_t B, int64_t capacity) {
  LINAC_CHECK(B >= 1, "Model::init_decode: B must be positive");
  LINAC_CHECK(capacity >= 0, "Model::init_decode: capacity must be >= 0");
  // The position-wise MLP decodes through its forward on [B, 1, d], within the reserved capacity.
  if (B_ * T_ < B) reserve(B, 1);
  DecodeState st;
  st.B = B;
  for (auto& b : blocks_) {
    st.layers.push_back(b.mixer->init_state(B));
    if (capacity > 0) b.mixer->reserve_state(*st.layers.back(), capacity);
  }
  const size_t rows = static_cast<size_t>(B), d = static_cast<size_t>(cfg_.d_model);
  st.x = Buffer(rows * d * dtype_size(env_.resid), env_.device());
  st.x2 = Buffer(rows * d * dtype_size(env_.resid), env_.device());
  st.xn = Buffer(rows * d * dtype_size(env_.act), env_.device());
  st.rstd = Buffer(rows * dtype_size(env_.stat), env_.device());
  st.y = Buffer(rows * d * dtype_size(env_.act), env_.device());
  st.positions = Buffer(rows * sizeof(int32_t), env_.device());
  zero_tensor(env_.ctx, st.positions_tensor());
  return st;
}

void Model::decode_step(DecodeState& st, const Tensor& tokens_t, const Tensor& logits_out) {
  const int64_t B = st.B, d = cfg_.d_model;
  LINAC_CHECK(tokens_t.dtype == DType::I32 && tokens_t.numel() == B, "Model::decode_step: tokens must be [B] int32");
  LINAC_CHECK(logits_out.ndim == 2 && logits_out.size(0) == B && logits_out.size(1) == cfg_.vocab_size,
              "Model::decode_step: logits must be [B, vocab], got " + logits_out.shape_str());
  // The step's kernels are short and launched back to back: let those that support it start
  // before the kernel ahead of them ends (Ctx::dependent_launches), for the step only.
  struct DependentLaunches {
    Ctx& ctx;
    ~DependentLaunches() { ctx.dependent_launches = false; }
  } dependent{env_.ctx};
  env_.ctx.dependent_launches = dependent_launches_available(env_.ctx);
  const Ctx& ctx = env_.ctx;
  Tensor x = st.x.tensor(env_.resid, {B, d}), x_next = st.x2.tensor(env_.resid, {B, d});
  Tensor xn = st.xn.tensor(env_.act, {B, d}), rstd = st.rstd.tensor(env_.stat, {B}), y = st.y.tensor(env_.act, {B, d});
  embedding_fwd(ctx, tokens_t.view({B}), params_.master(embed_), x);
  if (embed_scale_ != 1) scale_inplace(ctx, x, embed_scale_);
  env_.decode_pos = st.positions_tensor();
  // As in the training forward, each norm adds the pending sub-layer output y to the stream in its
  // own pass (x_next = x + y), so the stream alternates between the two buffers.
  bool pending = false;
  auto add_norm = [&](int id) {
    if (!pending) return norm_fwd(id, x, xn, rstd);
    norm_fwd(id, x, xn, rstd, y, x_next);
    std::swap(x, x_next);
  };
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    add_norm(b.norm1);
    b.mixer->step(*st.layers[l], xn, y);
    pending = true;
    if (!b.mlp) continue;
    add_norm(b.norm2);
    b.mlp->forward_no_grad(xn.view({B, 1, d}), y.view({B, 1, d}));
  }
  env_.decode_pos = Tensor();
  increment_i32(ctx, st.positions_tensor());
  ++st.pos;
  if (pending)
    final_norm_fwd(x, xn, rstd, y, x_next);
  else
    final_norm_fwd(x, xn, rstd);
  head_logits(xn, logits_out);
}

bool Model::decode_graph_safe() const {
  return std::all_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.mixer->graph_safe_step(); });
}

bool Model::decode_step_grows(const DecodeState& st) const {
  for (size_t l = 0; l < blocks_.size(); ++l)
    if (blocks_[l].mixer->step_grows(*st.layers[l])) return true;
  return false;
}

void Model::advance_decode(DecodeState& st) {
  for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l].mixer->advance(*st.layers[l]);
  ++st.pos;
}

void Model::start_document(DecodeState& st, int64_t row) {
  LINAC_CHECK(row >= 0 && row < st.B, "Model::start_document: row out of range");
  check_documents();
  for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l].mixer->start_document(*st.layers[l], row);
  zero_tensor(env_.ctx, st.positions_tensor().narrow(0, row, 1));
}

void Model::prefill(DecodeState& st, const Tensor& tokens, const Tensor& logits_last, const Tensor& docs) {
  LINAC_CHECK(tokens.dtype == DType::I32 && tokens.ndim == 2 && tokens.size(0) == st.B && tokens.size(1) >= 1,
              "Model::prefill: tokens must be [B, T] int32 with T >= 1, got " + tokens.shape_str());
  LINAC_CHECK(logits_last.ndim == 2 && logits_last.size(0) == st.B && logits_last.size(1) == cfg_.vocab_size,
              "Model::prefill: logits must be [B, vocab], got " + logits_last.shape_str());
  LINAC_CHECK(st.pos == 0, "Model::prefill: the decode state must be fresh (init_decode)");
  const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, d = cfg_.d_model;
  if (B > B_ || T > T_ || N > B_ * T_) reserve(std::max(B, B_), std::max(T, T_));
  const DocScope doc_scope(*this, docs, B, T);
  const Ctx& ctx = env_.ctx;
  // One residual stream, updated in place: each sub-layer reads its own normed copy and writes
  // its output to y, which is then added.
  Tensor x = resid(0, B, T), y = scratch_.get("model.y", env_.act, {B, T, d});
  embedding_fwd(ctx, tokens.view({N}), params_.master(embed_), x.view({N, d}));
  if (embed_scale_ != 1) scale_inplace(ctx, x, embed_scale_);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    Tensor xn1 = b.xn1.tensor(env_.act, {B, T, d});
    norm_fwd(b.norm1, x.view({N, d}), xn1.view({N, d}), b.rstd1.tensor(env_.stat, {N}));
    b.mixer->prefill(ctx, *st.layers[l], xn1, y);
    add_inplace(ctx, x, y, 1.f);
    if (!b.mlp) continue;
    Tensor xn2 = b.xn2.tensor(env_.act, {B, T, d});
    norm_fwd(b.norm2, x.view({N, d}), xn2.view({N, d}), b.rstd2.tensor(env_.stat, {N}));
    b.mlp->forward(xn2, y);
    add_inplace(ctx, x, y, 1.f);
  }
  st.pos = T;
  OwnedTensor positions(DType::I32, Device::CPU, {B});
  const std::vector<int64_t> lengths = last_doc_lengths(env_, B, T);
  for (int64_t b = 0; b < B; ++b) positions->data<int32_t>()[b] = static_cast<int32_t>(lengths[static_cast<size_t>(b)]);
  copy_tensor(st.positions_tensor(), positions);
  Tensor x_last = st.x.tensor(env_.resid, {B, d}), xn = st.xn.tensor(env_.act, {B, d});
  for (int64_t i = 0; i < B; ++i) copy_tensor(ctx, x_last.select(0, i), x.select(0, i).select(0, T - 1));
  final_norm_fwd(x_last, xn, st.rstd.tensor(env_.stat, {B}));
  head_logits(xn, logits_last);
}

}  // namespace linac
