// A whole Transformer-VQ model on the GPU vs the CPU reference (double) for identical weights,
// codebooks and batch (loss and every parameter gradient, fp32), and GPU decoding token by token
// against the GPU's full-sequence forward. No bf16 parity at the model level: bf16 keys round by
// ~1e-2 and may pick a different nearest code than the double reference does (a different but
// equally valid forward); the op-level GPU tests cover bf16.
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig vq_config() {
  ModelConfig cfg;
  cfg.arch = "transformer_vq";
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 1;
  cfg.vocab_size = 1000;
  cfg.final_norm = false;
  cfg.head_bias = true;
  cfg.mixer = {{"dk", 64}, {"dv", 256}, {"codebook", 32}, {"block", 16}, {"beta", 0.01}};
  return cfg;
}

TEST(VqModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(vq_config(), "fp32", 2, 77, 1e-5, 1e-4);  // T = 77: 5 blocks of 16, the cache in use
}

TEST(VqModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_decode(vq_config(), 2, 70, {0, 1, 15, 16, 33, 63, 64, 69}, 1e-4);
}

}  // namespace
}  // namespace linac
