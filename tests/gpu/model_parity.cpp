#include "model_parity.h"

#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"

namespace linac::test {

namespace {
OwnedTensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  OwnedTensor t(DType::I32, Device::CPU, {B, T});
  Rng rng{seed, 3, 0};
  for (int64_t i = 0; i < B * T; ++i) t->data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}
}  // namespace

void check_model_gpu_parity(const ModelConfig& cfg, const std::string& precision, int64_t B, int64_t T,
                            double loss_tol, double grad_tol) {
  OwnedTensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  Model cpu(cfg, Ctx{}, "fp64", false);
  cpu.init_params(11);
  cpu.reserve(B, T);
  GpuContext g;
  Model gpu(cfg, g.ctx(), precision, false);
  gpu.init_params(11);
  ParamStore& gp = gpu.params();
  for (int i = 0; i < gp.count(); ++i)
    if (gp.spec(i).init == Init::Zeros) {
      OwnedTensor r = to(random_tensor(gp.master(i).dims(), DType::F64, 50 + static_cast<uint64_t>(i), -0.5, 0.5),
                         Device::CUDA, DType::F32);
      copy_tensor(gp.master(i), r);
    }
  gp.refresh_compute(g.ctx());
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

}  // namespace linac::test
