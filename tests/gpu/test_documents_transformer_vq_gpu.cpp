// Document packing for Transformer-VQ on the GPU (data.packing "document"; docs/transformer_vq.md
// §3.4): a packed window against each document run alone (per-token losses and every parameter
// gradient, fp32 and bf16; one forward_backward each, so the EMA codebook buffers do not move),
// and decoding across a document boundary. Blocks of 64, T = 200 (a ragged last block) with
// documents of one token, shorter than a block, starting exactly at 64 and 128, longer than two
// blocks (their caches fill), and a row that is one document; one head of Dk 64, Dv 256, and two
// heads of Dk 32.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "document_checks.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_documents_transformer_vq_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

struct VqCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<VqCase> cases() {
  ModelConfig one;
  one.arch = "transformer_vq";
  one.n_layers = 2;
  one.d_model = 128;
  one.n_heads = 1;
  one.vocab_size = 512;
  one.init_std = 0.05;
  one.final_norm = false;
  one.head_bias = true;
  one.mixer = {{"dk", 64}, {"dv", 256}, {"codebook", 48}, {"block", 64}, {"beta", 0.1}};
  ModelConfig two = one;
  two.mixer = {{"heads", 2}, {"dk", 32}, {"dv", 128}, {"codebook", 16}, {"block", 64}, {"beta", 0.1}};
  return {{"one head", one}, {"two heads", two}};
}

TEST(DocumentsTransformerVqGpu, PackedWindowEqualsDocumentsAloneFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, g.ctx(), "fp32", kLayouts, 2e-4);
  }
}

TEST(DocumentsTransformerVqGpu, PackedWindowEqualsDocumentsAloneBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, g.ctx(), "bf16", kLayouts, 3e-2);
  }
}

TEST(DocumentsTransformerVqGpu, DecodingAfterABoundaryStartsFresh) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const VqCase& c : cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, g.ctx(), "fp32", 1e-4);
  }
}

}  // namespace
}  // namespace linac::test_documents_transformer_vq_gpu
