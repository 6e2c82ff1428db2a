// The attention projection with RoPE (rope_linear.h) on the CPU: y = x W^T with n_rot columns from
// r0 on rotated per head at the position row % T, against the definition in double (no rotation,
// q and k rotated, every column rotated, q and k after v); the argument checks.
#include <cmath>
#include <utility>

#include "rope/rope_linear.h"
#include "test_util.h"

namespace linac::test_rope_linear {
namespace {

constexpr double kBase = 500.0;

std::vector<double> direct(const std::vector<double>& x, const std::vector<double>& w, int64_t n, int64_t k, int64_t m,
                           int64_t t, int64_t r0, int64_t n_rot, int64_t d) {
  std::vector<double> y(static_cast<size_t>(n * m));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < m; ++c) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += x[static_cast<size_t>(r * k + i)] * w[static_cast<size_t>(c * k + i)];
      y[static_cast<size_t>(r * m + c)] = s;
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h0 = r0; h0 < r0 + n_rot; h0 += d)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double angle = static_cast<double>(r % t) * std::pow(kBase, -2.0 * static_cast<double>(i) / d);
        double* p = y.data() + r * m + h0;
        const double x1 = p[i], x2 = p[i + d / 2];
        p[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
        p[i + d / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
  return y;
}

TEST(RopeLinearCpu, MatchesDefinition) {
  const int64_t t = 7, n = 3 * t, k = 10, d = 8, m = 6 * d;  // q, k, v of two heads each
  OwnedTensor x = test::random_tensor({n, k}, DType::F64, 1), w = test::random_tensor({m, k}, DType::F64, 2);
  const std::pair<int64_t, int64_t> cols[] = {{0, 0}, {0, 4 * d}, {0, m}, {2 * d, 4 * d}};  // (r0, n_rot)
  for (const auto& [r0, n_rot] : cols) {
    OwnedTensor y(DType::F64, Device::CPU, {n, m});
    test::poison(y);
    rope_linear_fwd(Ctx{}, x, w, y, t, n_rot, d, kBase, {}, r0);
    EXPECT_LT(test::max_abs_diff(to_doubles(y), direct(to_doubles(x), to_doubles(w), n, k, m, t, r0, n_rot, d)), 1e-12)
        << "r0 " << r0 << " n_rot " << n_rot;
  }
}

TEST(RopeLinearCpu, RejectsBadArguments) {
  OwnedTensor x(DType::F64, Device::CPU, {12, 4}), w(DType::F64, Device::CPU, {16, 4}),
      y(DType::F64, Device::CPU, {12, 16});
  test::fill_random(x, 1);
  test::fill_random(w, 2);
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y, 5, 8, 4, kBase), Error);   // 12 rows are not sequences of 5
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 6, 4, kBase), Error);   // not whole heads
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 20, 4, kBase), Error);  // more than M
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 8, 4, kBase, {}, 2), Error);   // r0 not on a head
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 8, 4, kBase, {}, 12), Error);  // past M
  OwnedTensor y_bad(DType::F64, Device::CPU, {12, 12});
  EXPECT_THROW(rope_linear_fwd(Ctx{}, x, w, y_bad, 6, 8, 4, kBase), Error);
  EXPECT_NO_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 16, 4, kBase));
  EXPECT_NO_THROW(rope_linear_fwd(Ctx{}, x, w, y, 6, 8, 4, kBase, {}, 8));
}

}  // namespace
}  // namespace linac::test_rope_linear
