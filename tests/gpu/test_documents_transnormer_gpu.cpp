// Document packing for TransNormerLLM on the GPU (data.packing "document"; docs/transnormer.md
// §4.5): a packed window against each document run alone (per-token losses and every parameter
// gradient, fp32 and bf16), and decoding across a document boundary. Head dim 64 (the lightning
// kernels' tensor-core path; layer 0's LRPE doubles it to Dk = 128), blocks of 64; T = 200 (a
// ragged last block) with documents of one token, shorter than a block, starting exactly at 64
// and 128, and a row that is one document.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_transnormer_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

ModelConfig tnl_config() {
  ModelConfig cfg = test::tiny_model(2, 128, 2, 512, 352, "transnormer");
  cfg.init_std = 0.05;
  cfg.norm_eps = 1e-6;
  return cfg;
}

TEST(DocumentsTransnormerGpu, PackedWindowEqualsDocumentsAloneFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(tnl_config(), g.ctx(), "fp32", kLayouts, 2e-4);
}

TEST(DocumentsTransnormerGpu, PackedWindowEqualsDocumentsAloneBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(tnl_config(), g.ctx(), "bf16", kLayouts, 3e-2);
}

TEST(DocumentsTransnormerGpu, DecodingAfterABoundaryStartsFresh) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_document_decode(tnl_config(), g.ctx(), "fp32", 1e-4);
}

}  // namespace
}  // namespace linac::test_documents_transnormer_gpu
