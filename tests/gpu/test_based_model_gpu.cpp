// A whole Based model (base_conv, taylor and sliding_window layers) on the GPU vs the CPU
// reference (double) for identical weights and batch (loss and every parameter gradient, fp32
// and bf16 mixed precision), and GPU decoding token by token against the GPU's full forward.
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig based_config() {
  ModelConfig cfg;
  cfg.arch = "based";
  cfg.n_layers = 3;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // head dim 64 for the window, Dv 64 for the linear attention
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 256;
  cfg.tie_embeddings = true;
  cfg.layers = {"base_conv", "taylor", "sliding_window"};
  cfg.mixers = {{"taylor", {{"feature_dim", 16}}}, {"sliding_window", {{"window", 16}}}};
  return cfg;
}

TEST(BasedModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(based_config(), "fp32", 2, 77, 1e-5, 1e-4);  // T = 77: ragged chunks and tiles
}

TEST(BasedModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(based_config(), "bf16", 2, 77, 1e-2, 5e-2);
}

TEST(BasedModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_decode(based_config(), 2, 70, {0, 1, 15, 16, 17, 40, 69}, 1e-4);
}

}  // namespace
}  // namespace linac
