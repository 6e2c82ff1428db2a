// The whole model on the GPU vs the CPU reference (double) for identical weights and batch:
// loss and every parameter gradient, in fp32 and bf16 mixed precision.
#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"

namespace linac {
namespace {

void run_model_parity(const std::string& precision, double loss_tol, double grad_tol) {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // head dim 64
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 352;
  const int64_t B = 2, T = 77;
  OwnedTensor tokens(DType::I32, Device::CPU, {B, T}), targets(DType::I32, Device::CPU, {B, T});
  Rng rng{3, 3, 0};
  for (int64_t i = 0; i < B * T; ++i) {
    tokens->data<int32_t>()[i] = static_cast<int32_t>(rng.below(1000));
    targets->data<int32_t>()[i] = static_cast<int32_t>(rng.below(1000));
  }

  Model cpu(cfg, Ctx{}, "fp64", false);
  cpu.init_params(11);
  cpu.reserve(B, T);
  GpuContext g;
  Model gpu(cfg, g.ctx(), precision, false);
  gpu.init_params(11);
  gpu.reserve(B, T);
  // The reference starts from the GPU's own (possibly bf16-rounded) compute weights.
  for (int i = 0; i < cpu.params().count(); ++i) {
    const Tensor w = gpu.params().weight(i);
    const Tensor src = gpu.params().spec(i).init == Init::Ones ? gpu.params().master(i) : w;
    OwnedTensor d = to(src, Device::CPU, DType::F64);
    copy_tensor(cpu.params().master(i), d);
  }

  const float scale = 1.f / static_cast<float>(B * T);
  cpu.params().zero_grad(Ctx{});
  const double lc = cpu.forward_backward(tokens, targets, scale);
  OwnedTensor tok_d = to(tokens, Device::CUDA, DType::I32), tgt_d = to(targets, Device::CUDA, DType::I32);
  gpu.params().zero_grad(g.ctx());
  const double lg = gpu.forward_backward(tok_d, tgt_d, scale);
  g.synchronize();
  EXPECT_NEAR(lg / (B * T), lc / (B * T), loss_tol * lc / (B * T)) << precision;
  for (int i = 0; i < cpu.params().count(); ++i)
    EXPECT_LT(test::rel_error(gpu.params().grad(i), cpu.params().grad(i)), grad_tol)
        << precision << " " << cpu.params().spec(i).name;
}

TEST(ModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_model_parity("fp32", 1e-5, 1e-4);
}

TEST(ModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_model_parity("bf16", 1e-2, 5e-2);
}

}  // namespace
}  // namespace linac
