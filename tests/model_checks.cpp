#include "model_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/train_step.h"

namespace linac::test {

ModelConfig tiny_model(int64_t n_layers, int64_t d_model, int64_t n_heads, int64_t vocab, int64_t ffn_hidden,
                       const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_layers = n_layers;
  c.d_model = d_model;
  c.n_heads = n_heads;
  c.vocab_size = vocab;
  c.ffn_hidden = ffn_hidden;
  return c;
}

ModelConfig tiny_config_of(const ArchInfo& arch) {
  ModelConfig c = tiny_model(std::max<int64_t>(2, static_cast<int64_t>(arch.pattern.size())), 16, 2, 11, 24, arch.name);
  c.init_std = 0.3;
  c.norm_eps = 1e-6;
  return c;
}

OwnedTensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  OwnedTensor t(DType::I32, Device::CPU, {B, T});
  Rng rng{seed, 1, 0};
  for (int64_t i = 0; i < B * T; ++i) t->data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

void perturb_special_init(ParamStore& ps) {
  for (int i = 0; i < ps.count(); ++i) {
    const Init init = ps.spec(i).init;
    if (init != Init::Ones && init != Init::Zeros && init != Init::Values) continue;
    // GPU masters go through a host copy (fill_random writes host memory).
    const Tensor m = ps.master(i);
    OwnedTensor host(m.dtype, Device::CPU, m.dims());
    if (init == Init::Ones)
      fill_random(host, 100 + static_cast<uint64_t>(i), 0.5, 1.5);
    else if (init == Init::Zeros)
      fill_random(host, 200 + static_cast<uint64_t>(i), -0.5, 0.5);
    else  // LRPE's frequencies reach 1e-7, where the gradients sink under the differences' noise
      fill_random(host, 300 + static_cast<uint64_t>(i), 0.2, 1.2);
    copy_tensor(m, host);
  }
}

void check_model_gradients(const ModelConfig& cfg, int64_t B, int64_t T, size_t n_probe) {
  Model model(cfg, Ctx{}, {.precision = "fp64"});
  model.init_params(5);
  ParamStore& ps = model.params();
  perturb_special_init(ps);
  model.reserve(B, T);
  OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  targets->data<int32_t>()[std::min<int64_t>(3, B * T - 1)] = -1;  // an ignored position
  ps.zero_grad(Ctx{});
  model.forward_backward(tokens, targets, 1.f);
  auto loss = [&] { return model.forward_loss(tokens, targets); };
  for (int i = 0; i < ps.count(); ++i) {
    std::vector<double> g = to_doubles(ps.grad(i));
    EXPECT_GT(max_abs_diff(g, std::vector<double>(g.size(), 0.0)), 0.0) << ps.spec(i).name << " has no gradient";
    const double err = check_grad(loss, ps.master(i).data<double>(), g.data(), g.size(), n_probe, 3, 1e-5);
    EXPECT_LT(err, 1e-5) << ps.spec(i).name;
  }
}

void check_recompute_identical(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B,
                               int64_t T) {
  struct Run {
    std::vector<double> losses;
    std::vector<unsigned char> grads;
    size_t saved_bytes = 0;
  };
  std::vector<OwnedTensor> batches;
  for (uint64_t i = 0; i < 4; ++i) batches.push_back(to(random_tokens(B, T, cfg.vocab_size, 30 + i), ctx.device, DType::I32));
  auto run = [&](Recompute r) {
    Model m(cfg, ctx, {.precision = precision});
    m.init_params(5);
    m.set_recompute(r);
    m.reserve(B, T);
    ParamStore& ps = m.params();
    ps.zero_grad(ctx);
    Run out;
    for (size_t i = 0; i < batches.size(); i += 2) {
      out.losses.push_back(m.forward_backward(batches[i], batches[i + 1], 1.f / static_cast<float>(B * T)));
      out.losses.push_back(m.aux_loss_sum());
    }
    OwnedTensor g(ps.master_dtype(), Device::CPU, {ps.flat_numel()});
    copy_tensor(g.t, ps.flat_grad());
    const auto* p = static_cast<const unsigned char*>(g->ptr);
    out.grads.assign(p, p + g->nbytes());
    out.saved_bytes = m.activation_bytes(B, T);
    return out;
  };
  const Run none = run(Recompute::None);
  size_t nonzero = 0;
  for (unsigned char c : none.grads) nonzero += c != 0;
  ASSERT_GT(nonzero, none.grads.size() / 4) << "most gradient bytes should be nonzero";
  size_t prev_bytes = none.saved_bytes;
  for (Recompute r : {Recompute::Mixer, Recompute::Block}) {
    SCOPED_TRACE(std::string("recompute ") + recompute_name(r));
    const Run x = run(r);
    EXPECT_EQ(x.losses, none.losses);
    ASSERT_EQ(x.grads.size(), none.grads.size());
    size_t differ = 0;
    for (size_t i = 0; i < x.grads.size(); ++i) differ += x.grads[i] != none.grads[i];
    EXPECT_EQ(differ, 0u) << "gradient bytes differ from recompute none";
    EXPECT_LT(x.saved_bytes, prev_bytes);
    prev_bytes = x.saved_bytes;
  }
}

void check_accumulation_after_nan(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B,
                                  int64_t T, double tol) {
  std::vector<OwnedTensor> batches;
  for (uint64_t i = 0; i < 4; ++i)
    batches.push_back(to(random_tokens(B, T, cfg.vocab_size, 40 + i), ctx.device, DType::I32));
  Model m(cfg, ctx, {.precision = precision});
  m.init_params(5);
  m.reserve(B, T);
  ParamStore& ps = m.params();
  auto accumulate = [&](size_t first, size_t end) {
    ps.zero_grad(ctx);
    for (size_t i = first; i < end; i += 2)
      m.forward_backward(batches[i], batches[i + 1], 1.f / static_cast<float>(B * T));
    return to_doubles(ctx, ps.flat_grad());
  };
  const std::vector<double> ga = accumulate(0, 2), gb = accumulate(2, 4);
  OwnedTensor poison(DType::F64, Device::CPU, {ps.flat_numel()});
  std::fill_n(poison->data<double>(), ps.flat_numel(), 0.0);
  for (int id = 0; id < ps.count(); ++id)
    std::fill_n(poison->data<double>() + ps.offset(id), ps.numel(id), std::numeric_limits<double>::quiet_NaN());
  copy_tensor(ps.flat_grad(), to(poison, ctx.device, ps.master_dtype()));
  const std::vector<double> gab = accumulate(0, 4);
  ASSERT_EQ(gab.size(), ga.size());
  for (int id = 0; id < ps.count(); ++id) {
    double err = 0, scale = 0;
    for (int64_t j = ps.offset(id); j < ps.offset(id) + ps.numel(id); ++j) {
      const auto u = static_cast<size_t>(j);
      err = std::max(err, std::isnan(gab[u]) ? INFINITY : std::abs(gab[u] - (ga[u] + gb[u])));
      scale = std::max(scale, std::abs(ga[u]) + std::abs(gb[u]));
    }
    EXPECT_GT(scale, 0.0) << ps.spec(id).name << " has no gradient";
    EXPECT_LE(err, tol * scale) << ps.spec(id).name;
  }
}

int64_t train_two_micro_batch_steps(const Config& full, const Ctx& ctx, int64_t B, int64_t T,
                                    const std::function<void(int, const StepStats&, Model&)>& each) {
  const ModelConfig& cfg = full.model;
  Model m(cfg, ctx, ModelOptions::for_training(full, 0, 1));
  m.init_params(7);
  m.reserve(B, T);
  TrainStep ts(m, full.train);
  ts.sync_weights();
  std::vector<OwnedTensor> bufs;
  for (uint64_t i = 0; i < 4; ++i)
    bufs.push_back(to(random_tokens(B, T, cfg.vocab_size, 60 + i), ctx.device, DType::I32));
  const std::vector<MicroBatch> micro{{bufs[0].t, bufs[1].t, Tensor()}, {bufs[2].t, bufs[3].t, Tensor()}};
  for (int s = 0; s < full.train.steps; ++s) each(s, ts.run(s, micro, 2 * B * T), m);
  return ts.graph_replays();
}

void check_step_grad_norm(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B, int64_t T,
                          double tol) {
  Config full;
  full.model = cfg;
  TrainConfig& tc = full.train;
  tc.precision = precision;
  tc.steps = 3;
  tc.lr = 1e-3;
  tc.warmup_steps = 0;
  const int64_t replays = train_two_micro_batch_steps(full, ctx, B, T, [&](int s, const StepStats& st, Model& m) {
    ASSERT_FALSE(st.skipped) << "step " << s;
    const double whole = grad_norm(ctx, m.params());
    EXPECT_GT(whole, 0.0) << "step " << s;
    EXPECT_NEAR(st.grad_norm, whole, tol * whole) << "step " << s;
  });
  if (ctx.is_gpu()) EXPECT_GT(replays, 0) << "no step replayed a captured graph";
}

namespace {

// Per-position negative log-likelihoods of the full-sequence forward (one scored target at a time).
std::vector<double> full_sequence_nll(Model& m, const Tensor& tokens, const Tensor& targets) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  std::vector<double> out;
  OwnedTensor one(DType::I32, Device::CPU, {B, T});
  for (int64_t i = 0; i < B * T; ++i) {
    std::fill_n(one->data<int32_t>(), B * T, -1);
    one->data<int32_t>()[i] = targets.data<int32_t>()[i];
    out.push_back(m.forward_loss(tokens, one));
  }
  return out;
}

}  // namespace

