// Full reductions, CPU reference, against a long-double direct sum.
#include <cmath>
#include <limits>

#include "reduce/reduce.h"
#include "test_util.h"

namespace linac::test_reduce {
namespace {

TEST(ReduceCpu, MatchesDirectSums) {
  for (int64_t n : {1, 7, 1000, 1000003}) {
    for (DType dt : {DType::F32, DType::F64}) {
      OwnedTensor x = test::random_tensor({n}, dt, static_cast<uint64_t>(n), -1, 1.5);
      const std::vector<double> xv = to_doubles(x);
      long double s = 0, ss = 0;
      for (double e : xv) {
        s += e;
        ss += static_cast<long double>(e) * e;
      }
      OwnedTensor out(dt, Device::CPU, {1});
      sum(Ctx{}, x, out);
      // The f32 results are double sums rounded once to f32.
      const double tol = dt == DType::F32 ? 1e-7 : 1e-13;
      EXPECT_NEAR(to_doubles(out)[0], static_cast<double>(s), tol * std::fabs(static_cast<double>(s)))
          << "n " << n;
      sum_squares(Ctx{}, x, out);
      EXPECT_NEAR(to_doubles(out)[0], static_cast<double>(ss), tol * static_cast<double>(ss)) << "n " << n;
    }
  }
}

TEST(ReduceCpu, EmptyIsZero) {
  OwnedTensor x(DType::F64, Device::CPU, {0}), out(DType::F64, Device::CPU, {1});
  test::poison(out);
  sum_squares(Ctx{}, x, out);
  EXPECT_EQ(out->data<double>()[0], 0.0);
}

TEST(ReduceCpu, TakesAnyShape) {
  OwnedTensor x = test::random_tensor({3, 5, 7}, DType::F64, 1), out(DType::F64, Device::CPU, {1});
  sum(Ctx{}, x, out);
  double s = 0;
  for (double e : to_doubles(x)) s += e;
  EXPECT_NEAR(out->data<double>()[0], s, 1e-13);
}

// Infinities of both signs and NaNs scattered over random data, at the ends too, are each
// counted once; finite extremes (the largest value, denormals) are not.
TEST(ReduceCpu, CountsNonFinite) {
  for (DType dt : {DType::F32, DType::F64}) {
    for (int64_t n : {1, 257, 100003}) {
      OwnedTensor x = test::random_tensor({n}, dt, static_cast<uint64_t>(n) + 7, -2, 2);
      OwnedTensor out(dt, Device::CPU, {1});
      test::poison(out);
      count_nonfinite(Ctx{}, x, out);
      EXPECT_EQ(to_doubles(out)[0], 0.0) << "n " << n;
      const double specials[] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                 std::numeric_limits<double>::quiet_NaN()};
      int64_t expect = 0;
      for (int64_t i = 0; i < n; i += 1 + n / 5) {
        const double v = specials[expect % 3];
        if (dt == DType::F32) x->data<float>()[i] = static_cast<float>(v);
        else x->data<double>()[i] = v;
        ++expect;
      }
      if (n > 2) {  // the last element, and finite extremes that must not count
        if (dt == DType::F32) {
          x->data<float>()[n - 1] = -std::numeric_limits<float>::infinity();
          x->data<float>()[n - 2] = std::numeric_limits<float>::max();
        } else {
          x->data<double>()[n - 1] = -std::numeric_limits<double>::infinity();
          x->data<double>()[n - 2] = std::numeric_limits<double>::denorm_min();
        }
        ++expect;
      }
      count_nonfinite(Ctx{}, x, out);
      EXPECT_EQ(to_doubles(out)[0], static_cast<double>(expect)) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace linac::test_reduce
