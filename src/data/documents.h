// Document packing (data.packing "document", docs/data.md "Packing"): the document bounds of
// token windows, derived from their EOS tokens.
//
// A window's rows hold T input tokens each. The EOS that ends a document belongs to that document
// (its prediction of the next document's first token is made from its own document only); the
// token after an EOS starts a new document; a row's first token starts one (a window that opens
// mid-document starts that document's context there). For row b, token t (core/doc_bounds.h):
//   start[b, t] = t if t == 0 or tokens[b, t-1] == eos, else start[b, t-1]
//   end[b, t]   = one past the last token of t's document in the row
#pragma once

#include <cstdint>
#include <string>

#include "core/buffer.h"

namespace linac {

// Writes [2, B, T] int32 into out: B*T starts, then B*T ends.
void doc_bounds_from_tokens(const int32_t* tokens, int64_t B, int64_t T, int32_t eos, int32_t* out);

// The bounds of micro-batches, computed on the host and kept on a device for Model::forward_backward.
class DocBoundsBuffer {
 public:
  DocBoundsBuffer(Device dev, int64_t B, int64_t T, int32_t eos);
  // The bounds of host tokens [B', T'] (B' <= B, T' <= T, rows of T' tokens), uploaded; the
  // returned [2, B', T'] tensor is valid until the next call.
  Tensor compute(const int32_t* tokens, int64_t B, int64_t T);

 private:
  int32_t eos_;
  OwnedTensor host_, dev_;
};

// Mean document length of [B, T] windows with document packing: B*T over the number of document
// starts (each row's first token, and every token after an EOS within the row).
double mean_doc_length(const int32_t* tokens, int64_t B, int64_t T, int32_t eos);

}  // namespace linac