namespace {

// -log softmax(logits)[target] for each sequence's [V] row of logits [B, V] (f64), stored at
// position t of got [B, T].
void store_nll(const Tensor& logits, const Tensor& targets, int64_t t, std::vector<double>& got) {
  const int64_t B = logits.size(0), V = logits.size(1), T = targets.size(1);
  for (int64_t b = 0; b < B; ++b) {
    const double* l = logits.data<double>() + b * V;
    double mx = l[0], z = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
    for (int64_t v = 0; v < V; ++v) z += std::exp(l[v] - mx);
    got[static_cast<size_t>(b * T + t)] = mx + std::log(z) - l[targets.data<int32_t>()[b * T + t]];
  }
}

}  // namespace

void check_decode_matches_forward(const ModelConfig& cfg, int64_t B, int64_t T, double tol, int64_t prompt) {
  LINAC_CHECK(prompt >= 0 && prompt < T, "check_decode_matches_forward: prompt must be in [0, T)");
  const int64_t V = cfg.vocab_size;
  Model model(cfg, Ctx{}, {.precision = "fp64"});
  model.init_params(8);
  perturb_special_init(model.params());
  model.reserve(B, T);
  OwnedTensor tokens = random_tokens(B, T, V, 3), targets = random_tokens(B, T, V, 4);
  const std::vector<double> ref = full_sequence_nll(model, tokens, targets);

  Model::DecodeState st = model.init_decode(B);
  OwnedTensor tok(DType::I32, Device::CPU, {B}), logits(DType::F64, Device::CPU, {B, V});
  // Positions before the prompt's last token have no logits from prefill: they keep the reference.
  std::vector<double> got = ref;
  std::fill(got.begin(), got.end(), std::nan(""));
  if (prompt > 0) {
    OwnedTensor head(DType::I32, Device::CPU, {B, prompt});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < prompt; ++t) head->data<int32_t>()[b * prompt + t] = tokens->data<int32_t>()[b * T + t];
    poison(logits);
    model.prefill(st, head, logits);
    store_nll(logits, targets, prompt - 1, got);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < prompt - 1; ++t) got[static_cast<size_t>(b * T + t)] = ref[static_cast<size_t>(b * T + t)];
  }
  for (int64_t t = prompt; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) tok->data<int32_t>()[b] = tokens->data<int32_t>()[b * T + t];
    poison(logits);
    model.decode_step(st, tok, logits);
    store_nll(logits, targets, t, got);
  }
  EXPECT_TRUE(all_finite(got));
  EXPECT_LT(max_abs_diff(got, ref), tol);
}

