// Activation recompute on the GPU: with train.recompute mixer or block every architecture's
// losses and gradient bytes equal recompute none's, in bf16 mixed precision and in fp32 (the
// kernels are deterministic, so re-running a forward reproduces its saved activations exactly).
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_recompute_gpu {
namespace {

ModelConfig gpu_config(const std::string& arch) {
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

const char* const kArchs[] = {"transformer", "gla", "based", "transnormer", "latte", "latte_macchiato", "transformer_vq"};

TEST(RecomputeGpu, SameGradientsBitForBit) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const char* precision : {"bf16", "fp32"})
    for (const char* arch : kArchs) {
      SCOPED_TRACE(std::string(arch) + " " + precision);
      test::check_recompute_identical(gpu_config(arch), g.ctx(), precision, 2, 77);
    }
}

}  // namespace
}  // namespace linac::test_recompute_gpu
