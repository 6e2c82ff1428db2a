// Whole Latte and Latte-Macchiato models on the GPU vs the CPU reference (double) for identical
// weights and batch (loss and every parameter gradient, fp32 and bf16 mixed precision), and GPU
// decoding token by token against the GPU's full-sequence forward.
#include "model_parity.h"
#include "test_util.h"

namespace linac {
namespace {

ModelConfig latte_config(bool macchiato) {
  ModelConfig cfg;
  cfg.arch = macchiato ? "latte_macchiato" : "latte";
  cfg.n_layers = 2;
  cfg.d_model = 128;
  cfg.n_heads = 2;  // Dh = 64
  cfg.vocab_size = 1000;
  cfg.ffn_hidden = 352;
  cfg.tie_embeddings = true;
  if (macchiato)
    cfg.mixer = {{"latents", 32}, {"window", 33}};  // 16 latents + the local state per head, conv 3
  else
    cfg.mixer = {{"latents", 32}};
  return cfg;
}

TEST(LatteModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool macchiato : {false, true}) test::check_model_gpu_parity(latte_config(macchiato), "fp32", 2, 77, 1e-5, 1e-4);
}

TEST(LatteModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool macchiato : {false, true}) test::check_model_gpu_parity(latte_config(macchiato), "bf16", 2, 77, 1e-2, 5e-2);
}

TEST(LatteModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  for (bool macchiato : {false, true})
    test::check_model_gpu_decode(latte_config(macchiato), 2, 70, {0, 1, 33, 63, 64, 69}, 1e-4);
}

}  // namespace
}  // namespace linac
