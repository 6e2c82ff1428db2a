// RMSNorm CPU reference: forward against the formula, backward against finite differences.
#include <cmath>

#include "core/gpu.h"
#include "rmsnorm/rmsnorm.h"
#include "test_util.h"

namespace linac::test_rmsnorm {
namespace {

// loss = sum(y * u) for a fixed random u, so every output element carries gradient.
struct RmsnormProblem {
  int64_t rows, dim;
  OwnedTensor x, w, u;
  RmsnormProblem(int64_t r, int64_t d)
      : rows(r), dim(d),
        x(test::random_tensor({r, d}, DType::F64, 1, -2.0, 2.0)),
        w(test::random_tensor({d}, DType::F64, 2, 0.5, 1.5)),
        u(test::random_tensor({r, d}, DType::F64, 3)) {}
  double loss() {
    OwnedTensor y(DType::F64, Device::CPU, {rows, dim}), rstd(DType::F64, Device::CPU, {rows});
    rmsnorm_fwd(Ctx{}, x, w, y, rstd, 1e-5f);
    double l = 0;
    for (int64_t i = 0; i < rows * dim; ++i) l += y->data<double>()[i] * u->data<double>()[i];
    return l;
  }
};

TEST(RmsnormCpu, ForwardMatchesFormula) {
  RmsnormProblem p(3, 37);
  OwnedTensor y(DType::F64, Device::CPU, {3, 37}), rstd(DType::F64, Device::CPU, {3});
  rmsnorm_fwd(Ctx{}, p.x, p.w, y, rstd, 1e-5f);
  const double* x = p.x->data<double>();
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < 37; ++j) ss += x[r * 37 + j] * x[r * 37 + j];
    const double rs = 1 / std::sqrt(ss / 37 + 1e-5);
    for (int64_t j = 0; j < 37; ++j)
      EXPECT_NEAR(y->data<double>()[r * 37 + j], x[r * 37 + j] * rs * p.w->data<double>()[j], 1e-12);
  }
}

TEST(RmsnormCpu, GradCheckDouble) {
  for (int64_t dim : {37, 64, 130}) {
    RmsnormProblem p(5, dim);
    OwnedTensor y(DType::F64, Device::CPU, {5, dim}), rstd(DType::F64, Device::CPU, {5});
    rmsnorm_fwd(Ctx{}, p.x, p.w, y, rstd, 1e-5f);
    // dx starts non-zero to check that the backward accumulates.
    OwnedTensor dx = test::random_tensor({5, dim}, DType::F64, 9);
    std::vector<double> dx0 = to_doubles(dx);
    OwnedTensor dw(DType::F64, Device::CPU, {dim});
    zero_tensor(dw);
    rmsnorm_bwd(Ctx{}, p.x, p.w, rstd, p.u, dx, dw);
    std::vector<double> gx = to_doubles(dx);
    for (size_t i = 0; i < gx.size(); ++i) gx[i] -= dx0[i];
    auto loss = [&] { return p.loss(); };
    EXPECT_LT(test::check_grad(loss, p.x->data<double>(), gx.data(), gx.size()), 1e-6) << "dim " << dim;
    EXPECT_LT(test::check_grad(loss, p.w->data<double>(), dw->data<double>(), dim), 1e-6) << "dim " << dim;
  }
}

// The residual add normalises h = x + add and writes h; dx_copy gets the accumulated dx. The
// other results are those of the plain calls.
TEST(RmsnormCpu, ResidualAddAndCopy) {
  RmsnormProblem p(4, 48);
  OwnedTensor add = test::random_tensor({4, 48}, DType::F64, 8), sum(DType::F64, Device::CPU, {4, 48});
  const std::vector<double> xv = to_doubles(p.x), av = to_doubles(add);
  for (size_t i = 0; i < xv.size(); ++i) sum->data<double>()[i] = xv[i] + av[i];
  OwnedTensor y(DType::F64, Device::CPU, {4, 48}), rstd(DType::F64, Device::CPU, {4});
  OwnedTensor y2(DType::F64, Device::CPU, {4, 48}), rstd2(DType::F64, Device::CPU, {4});
  OwnedTensor h(DType::F64, Device::CPU, {4, 48});
  test::poison(h);
  rmsnorm_fwd(Ctx{}, sum, p.w, y, rstd, 1e-5f);
  rmsnorm_fwd(Ctx{}, p.x, p.w, y2, rstd2, 1e-5f, add, h);
  EXPECT_EQ(to_doubles(y2), to_doubles(y));
  EXPECT_EQ(to_doubles(rstd2), to_doubles(rstd));
  EXPECT_EQ(to_doubles(h), to_doubles(sum));
  EXPECT_EQ(to_doubles(p.x), xv);                                            // x is read only
  EXPECT_THROW(rmsnorm_fwd(Ctx{}, p.x, p.w, y2, rstd2, 1e-5f, add), Error);  // add without h
  OwnedTensor dx = test::random_tensor({4, 48}, DType::F64, 9), dx2 = test::random_tensor({4, 48}, DType::F64, 9);
  OwnedTensor dw(DType::F64, Device::CPU, {48}), dw2(DType::F64, Device::CPU, {48});
  OwnedTensor dx_copy(DType::F64, Device::CPU, {4, 48});
  zero_tensor(dw);
  zero_tensor(dw2);
  rmsnorm_bwd(Ctx{}, p.x, p.w, rstd, p.u, dx, dw);
  rmsnorm_bwd(Ctx{}, p.x, p.w, rstd, p.u, dx2, dw2, dx_copy);
  EXPECT_EQ(to_doubles(dx2), to_doubles(dx));
  EXPECT_EQ(to_doubles(dx_copy), to_doubles(dx));
  EXPECT_EQ(to_doubles(dw2), to_doubles(dw));
}

// The CPU kernels are instantiated for f32 and f64 only: any other dtype is refused by the dtype
// dispatch with a message naming what they take and what they got.
TEST(RmsnormCpu, Bf16IsRefusedByTheDispatch) {
  OwnedTensor x(DType::BF16, Device::CPU, {2, 8}), w(DType::BF16, Device::CPU, {8});
  OwnedTensor y(DType::BF16, Device::CPU, {2, 8}), rstd(DType::BF16, Device::CPU, {2});
  try {
    rmsnorm_fwd(Ctx{}, x, w, y, rstd, 1e-5f);
    ADD_FAILURE() << "rmsnorm_fwd took bf16 on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU kernels take f32 or f64, got bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace linac::test_rmsnorm
