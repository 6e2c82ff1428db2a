// A whole GLA model on the GPU vs the CPU reference (double) for identical weights and batch
// (loss and every parameter gradient, fp32 and bf16 mixed precision), and GPU decoding token by
// token against the GPU's full-sequence forward.
#include <cmath>

#include "core/rng.h"
#include "model/model.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig gla_config() {
  ModelConfig cfg;
  cfg.arch = "gla";
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // Dk = 32, Dv = 64
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 352;
  return cfg;
}

OwnedTensor random_tokens(int64_t B, int64_t T, uint64_t seed) {
  OwnedTensor t(DType::I32, Device::CPU, {B, T});
  Rng rng{seed, 3, 0};
  for (int64_t i = 0; i < B * T; ++i) t->data<int32_t>()[i] = static_cast<int32_t>(rng.below(1000));
  return t;
}

TEST(GlaModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(gla_config(), "fp32", 2, 77, 1e-5, 1e-4);  // T=77: two chunks, the second ragged
}

TEST(GlaModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(gla_config(), "bf16", 2, 77, 1e-2, 5e-2);
}

TEST(GlaModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  const ModelConfig cfg = gla_config();
  const int64_t B = 2, T = 70, V = cfg.vocab_size;
  Model model(cfg, g.ctx(), "fp32", false);
  model.init_params(3);
  model.reserve(B, T);
  OwnedTensor tokens = random_tokens(B, T, 5), targets = random_tokens(B, T, 6);
  OwnedTensor tok_d = to(tokens, Device::CUDA, DType::I32);
  // Full-sequence NLL of a handful of positions (one scored target at a time).
  const int64_t probes[] = {0, 1, 33, 63, 64, 69};
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
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) tok->data<int32_t>()[b] = tokens->data<int32_t>()[b * T + t];
    model.decode_step(st, to(tok, Device::CUDA, DType::I32), logits);
    const std::vector<double> l = to_doubles(logits);
    for (int64_t b = 0; b < B; ++b) {
      double mx = l[b * V], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[b * V + v]);
      for (int64_t v = 0; v < V; ++v) z += std::exp(l[b * V + v] - mx);
      nll[static_cast<size_t>(b * T + t)] = mx + std::log(z) - l[b * V + targets->data<int32_t>()[b * T + t]];
    }
  }
  std::vector<double> got;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : probes) got.push_back(nll[static_cast<size_t>(b * T + t)]);
  EXPECT_LT(test::max_abs_diff(got, ref), 1e-4);
}

}  // namespace
}  // namespace linac
