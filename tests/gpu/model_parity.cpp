#include "model_parity.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test {
namespace {

// Parameters initialised to zero (biases) get random values, so their paths carry gradient; then
// the compute copies are refreshed.
void randomize_zero_init(ParamStore& ps, const Ctx& ctx) {
  for (int i = 0; i < ps.count(); ++i)
    if (ps.spec(i).init == Init::Zeros) {
      OwnedTensor r = to(random_tensor(ps.master(i).dims(), DType::F64, 50 + static_cast<uint64_t>(i), -0.5, 0.5),
                         Device::CUDA, DType::F32);
      copy_tensor(ps.master(i), r);
    }
  ps.refresh_compute(ctx);
}

}  // namespace

void check_model_gpu_parity(const ModelConfig& cfg, const std::string& precision, int64_t B, int64_t T,
                            double loss_tol, double grad_tol) {
  OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  Model cpu(cfg, Ctx{}, {.precision = "fp64"});
  cpu.init_params(11);
  cpu.reserve(B, T);
  GpuContext g;
  Model gpu(cfg, g.ctx(), {.precision = precision});
  gpu.init_params(11);
  ParamStore& gp = gpu.params();
  randomize_zero_init(gp, g.ctx());
  gpu.reserve(B, T);
  for (int i = 0; i < gp.count(); ++i) {
    // Norm weights and biases are read as f32 masters on the GPU; the embedding gather too
    // (its bf16 copy only feeds a tied head, whose tolerance covers the rounding).
    const bool master = gp.spec(i).init != Init::Normal || gp.spec(i).name == "embed.weight";
    OwnedTensor d = to(master ? gp.master(i) : gp.weight(i), Device::CPU, DType::F64);
    copy_tensor(cpu.params().master(i), d);
  }

  const float scale = 1.f / static_cast<float>(B * T);
  cpu.params().zero_grad(Ctx{});
  const double lc = cpu.forward_backward(tokens, targets, scale) / static_cast<double>(B * T);
  OwnedTensor tok_d = to(tokens, Device::CUDA, DType::I32), tgt_d = to(targets, Device::CUDA, DType::I32);
  gp.zero_grad(g.ctx());
  const double lg = gpu.forward_backward(tok_d, tgt_d, scale) / static_cast<double>(B * T);
  g.synchronize();
  EXPECT_NEAR(lg, lc, loss_tol * lc) << cfg.arch << " " << precision;
  for (int i = 0; i < cpu.params().count(); ++i)
    EXPECT_LT(rel_error(gp.grad(i), cpu.params().grad(i)), grad_tol)
        << cfg.arch << " " << precision << " " << cpu.params().spec(i).name;
}

void check_bf16_logits(const ModelConfig& cfg, int64_t B, int64_t T, double loss_tol, double grad_tol) {
  OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  GpuContext g;
  OwnedTensor tok_d = to(tokens, Device::CUDA, DType::I32), tgt_d = to(targets, Device::CUDA, DType::I32);
  const float scale = 1.f / static_cast<float>(B * T);
  auto step = [&](Model& m) {
    m.params().zero_grad(g.ctx());
    const double loss = m.forward_backward(tok_d, tgt_d, scale) / static_cast<double>(B * T);
    g.synchronize();
    return loss;
  };
  Model f32(cfg, g.ctx(), {.precision = "bf16"}), bf16(cfg, g.ctx(), {.precision = "bf16", .bf16_logits = true});
  for (Model* m : {&f32, &bf16}) {
    m->init_params(11);
    randomize_zero_init(m->params(), g.ctx());
    m->reserve(B, T);
  }
  const double lf = step(f32), lb = step(bf16);
  EXPECT_NE(lb, lf) << cfg.arch << ": the bf16 logits gave the f32 logits' loss to the bit";
  EXPECT_NEAR(lb, lf, loss_tol * lf) << cfg.arch;
  for (int i = 0; i < f32.params().count(); ++i)
    EXPECT_LT(rel_error(bf16.params().grad(i), f32.params().grad(i)), grad_tol)
        << cfg.arch << " " << f32.params().spec(i).name;
  OwnedTensor first = to(bf16.params().grad(0), Device::CPU, DType::F64);
  EXPECT_EQ(step(bf16), lb) << cfg.arch << ": a repeated step";
  EXPECT_EQ(rel_error(bf16.params().grad(0), first), 0.0) << cfg.arch << ": a repeated step";
}

