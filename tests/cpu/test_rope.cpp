// RoPE CPU reference: direct formula, strided qkv views, inverse, gradient check.
#include <cmath>

#include "rope/rope.h"
#include "test_util.h"

namespace linac {
namespace {

constexpr double kBase = 10000.0;

// y = rope(x) for contiguous [B, T, H, D] x, straight from the definition.
std::vector<double> rope_direct(const std::vector<double>& x, int64_t b, int64_t t, int64_t h, int64_t d,
                                int64_t pos0) {
  std::vector<double> y(x.size());
  const int64_t half = d / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(pos0 + ti) * std::pow(kBase, -2.0 * i / d);
          const size_t o = static_cast<size_t>(((bi * t + ti) * h + hi) * d);
          const double x1 = x[o + i], x2 = x[o + i + half];
          y[o + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          y[o + i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
  return y;
}

TEST(RopeCpu, ForwardMatchesFormula) {
  const int64_t b = 2, t = 13, h = 3, d = 10;  // D/2 = 5 pairs: odd
  for (int64_t pos0 : {0, 7, 1000}) {
    OwnedTensor x = test::random_tensor({b, t, h, d}, DType::F64, 1);
    const std::vector<double> expect = rope_direct(to_doubles(x), b, t, h, d, pos0);
    rope_fwd(Ctx{}, x, kBase, pos0);
    EXPECT_LT(test::max_abs_diff(to_doubles(x), expect), 1e-12) << "pos0 " << pos0;
  }
}

TEST(RopeCpu, StridedQkvViewRotatesOnlyItsSlice) {
  const int64_t b = 2, t = 13, h = 3, d = 10;
  OwnedTensor qkv = test::random_tensor({b, t, 3, h, d}, DType::F64, 2);
  const std::vector<double> before = to_doubles(qkv);
  Tensor q = qkv.t.select(2, 0), k = qkv.t.select(2, 1);
  rope_fwd(Ctx{}, q, kBase, 5);
  rope_fwd(Ctx{}, k, kBase, 5);
  const std::vector<double> after = to_doubles(qkv);
  for (int s = 0; s < 3; ++s) {
    std::vector<double> in, out;
    for (int64_t bt = 0; bt < b * t; ++bt)
      for (int64_t e = 0; e < h * d; ++e) {
        const size_t o = static_cast<size_t>((bt * 3 + s) * h * d + e);
        in.push_back(before[o]);
        out.push_back(after[o]);
      }
    if (s == 2)
      EXPECT_EQ(out, in) << "v must be untouched";
    else
      EXPECT_LT(test::max_abs_diff(out, rope_direct(in, b, t, h, d, 5)), 1e-12) << "slice " << s;
  }
}

TEST(RopeCpu, BackwardInvertsForward) {
  OwnedTensor x = test::random_tensor({2, 13, 3, 64}, DType::F64, 3);
  const std::vector<double> x0 = to_doubles(x);
  rope_fwd(Ctx{}, x, kBase, 100);
  rope_bwd(Ctx{}, x, kBase, 100);
  EXPECT_LT(test::max_abs_diff(to_doubles(x), x0), 1e-13);
}

TEST(RopeCpu, GradCheckDouble) {
  const int64_t b = 2, t = 13, h = 3, d = 10;
  OwnedTensor x = test::random_tensor({b, t, h, d}, DType::F64, 4);
  OwnedTensor u = test::random_tensor({b, t, h, d}, DType::F64, 5);
  auto loss = [&] {
    OwnedTensor y(DType::F64, Device::CPU, {b, t, h, d});
    copy_tensor(y, x);
    rope_fwd(Ctx{}, y, kBase, 3);
    double l = 0;
    for (int64_t i = 0; i < y->numel(); ++i) l += y->data<double>()[i] * u->data<double>()[i];
    return l;
  };
  OwnedTensor dx(DType::F64, Device::CPU, {b, t, h, d});
  copy_tensor(dx, u);
  rope_bwd(Ctx{}, dx, kBase, 3);
  EXPECT_LT(test::check_grad(loss, x->data<double>(), dx->data<double>(), static_cast<size_t>(x->numel())), 1e-6);
}

TEST(RopeCpu, FloatMatchesDouble) {
  OwnedTensor x = test::random_tensor({2, 13, 3, 64}, DType::F64, 6);
  OwnedTensor xf = to(x, Device::CPU, DType::F32);
  rope_fwd(Ctx{}, x, kBase, 17);
  rope_fwd(Ctx{}, xf, kBase, 17);
  EXPECT_LT(test::rel_error(xf, x), 1e-5);
}

}  // namespace
}  // namespace linac
