// Document packing on the GPU (data.packing "document"): for every architecture that supports it,
// a packed window against each document run alone (per-token losses and every parameter
// gradient, fp32 and bf16), and decoding across a document boundary. Shapes take the GPU paths:
// head dim 64 (the tensor-core attention kernels, RoPE fused into the projection on Hopper), GLA
// chunks of 64 with Dk 32 / Dv 64; T = 200 (ragged tiles and chunks) with documents of one token,
// shorter than a tile or chunk, starting exactly at 64 and 128, and a row that is one document.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

struct GpuDocCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<GpuDocCase> cases() {
  ModelConfig tf = test::tiny_model(2, 128, 2, 512, 352);
  tf.init_std = 0.05;
  ModelConfig window = tf;
  window.layers = {"sliding_window", "attention"};
  window.mixers = {{"sliding_window", {{"window", 48}}}};
  ModelConfig wide = tf;  // head dim 128
  wide.n_heads = 1;
  ModelConfig gla = test::tiny_model(2, 128, 2, 512, 352, "gla");
  gla.init_std = 0.05;
  return {{"transformer", tf}, {"transformer_window", window}, {"transformer_d128", wide}, {"gla", gla}};
}

TEST(DocumentsGpu, PackedWindowEqualsDocumentsAloneFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const GpuDocCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, g.ctx(), "fp32", kLayouts, 2e-4);
  }
}

TEST(DocumentsGpu, PackedWindowEqualsDocumentsAloneBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const GpuDocCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, g.ctx(), "bf16", kLayouts, 3e-2);
  }
}

TEST(DocumentsGpu, DecodingAfterABoundaryStartsFresh) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const GpuDocCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, g.ctx(), "fp32", 1e-4);
  }
}

}  // namespace
}  // namespace linac::test_documents_gpu
