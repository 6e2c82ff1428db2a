// Shared by the Taylor-attention CPU forms (the chunked twin and the quadratic reference).
#pragma once

#include <cstdint>

#include "taylor_attn/taylor_attn.h"

namespace linac::taylor_cpu {

// One (batch, head) pair's rows: row(x, s, t, D) is token t of tensor x.
struct Pair {
  int64_t b, h;
  template <class P>
  P* row(P* base, const TaylorAttnLayout::Strides& s, int64_t t, int64_t D) const {
    return base + b * s.b + t * s.t + h * D;
  }
};

}  // namespace linac::taylor_cpu
