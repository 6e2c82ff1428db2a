// A whole TransNormerLLM model on the GPU vs the CPU reference (double) for identical weights and
// batch (loss and every parameter gradient, fp32 and bf16 mixed precision), and GPU decoding
// token by token against the GPU's full-sequence forward.
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig tnl_config() {
  ModelConfig cfg;
  cfg.arch = "transnormer";
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // dh = 64; layer 0 runs the attention with Dk = 128 (LRPE)
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 352;
  cfg.norm_eps = 1e-6;
  cfg.tie_embeddings = true;
  return cfg;
}

TEST(TnlModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(tnl_config(), "fp32", 2, 77, 1e-5, 1e-4);  // T = 77: ragged blocks
}

TEST(TnlModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_parity(tnl_config(), "bf16", 2, 77, 1e-2, 5e-2);
}

TEST(TnlModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  test::check_model_gpu_decode(tnl_config(), 2, 70, {0, 1, 33, 63, 64, 69}, 1e-4);
}

}  // namespace
}  // namespace linac
