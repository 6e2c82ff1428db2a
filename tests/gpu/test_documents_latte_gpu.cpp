// Document packing for the Latte kinds on the GPU (data.packing "document"; docs/latte.md
// "Documents"): a packed window against each document run alone (per-token losses and every
// parameter gradient, fp32 and bf16) and decoding across a document boundary. Shapes take the GPU
// paths: head dim 64 (the local window's tensor-core attention), 16 latents per head, the core's
// chunks of 64; T = 200 with documents of one token, shorter than a chunk, starting exactly at 64
// and 128, and a row that is one document. The Macchiato and Latte-Conv++ cases need the conv's
// document masking (kernels/short_conv).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_latte_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

ModelConfig gpu_latte(const std::string& variant) {
  ModelConfig c = test::tiny_model(2, 128, 2, 512, 352, variant == "macchiato" ? "latte_macchiato" : "latte");
  c.init_std = 0.05;
  if (variant == "macchiato")
    c.mixer = {{"latents", 32}, {"conv", 3}, {"window", 48}};
  else if (variant == "conv")
    c.mixer = {{"latents", 32}, {"conv", 3}, {"vapor", false}};
  else
    c.mixer = {{"latents", 32}};
  return c;
}

class LatteDocumentsGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(LatteDocumentsGpu, PackedWindowEqualsDocumentsAloneFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(gpu_latte(GetParam()), g.ctx(), "fp32", kLayouts, 2e-4);
}

TEST_P(LatteDocumentsGpu, PackedWindowEqualsDocumentsAloneBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_documents_match_separate(gpu_latte(GetParam()), g.ctx(), "bf16", kLayouts, 3e-2);
}

TEST_P(LatteDocumentsGpu, DecodingAfterABoundaryStartsFresh) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  test::check_document_decode(gpu_latte(GetParam()), g.ctx(), "fp32", 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Latte, LatteDocumentsGpu, ::testing::Values("vapor", "conv", "macchiato"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace linac::test_documents_latte_gpu
