// Document packing for Based on the GPU (data.packing "document"; docs/based.md "Documents"): a
// packed window against each document run alone (per-token losses and every parameter gradient,
// fp32 and bf16) and decoding across a document boundary. Shapes take the GPU paths: the Taylor
// kernels (F = 16, chunks of 64, Dv 64), the short convolution's 64-token tiles, the tensor-core
// window attention (head dim 64); T = 200 with documents of one token, shorter than a chunk or
// tile, starting exactly at 64 and 128, and a row that is one document.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_based_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

ModelConfig based() {
  ModelConfig c = test::tiny_model(4, 128, 2, 512, 352, "based");
  c.init_std = 0.05;
  c.tie_embeddings = true;
  c.layers = {"base_conv", "taylor", "sliding_window", "base_conv"};
  c.mixers = {{"taylor", {{"feature_dim", 16}}},
              {"sliding_window", {{"window", 48}}},
              {"base_conv", {{"expand", 2}, {"kernel_size", 3}}}};
  return c;
}

TEST(DocumentsBasedGpu, PackedWindowEqualsDocumentsAloneFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(based(), g.ctx(), "fp32", kLayouts, 2e-4);
}

TEST(DocumentsBasedGpu, PackedWindowEqualsDocumentsAloneBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(based(), g.ctx(), "bf16", kLayouts, 3e-2);
}

TEST(DocumentsBasedGpu, DecodingAfterABoundaryStartsFresh) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_document_decode(based(), g.ctx(), "fp32", 1e-4);
}

}  // namespace
}  // namespace linac::test_documents_based_gpu
