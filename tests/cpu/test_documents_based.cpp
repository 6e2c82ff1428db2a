// Document packing for Based (data.packing "document"; docs/based.md "Documents") on the CPU: a
// packed window of documents against each document run alone (per-token losses and every
// parameter gradient, fp64 and fp32) and decoding across a document boundary (prefill with
// bounds, start_document with another row decoding on), through all three of its mixers: the
// BaseConv filter (widths 3 and 4: documents of one and two tokens are shorter than it), the
// Taylor linear attention (chunks of 8: documents shorter than a chunk, starting exactly on a
// chunk boundary, spanning chunks) and the sliding window; a batched prefill whose rows end in
// documents shorter than the filter and longer (the BaseConv state is then built row by row)
// continues decoding as each last document prefilled alone (check_document_decode).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "document_checks.h"
#include "model_checks.h"

namespace linac::test_documents_based {
namespace {

// T = 21: documents of one token, shorter than a chunk, starting at the chunk boundaries 8 and
// 16, a row that is one document.
const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 5, 8}, {21}, {3, 1, 1, 3, 8, 5}, {2, 6, 13}};

struct BasedCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<BasedCase> cases() {
  ModelConfig based = test::tiny_model(4, 16, 2, 11, 32, "based");
  based.init_std = 0.3;
  based.tie_embeddings = true;
  based.layers = {"base_conv", "taylor", "sliding_window", "base_conv"};
  based.mixers = {{"taylor", {{"feature_dim", 3}, {"chunk", 8}}},
                  {"sliding_window", {{"window", 4}}},
                  {"base_conv", {{"expand", 2}, {"kernel_size", 3}}}};
  ModelConfig other = based;  // Taylor first, Dv not d / H, a width-4 filter without activation
  other.tie_embeddings = false;
  other.layers = {"taylor", "base_conv", "sliding_window", "taylor"};
  other.mixers["taylor"] = {{"feature_dim", 4}, {"chunk", 4}, {"head_dim", 5}};
  other.mixers["base_conv"] = {{"expand", 2}, {"kernel_size", 4}, {"activation", "none"}};
  return {{"based", based}, {"based_taylor_first_w4", other}};
}

TEST(DocumentsBased, PackedWindowEqualsDocumentsAloneFp64) {
  for (const BasedCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp64", kLayouts, 1e-10);
  }
}

TEST(DocumentsBased, PackedWindowEqualsDocumentsAloneFp32) {
  for (const BasedCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp32", kLayouts, 2e-5);
  }
}

TEST(DocumentsBased, DecodingAfterABoundaryStartsFresh) {
  for (const BasedCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, Ctx{}, "fp64", 1e-10);
  }
}

}  // namespace
}  // namespace linac::test_documents_based
