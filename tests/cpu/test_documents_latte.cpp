// Document packing for the Latte kinds on the CPU (data.packing "document"; docs/latte.md
// "Documents"): a packed window of several documents against each document run alone (per-token
// losses and every parameter gradient, fp64 and fp32) and decoding across a document boundary
// (prefill of a packed prompt, start_document, rows at different positions). Latte (VAPOR
// positions from each document's start, the core's state restarting inside chunks of 4) and
// Latte-Conv++ (the conv over the logits) and Latte-Macchiato (the conv, the local window of 5
// keys, its RoPE). The conv's document masking lives in kernels/short_conv: the cases with a conv
// need it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_latte {
namespace {

// T = 21: documents of one token, shorter than a chunk (4), starting exactly at chunk boundaries
// (8, 12, 16), a row that is one document.
const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 5, 8}, {21}, {3, 1, 1, 3, 8, 5}};

ModelConfig tiny_latte(const std::string& variant) {
  ModelConfig c = test::tiny_model(2, 12, 2, 11, 20, variant == "macchiato" ? "latte_macchiato" : "latte");  // Dh = 6
  c.init_std = 0.3;
  c.tie_embeddings = true;
  if (variant == "macchiato")
    c.mixer = {{"latents", 6}, {"conv", 3}, {"window", 5}, {"chunk", 4}};  // 3 latents + the local state per head
  else if (variant == "conv")
    c.mixer = {{"latents", 4}, {"conv", 3}, {"vapor", false}, {"chunk", 4}};  // Latte-Conv++
  else
    c.mixer = {{"latents", 4}, {"chunk", 4}};  // Latte++: VAPOR
  return c;
}

class LatteDocuments : public ::testing::TestWithParam<std::string> {};

TEST_P(LatteDocuments, PackedWindowEqualsDocumentsAloneFp64) {
  test::check_documents_match_separate(tiny_latte(GetParam()), Ctx{}, "fp64", kLayouts, 1e-10);
}

TEST_P(LatteDocuments, PackedWindowEqualsDocumentsAloneFp32) {
  test::check_documents_match_separate(tiny_latte(GetParam()), Ctx{}, "fp32", kLayouts, 2e-5);
}

TEST_P(LatteDocuments, DecodingAfterABoundaryStartsFresh) {
  test::check_document_decode(tiny_latte(GetParam()), Ctx{}, "fp64", 1e-10);
}

TEST_P(LatteDocuments, Supported) {
  const Model m(tiny_latte(GetParam()), Ctx{}, {.allocate = false});
  EXPECT_EQ(m.mixer_without_documents(), "");
}

INSTANTIATE_TEST_SUITE_P(Latte, LatteDocuments, ::testing::Values("vapor", "conv", "macchiato"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace linac::test_documents_latte
