// RoPE CPU reference: direct formula, strided qkv views, inverse, gradient check.
#include <cmath>

#include "rope/rope.h"
#include "test_util.h"

namespace linac::test_rope {
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

// Per-row positions (a decoding step's): row r rotated as by itself at pos0 = pos[r], forward and
// backward, including a T > 1 view (positions pos[r] + t).
TEST(RopeCpu, RowPositionsRotateEachRowAtItsOwn) {
  const int64_t b = 3, h = 2, d = 10;
  const std::vector<int32_t> pos = {0, 7, 1000};
  for (int64_t t : {1, 4})
    for (bool inverse : {false, true}) {
      SCOPED_TRACE("T " + std::to_string(t) + (inverse ? " backward" : " forward"));
      OwnedTensor x = test::random_tensor({b, t, h, d}, DType::F64, 3);
      const std::vector<double> in = to_doubles(x);
      const OwnedTensor p = test::int32_values(pos, Device::CPU);
      inverse ? rope_bwd(Ctx{}, x, kBase, p) : rope_fwd(Ctx{}, x, kBase, p);
      for (int64_t r = 0; r < b; ++r) {
        OwnedTensor row = test::random_tensor({1, t, h, d}, DType::F64, 3);
        std::copy(in.begin() + r * t * h * d, in.begin() + (r + 1) * t * h * d, row->data<double>());
        if (inverse)
          rope_bwd(Ctx{}, row, kBase, pos[static_cast<size_t>(r)]);
        else
          rope_fwd(Ctx{}, row, kBase, pos[static_cast<size_t>(r)]);
        EXPECT_EQ(to_doubles(row), test::view_values(x->narrow(0, r, 1))) << "row " << r;
      }
    }
  OwnedTensor x = test::random_tensor({b, 1, h, d}, DType::F64, 4);
  EXPECT_ANY_THROW(rope_fwd(Ctx{}, x, kBase, test::int32_values({1, 2}, Device::CPU))) << "a position per row";
  EXPECT_ANY_THROW(rope_fwd(Ctx{}, x, kBase, test::int32_values({1, -2, 0}, Device::CPU))) << "negative";
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
}  // namespace linac::test_rope

namespace linac::test_rope {
namespace {

// Llama 3's frequency scaling, against its definition (rope.h): wavelengths shorter than
// C / high_freq_factor keep their frequency, longer than C / low_freq_factor are stretched by
// `factor`, and the band between blends the two, continuously at both ends. Checked on Llama
// 3.1's settings (base 500000, D 128, factor 8, factors 1 and 4, C 8192), then through rope_fwd.
TEST(RopeCpu, Llama3ScalingKeepsHighDividesLowBlendsBetween) {
  RopeFreqs f(500000.0);
  f.factor = 8, f.low_freq_factor = 1, f.high_freq_factor = 4, f.original_context = 8192;
  const int64_t D = 128;
  const double kPi = 3.14159265358979323846;
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double plain = std::pow(500000.0, -2.0 * static_cast<double>(i) / D), wavelen = 2 * kPi / plain;
    const double scaled = f.inv_freq(D, i);
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled, plain) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_DOUBLE_EQ(scaled, plain / 8) << i;
      ++divided;
    } else {
      EXPECT_GT(scaled, plain / 8) << i;
      EXPECT_LT(scaled, plain) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // Continuity: just inside the band the blend is (almost) its neighbour's rule.
  RopeFreqs edge = f;
  edge.original_context = 2 * kPi / std::pow(500000.0, -2.0 * 40 / D) * 4 * (1 + 1e-9);  // pair 40 at C/h
  EXPECT_NEAR(edge.inv_freq(D, 40), std::pow(500000.0, -2.0 * 40 / D), 1e-8 * std::pow(500000.0, -2.0 * 40 / D));
  EXPECT_EQ(RopeFreqs(500000.0).inv_freq(D, 50), std::pow(500000.0, -2.0 * 50 / D));

  // rope_fwd rotates pair i by position * the scaled frequency.
  for (int64_t i : {int64_t{3}, int64_t{45}, int64_t{60}}) {
    OwnedTensor x(DType::F64, Device::CPU, {1, 1, 1, D});
    for (int64_t e = 0; e < D; ++e) x->data<double>()[e] = e == i ? 1.0 : 0.0;
    rope_fwd(Ctx{}, x, f, 3000);
    const double angle = 3000.0 * f.inv_freq(D, i);
    EXPECT_NEAR(x->data<double>()[i], std::cos(angle), 1e-12) << i;
    EXPECT_NEAR(x->data<double>()[i + D / 2], std::sin(angle), 1e-12) << i;
  }
}

}  // namespace
}  // namespace linac::test_rope
