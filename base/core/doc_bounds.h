// Document boundaries of a packed [B, T] batch (data.packing "document", docs/data.md §"Packing").
// A window holds several documents back to back; each token's context starts at its document's
// first token. For the token at row b, index t:
//   start[b*T + t]  the index in row b of its document's first token (start <= t)
//   end[b*T + t]    one past the index of its document's last token in the row (end > t)
// so its context is tokens [start, t], its position t - start, and t is a document start when
// start == t. Both arrays are int32, row-major [B, T], on the device of the tensors they describe,
// and non-decreasing along t. Undefined (null) bounds mean one document per row (stream packing).
#pragma once

#include <cstdint>

namespace linac {

struct DocBounds {
  const int32_t* start = nullptr;
  const int32_t* end = nullptr;
  bool defined() const { return start != nullptr; }
};

}  // namespace linac
