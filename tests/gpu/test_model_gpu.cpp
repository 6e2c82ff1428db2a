// The whole Transformer++ model on the GPU vs the CPU reference (double) for identical weights
// and batch: loss and every parameter gradient, in fp32 and bf16 mixed precision.
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig transformer_config(bool tied) {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // head dim 64: the tensor-core attention path
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 352;
  cfg.tie_embeddings = tied;
  return cfg;
}

TEST(ModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(transformer_config(false), "fp32", 2, 77, 1e-5, 1e-4);
}

TEST(ModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(transformer_config(false), "bf16", 2, 77, 1e-2, 5e-2);
}

TEST(ModelGpu, MatchesCpuBf16TiedEmbeddings) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(transformer_config(true), "bf16", 2, 77, 1e-2, 5e-2);
}

}  // namespace
}  // namespace linac
