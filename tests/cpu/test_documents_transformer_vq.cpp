// Document packing for Transformer-VQ (data.packing "document"; docs/transformer_vq.md §3.4): a
// packed window of documents against every document run alone (per-token losses and every
// parameter gradient, fp64 and fp32; one forward_backward each, so the EMA codebook buffers do not
// move between the runs), and decoding across a document boundary (prefill with bounds,
// start_document while another row decodes on). Tiny configs with blocks of 4 and 3 over T = 21:
// documents of one token, shorter than a block, starting exactly at a block boundary (8, 12),
// longer than two blocks (so their caches fill), and a row that is one document; one head, two heads.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"

namespace linac::test_documents_transformer_vq {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 4, 9}, {21}, {3, 1, 1, 3, 8, 5}};

struct VqCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<VqCase> cases() {
  ModelConfig one;  // test_model.cpp's tiny_vq
  one.arch = "transformer_vq";
  one.n_layers = 2;
  one.d_model = 12;
  one.n_heads = 1;
  one.vocab_size = 11;
  one.init_std = 0.3;
  one.embed_init_std = 1.0;
  one.final_norm = false;
  one.head_bias = true;
  one.mixer = {{"dk", 4}, {"dv", 8}, {"codebook", 5}, {"block", 4}, {"beta", 0.1}};
  ModelConfig two = one;
  two.mixer = {{"heads", 2}, {"dk", 3}, {"dv", 10}, {"codebook", 4}, {"block", 3}, {"beta", 0.1}};
  return {{"one head, blocks of 4", one}, {"two heads, blocks of 3", two}};
}

TEST(DocumentsTransformerVq, PackedWindowEqualsDocumentsAloneFp64) {
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp64", kLayouts, 1e-10);
  }
}

TEST(DocumentsTransformerVq, PackedWindowEqualsDocumentsAloneFp32) {
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp32", kLayouts, 2e-5);
  }
}

TEST(DocumentsTransformerVq, DecodingAfterABoundaryStartsFresh) {
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, Ctx{}, "fp64", 1e-10);
  }
}

}  // namespace
}  // namespace linac::test_documents_transformer_vq
