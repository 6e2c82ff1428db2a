// Document packing checks shared by the CPU and GPU suites: a window packed from several
// documents must give, token for token, what running each document alone gives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/gpu.h"

namespace linac::test {

constexpr int32_t kTestEos = 3;

// A [B, T] window whose row b holds documents of lengths[b] (summing to T), random tokens in
// [4, V) (never the EOS) with an EOS ending each document but the row's last (the window ends
// mid-document), and random targets.
struct PackedWindow {
  int64_t B = 0, T = 0;
  std::vector<std::vector<int64_t>> lengths;
  OwnedTensor tokens, targets, docs;  // CPU; docs [2, B, T] (data/documents.h)
};
PackedWindow packed_window(const std::vector<std::vector<int64_t>>& lengths, int64_t V, uint64_t seed);

// Builds cfg on ctx in `precision` (same initial weights for both runs) and expects the packed
// window's per-token losses and parameter gradients to match those of every document run alone
// as its own [1, length] sequence: max abs difference <= tol * (1 + max magnitude), losses and
// each parameter's gradient separately. Also that the bounds matter: without them some loss of
// a later document differs by more than ten times the packed-alone difference.
void check_documents_match_separate(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision,
                                    const std::vector<std::vector<int64_t>>& lengths, double tol);

// Decoding across a document boundary (cfg built on ctx in `precision`): prefill of [doc1 EOS doc2a] with document
// bounds, then decode_step through doc2b, gives the logits of prefilling doc2a alone and decoding
// doc2b; decoding doc1 EOS token by token, then start_document, then doc2 gives the logits of
// decoding doc2 from a fresh state, with a second row decoding one document undisturbed; and one
// prefill of three rows ending in documents of 1, 2 and 12 tokens decodes on, row by row, as each
// row's last document prefilled alone (the state each mixer hands over is its own document's).
void check_document_decode(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, double tol);

}  // namespace linac::test
