// Document packing for Based (data.packing "document"; docs/based.md "Documents") on the CPU: a
// packed window of documents against each document run alone (per-token losses and every
// parameter gradient, fp64 and fp32) and decoding across a document boundary (prefill with
// bounds, start_document with another row decoding on), through all three of its mixers: the
// BaseConv filter (widths 3 and 4: documents of one and two tokens are shorter than it), the
// Taylor linear attention (chunks of 8: documents shorter than a chunk, starting exactly on a
// chunk boundary, spanning chunks) and the sliding window. A batched prefill whose rows end in
// documents of one, two and nine tokens (shorter than the filter, and not: the BaseConv state is
// then built row by row) continues decoding as each last document prefilled alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "data/documents.h"
#include "document_checks.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

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

// Logits of prefilling `prompt` (rows of one length; with bounds from its EOS tokens when `docs`)
// and then decoding `more` (rows of one length), [B, 1 + more, V] in order.
std::vector<double> prefill_and_decode(Model& m, const std::vector<std::vector<int32_t>>& prompt,
                                       const std::vector<std::vector<int32_t>>& more, bool docs) {
  const auto B = static_cast<int64_t>(prompt.size()), T = static_cast<int64_t>(prompt[0].size());
  const auto n = static_cast<int64_t>(more[0].size());
  const int64_t V = m.config().vocab_size;
  OwnedTensor tok(DType::I32, Device::CPU, {B, T}), bounds(DType::I32, Device::CPU, {2, B, T});
  for (int64_t b = 0; b < B; ++b) std::copy_n(prompt[static_cast<size_t>(b)].begin(), T, tok->data<int32_t>() + b * T);
  doc_bounds_from_tokens(tok->data<int32_t>(), B, T, test::kTestEos, bounds->data<int32_t>());
  Model::DecodeState st = m.init_decode(B);
  OwnedTensor logits(DType::F64, Device::CPU, {B, V}), step(DType::I32, Device::CPU, {B});
  std::vector<std::vector<double>> rows(static_cast<size_t>(B));
  auto keep = [&] {
    const std::vector<double> l = to_doubles(logits);
    for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)].insert(rows[static_cast<size_t>(b)].end(), l.begin() + b * V, l.begin() + (b + 1) * V);
  };
  m.prefill(st, tok, logits, docs ? bounds.t : Tensor());
  keep();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < B; ++b) step->data<int32_t>()[b] = more[static_cast<size_t>(b)][static_cast<size_t>(t)];
    m.decode_step(st, step, logits);
    keep();
  }
  std::vector<double> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(DocumentsBased, PrefillLeavesEachRowItsLastDocument) {
  for (const BasedCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Model m(c.cfg, Ctx{}, {.precision = "fp64"});
    m.init_params(21);
    test::perturb_special_init(m.params());
    m.params().refresh_compute(Ctx{});
    const int32_t E = test::kTestEos;
    // Last documents of 1, 2 and 9 tokens.
    const std::vector<std::vector<int32_t>> prompt = {
        {5, 6, 7, 8, 9, 4, 5, E, 10}, {7, 7, 8, 9, 4, 5, E, 6, 9}, {4, 5, 6, 7, 8, 9, 10, 4, 5}};
    const std::vector<std::vector<int32_t>> more = {{4, 6, 8, 10}, {5, 7, 9, 4}, {10, 9, 8, 7}};
    const std::vector<double> got = prefill_and_decode(m, prompt, more, true);
    const int64_t per_row = static_cast<int64_t>(more[0].size() + 1) * c.cfg.vocab_size;
    for (size_t b = 0; b < prompt.size(); ++b) {
      SCOPED_TRACE("row " + std::to_string(b));
      auto last = prompt[b].end();
      auto first = last;
      while (first != prompt[b].begin() && *(first - 1) != E) --first;
      const std::vector<double> want = prefill_and_decode(m, {{first, last}}, {more[b]}, false);
      const std::vector<double> row(got.begin() + static_cast<int64_t>(b) * per_row, got.begin() + static_cast<int64_t>(b + 1) * per_row);
      EXPECT_LE(test::max_abs_diff(row, want), 1e-10);
    }
  }
}

}  // namespace
}  // namespace linac::test_documents_based
