// A whole GLA model on the GPU vs the CPU reference (double) for identical weights and batch
// (loss and every parameter gradient, fp32 and bf16 mixed precision), and GPU decoding token by
// token against the GPU's full-sequence forward.
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
  test::check_model_gpu_decode(gla_config(), 2, 70, {0, 1, 33, 63, 64, 69}, 1e-4);
}

}  // namespace
}  // namespace linac