ModelConfig gpu_tiny_of(const ArchInfo& arch) {
  ModelConfig c = tiny_model(std::max<int64_t>(2, static_cast<int64_t>(arch.pattern.size())), 128, 2, 1000, 256,
                             arch.name);
  c.tie_embeddings = true;
  return c;
}

ModelConfig gpu_config_of(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_layers = 3;
  c.d_model = 128;
  c.n_heads = 2;  // head dim 64 (attention, windows, Latte), GLA Dk 32 / Dv 64, TNL dh 64
  c.vocab_size = 1000;
  c.ffn_hidden = 352;
  if (arch == "based") {
    c.layers = {"base_conv", "taylor", "sliding_window"};
    c.mixers = {{"taylor", {{"feature_dim", 16}}}, {"sliding_window", {{"window", 16}}}};
  }
  if (arch == "transnormer") c.norm_eps = 1e-6;
  if (arch == "latte") c.mixer = {{"latents", 32}};
  if (arch == "latte_macchiato") c.mixer = {{"latents", 32}, {"window", 33}};
  if (arch == "transformer_vq") {
    c.n_heads = 1;
    c.final_norm = false;
    c.head_bias = true;
    c.mixer = {{"dk", 64}, {"dv", 256}, {"codebook", 32}, {"block", 16}, {"beta", 0.01}};
  }
  return c;
}

void check_model_gpu_decode(const ModelConfig& cfg, int64_t B, int64_t T, const std::vector<int64_t>& probes,
                            double tol, int64_t prompt) {
  for (int64_t t : probes) LINAC_CHECK(t >= prompt - 1 && t < T, "check_model_gpu_decode: probe outside the decoded span");
  GpuContext g;
  const int64_t V = cfg.vocab_size;
  Model model(cfg, g.ctx(), {.precision = "fp32"});
  model.init_params(3);
  model.reserve(B, T);
  OwnedTensor tokens = random_tokens(B, T, V, 5), targets = random_tokens(B, T, V, 6);
  OwnedTensor tok_d = to(tokens, Device::CUDA, DType::I32);
  // Full-sequence NLL of the probed positions (one scored target at a time).
  std::vector<double> ref;
  OwnedTensor one(DType::I32, Device::CPU, {B, T});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : probes) {
      std::fill_n(one->data<int32_t>(), B * T, -1);
      one->data<int32_t>()[b * T + t] = targets->data<int32_t>()[b * T + t];
      ref.push_back(model.forward_loss(tok_d, to(one, Device::CUDA, DType::I32)));
    }
  Model::DecodeState st = model.init_decode(B);
  OwnedTensor tok(DType::I32, Device::CPU, {B}), logits(DType::F32, Device::CUDA, {B, V});
  std::vector<double> nll(static_cast<size_t>(B * T));
  auto score = [&](int64_t t) {
    const std::vector<double> l = to_doubles(logits);
    for (int64_t b = 0; b < B; ++b) {
      double mx = l[b * V], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[b * V + v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(l[b * V + v] - mx);
      nll[static_cast<size_t>(b * T + t)] = mx + std::log(z) - l[b * V + targets->data<int32_t>()[b * T + t]];
    }
  };
  if (prompt > 0) {
    OwnedTensor head(DType::I32, Device::CPU, {B, prompt});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < prompt; ++t) head->data<int32_t>()[b * prompt + t] = tokens->data<int32_t>()[b * T + t];
    poison(logits);
    model.prefill(st, to(head, Device::CUDA, DType::I32), logits);
    score(prompt - 1);
  }
  for (int64_t t = prompt; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) tok->data<int32_t>()[b] = tokens->data<int32_t>()[b * T + t];
    poison(logits);
    model.decode_step(st, to(tok, Device::CUDA, DType::I32), logits);
    score(t);
  }
  std::vector<double> got;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : probes) got.push_back(nll[static_cast<size_t>(b * T + t)]);
  EXPECT_LT(max_abs_diff(got, ref), tol);
}

}  // namespace linac::test
