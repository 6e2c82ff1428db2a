// The Latte op tests' input layout: a | b | v | local (Macchiato only) | pad columns (one by
// default, so no view is contiguous), one [B, T, W] buffer whose strided per-head views are what
// the model passes the op. Macchiato's a has one more column per head (the local attention's
// logit, La = L + 1).
#pragma once

#include "test_util.h"

namespace linac::test {

struct LatteLayout {
  int64_t H, L, Dv, La, W;
  bool mac;

  LatteLayout(int64_t h, int64_t l, int64_t dv, bool macchiato, int64_t pad = 1)
      : H(h),
        L(l),
        Dv(dv),
        La(macchiato ? l + 1 : l),
        W(h * (La + l + dv + (macchiato ? dv : 0)) + pad),
        mac(macchiato) {}

  Tensor a(const Tensor& x) const { return bthd(x, 0, H, La); }
  Tensor b(const Tensor& x) const { return bthd(x, H * La, H, L); }
  Tensor v(const Tensor& x) const { return bthd(x, H * (La + L), H, Dv); }
  Tensor local(const Tensor& x) const { return mac ? bthd(x, H * (La + L + Dv), H, Dv) : Tensor(); }
};

}  // namespace linac::test