namespace {

// The bytes of a CPU tensor.
std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.ptr), t.nbytes()); }

}  // namespace

void check_checkpoint_round_trip(const ModelConfig& cfg, int64_t B, int64_t T, const std::string& dir) {
  Config full;
  full.model = cfg;
  const OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 21), targets = random_tokens(B, T, cfg.vocab_size, 22);
  Model a(cfg, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  a.init_params(6);
  perturb_special_init(a.params());
  a.params().refresh_compute(Ctx{});
  a.reserve(B, T);
  TrainConfig tc;
  tc.steps = 1;
  tc.warmup_steps = 0;
  TrainStep stepper(a, tc);
  ASSERT_FALSE(stepper.run(0, {{tokens, targets}}, B * T).skipped);
  const OwnedTensor probe = random_tokens(B, T, cfg.vocab_size, 23), probe_targets = random_tokens(B, T, cfg.vocab_size, 24);
  const double loss_a = a.forward_loss(probe, probe_targets), aux_a = a.aux_loss_sum();

  CheckpointData data;
  data.config = full.to_json();
  data.state.step = 1;
  data.state.updates = 1;
  const std::string path = dir + "/roundtrip.h5";
  save_checkpoint(path, a.params(), data);

  const CheckpointReader reader(path);
  ASSERT_TRUE(reader.has_optimizer());
  const Config back = Config::from_json(reader.data().config, path);
  EXPECT_EQ(back.to_json()["model"], data.config["model"]) << "the checkpoint's config does not rebuild the model";
  Model b(back.model, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  reader.load_params(b.params(), true);
  b.params().refresh_compute(Ctx{});
  const ParamStore &pa = a.params(), &pb = b.params();
  ASSERT_EQ(pb.count(), pa.count());
  ASSERT_EQ(pb.buffer_count(), pa.buffer_count());
  for (int i = 0; i < pa.count(); ++i) {
    EXPECT_EQ(pb.spec(i).name, pa.spec(i).name);
    EXPECT_EQ(bytes_of(pb.master(i)), bytes_of(pa.master(i))) << pa.spec(i).name;
    EXPECT_EQ(bytes_of(pb.m(i)), bytes_of(pa.m(i))) << pa.spec(i).name << " (AdamW m)";
    EXPECT_EQ(bytes_of(pb.v(i)), bytes_of(pa.v(i))) << pa.spec(i).name << " (AdamW v)";
  }
  for (int i = 0; i < pa.buffer_count(); ++i)
    EXPECT_EQ(bytes_of(pb.buffer(i)), bytes_of(pa.buffer(i))) << pa.buffer_spec(i).name;
  b.reserve(B, T);
  const double loss_b = b.forward_loss(probe, probe_targets);
  EXPECT_EQ(loss_b, loss_a);
  EXPECT_EQ(b.aux_loss_sum(), aux_a);
  // The comparison can fail: a model that loaded nothing (or another init) scores differently.
  Model fresh(cfg, Ctx{}, {.precision = "fp32"});
  fresh.init_params(6);
  fresh.reserve(B, T);
  EXPECT_NE(fresh.forward_loss(probe, probe_targets), loss_a);
}

int64_t copy_task(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T, int64_t V) {
  const int64_t h = T / 2;
  for (int64_t b = 0; b < B; ++b) {
    int32_t* tk = tokens + b * T;
    int32_t* tg = targets + b * T;
    for (int64_t t = 0; t < h; ++t) tk[t] = tk[t + h] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    for (int64_t t = 0; t < T; ++t) tg[t] = (t >= h - 1 && t + 1 < T) ? tk[t + 1] : -1;
  }
  return B * h;
}

int64_t previous_token_task(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T, int64_t V) {
  for (int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) targets[b * T + t] = t >= 1 ? tokens[b * T + t - 1] : -1;
  return B * (T - 1);
}

void check_tiny_model_learns(const ModelConfig& cfg, const TrainConfig& tc, int64_t B, int64_t T,
                             uint64_t data_stream, const TaskBatch& task, double max_final_loss) {
  Model model(cfg, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  model.init_params(1);
  model.reserve(B, T);
  TrainStep stepper(model, tc);
  OwnedTensor tokens(DType::I32, Device::CPU, {B, T}), targets(DType::I32, Device::CPU, {B, T});
  Rng rng{42, data_stream, 0};
  double first = 0, last = 0;
  for (int64_t step = 0; step < tc.steps; ++step) {
    const int64_t scored = task(rng, tokens->data<int32_t>(), targets->data<int32_t>(), B, T);
    const StepStats st = stepper.run(step, {{tokens, targets}}, scored);
    ASSERT_FALSE(st.skipped) << "step " << step;
    if (step == 0) first = st.loss;
    last = st.loss;
  }
  EXPECT_NEAR(first, std::log(static_cast<double>(cfg.vocab_size)), 0.5);
  EXPECT_LT(last, max_final_loss) << "loss after " << tc.steps << " steps";
}

}  // namespace linac::test
