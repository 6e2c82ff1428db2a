// What the VQ-attention GPU tests (stream and documents) share: the outputs of one forward and
// backward, and their comparison with a reference's.
#pragma once

#include <gtest/gtest.h>

#include "test_util.h"

namespace linac::test {

struct VqResult {
  OwnedTensor o, lse, grad, du, dvr, drho;  // grad: dq | dkhat | dv in the fused layout
};

// r against the reference ref by relative error: o and lse within tol_o (lse within tol_lse where
// that is given), every gradient within tol_grad; grad's dq | dkhat | dv columns are HK = H Dk, HK
// and HV = H Dv wide (the fused buffer's padding columns are never written).
inline void expect_vq_close(const VqResult& r, const VqResult& ref, int64_t HK, int64_t HV, double tol_o,
                            double tol_grad, double tol_lse = 0) {
  EXPECT_LT(rel_error(r.o, ref.o), tol_o) << "o";
  EXPECT_LT(rel_error(r.lse, ref.lse), tol_lse > 0 ? tol_lse : tol_o) << "lse";
  EXPECT_LT(rel_error(columns(r.grad, 0, HK), columns(ref.grad, 0, HK)), tol_grad) << "dq";
  EXPECT_LT(rel_error(columns(r.grad, HK, HK), columns(ref.grad, HK, HK)), tol_grad) << "dkhat";
  EXPECT_LT(rel_error(columns(r.grad, 2 * HK, HV), columns(ref.grad, 2 * HK, HV)), tol_grad) << "dv";
  EXPECT_LT(rel_error(r.du, ref.du), tol_grad) << "du";
  EXPECT_LT(rel_error(r.dvr, ref.dvr), tol_grad) << "dvr";
  EXPECT_LT(rel_error(r.drho, ref.drho), tol_grad) << "drho";
}

}  // namespace linac::test
