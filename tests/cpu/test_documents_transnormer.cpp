// Document packing for TransNormerLLM (data.packing "document"; docs/transnormer.md §4.5): a packed
// window of documents against every document run alone (per-token losses and every parameter
// gradient, fp64 and fp32), and decoding across a document boundary (prefill with bounds,
// start_document while another row decodes on at another LRPE position). Tiny configs with blocks
// of 8 and 4 over T = 21: documents of one token, shorter than a block, starting exactly at a block
// boundary (8, 16), and a row that is one document; LRPE in the first layer or in every layer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"

namespace linac::test_documents_transnormer {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 5, 8}, {21}, {3, 1, 1, 3, 8, 5}};

struct TnlCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<TnlCase> cases() {
  ModelConfig tnl = test::tiny_model(2, 12, 2, 11, 20, "transnormer");  // dh = 6; layer 0 has LRPE (Dk = 12)
  tnl.init_std = 0.3;
  tnl.norm_eps = 1e-6;
  tnl.tie_embeddings = true;
  tnl.mixer = {{"block", 8}};
  ModelConfig all = tnl;  // LRPE in every layer, blocks of 4, the paper's decay
  all.tie_embeddings = false;
  all.mixer = {{"block", 4}, {"lrpe", "all"}, {"decay", "paper"}};
  return {{"block 8", tnl}, {"block 4, LRPE everywhere, paper decay", all}};
}

TEST(DocumentsTransnormer, PackedWindowEqualsDocumentsAloneFp64) {
  for (const TnlCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp64", kLayouts, 1e-10);
  }
}

TEST(DocumentsTransnormer, PackedWindowEqualsDocumentsAloneFp32) {
  for (const TnlCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp32", kLayouts, 2e-5);
  }
}

TEST(DocumentsTransnormer, DecodingAfterABoundaryStartsFresh) {
  for (const TnlCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, Ctx{}, "fp64", 1e-10);
  }
}

}  // namespace
}  // namespace linac::test_documents_transnormer
