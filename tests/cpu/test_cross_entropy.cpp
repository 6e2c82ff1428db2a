// Fused cross-entropy CPU reference: loss formula, gradient check, ignored rows, in place,
// bad targets, large logits, hits (argmax == target).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cross_entropy/cross_entropy.h"
#include "test_util.h"

namespace linac::test_cross_entropy {
namespace {

OwnedTensor make_targets(const std::vector<int32_t>& ids) {
  OwnedTensor t(DType::I32, Device::CPU, {static_cast<int64_t>(ids.size())});
  std::copy(ids.begin(), ids.end(), t->data<int32_t>());
  return t;
}

TEST(CrossEntropyCpu, LossMatchesFormula) {
  const int64_t n = 7, v = 129;
  OwnedTensor logits = test::random_tensor({n, v}, DType::F64, 1, -5, 5);
  OwnedTensor targets = make_targets({0, 128, 5, 64, 5, 1, 100});
  OwnedTensor dl(DType::F64, Device::CPU, {n, v}), losses(DType::F64, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, 1.f);
  const double* x = logits->data<double>();
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[i * v + j]);
    EXPECT_NEAR(losses->data<double>()[i], std::log(s) - x[i * v + targets->data<int32_t>()[i]], 1e-12);
  }
}

TEST(CrossEntropyCpu, GradCheckDouble) {
  const int64_t n = 7, v = 129;
  const float scale = 0.37f;
  OwnedTensor logits = test::random_tensor({n, v}, DType::F64, 2, -3, 3);
  OwnedTensor targets = make_targets({3, 0, 128, 77, 3, -1, 42});
  auto loss = [&] {
    OwnedTensor dl(DType::F64, Device::CPU, {n, v}), losses(DType::F64, Device::CPU, {n});
    cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, scale);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += losses->data<double>()[i];
    return l * scale;
  };
  OwnedTensor dl(DType::F64, Device::CPU, {n, v}), losses(DType::F64, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, scale);
  // Softmax entries are as small as 1e-4 next to a loss of ~15: h = 1e-4 keeps the difference
  // quotient's rounding error (~eps * loss / h) well below them.
  EXPECT_LT(test::check_grad(loss, logits->data<double>(), dl->data<double>(), static_cast<size_t>(n * v), 200, 7,
                             1e-4),
            1e-6);
}

TEST(CrossEntropyCpu, IgnoredRowsHaveNoLossOrGradient) {
  const int64_t n = 5, v = 33;
  OwnedTensor logits = test::random_tensor({n, v}, DType::F64, 3, -3, 3);
  OwnedTensor targets = make_targets({-1, 4, -100, 32, -1});
  OwnedTensor dl(DType::F64, Device::CPU, {n, v}), losses(DType::F64, Device::CPU, {n});
  test::poison(dl);
  test::poison(losses);
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, 0.5f);
  for (int64_t i : {0, 2, 4}) {
    EXPECT_EQ(losses->data<double>()[i], 0.0);
    for (int64_t j = 0; j < v; ++j) ASSERT_EQ(dl->data<double>()[i * v + j], 0.0);
  }
  for (int64_t i : {1, 3}) {
    EXPECT_GT(losses->data<double>()[i], 0.0);
    double row = 0;  // softmax sums to one, minus the one-hot
    for (int64_t j = 0; j < v; ++j) row += dl->data<double>()[i * v + j];
    EXPECT_NEAR(row, 0.0, 1e-14);
  }
}

TEST(CrossEntropyCpu, InPlaceEqualsOutOfPlace) {
  const int64_t n = 7, v = 129;
  for (DType dt : {DType::F32, DType::F64}) {
    OwnedTensor logits = test::random_tensor({n, v}, dt, 4, -3, 3);
    OwnedTensor targets = make_targets({1, -1, 2, 128, 0, 64, 64});
    OwnedTensor dl(dt, Device::CPU, {n, v}), l1(dt, Device::CPU, {n}), l2(dt, Device::CPU, {n});
    cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, l1, 0.25f);
    cross_entropy_fwd_bwd(Ctx{}, logits, targets, logits, l2, 0.25f);
    EXPECT_EQ(to_doubles(logits), to_doubles(dl));
    EXPECT_EQ(to_doubles(l2), to_doubles(l1));
  }
}

// Accuracy by hand: a hit is the target being the first index of its row's maximum.
TEST(CrossEntropyCpu, HitsAreFirstArgmax) {
  const int64_t v = 4;
  const std::vector<double> rows = {
      0.1, 2.0, -1.0, 0.5,   // argmax 1: target 1 hits
      0.1, 2.0, -1.0, 0.5,   // target 3 misses
      3.0, 1.0, 3.0, 0.0,    // tie between 0 and 2: target 2 misses (argmax takes the first)
      3.0, 1.0, 3.0, 0.0,    // target 0 hits
      1.0, 1.0, 1.0, 1.0,    // equal logits: only target 0 would hit; target 2 misses
      -5.0, -4.0, -3.0, -2.0,  // ignored row, even though its target would be the argmax
      -5.0, -4.0, -3.0, 7.0,   // target 3 hits
  };
  const std::vector<int32_t> ids = {1, 3, 2, 0, 2, -1, 3};
  const std::vector<double> expected = {1, 0, 0, 1, 0, 0, 1};
  const int64_t n = static_cast<int64_t>(ids.size());
  OwnedTensor logits(DType::F64, Device::CPU, {n, v});
  std::copy(rows.begin(), rows.end(), logits->data<double>());
  OwnedTensor targets = make_targets(ids);
  OwnedTensor dl(DType::F64, Device::CPU, {n, v}), losses(DType::F64, Device::CPU, {n}), hits(DType::F64, Device::CPU, {n});
  test::poison(hits);
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, 1.f, hits);
  EXPECT_EQ(to_doubles(hits), expected);
  // The losses and gradients do not depend on whether hits are asked for.
  OwnedTensor dl2(DType::F64, Device::CPU, {n, v}), losses2(DType::F64, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl2, losses2, 1.f);
  EXPECT_EQ(to_doubles(losses), to_doubles(losses2));
  EXPECT_EQ(to_doubles(dl), to_doubles(dl2));
}

TEST(CrossEntropyCpu, TargetOutsideVocabularyThrows) {
  OwnedTensor logits = test::random_tensor({2, 9}, DType::F64, 5);
  OwnedTensor targets = make_targets({1, 9});
  OwnedTensor dl(DType::F64, Device::CPU, {2, 9}), losses(DType::F64, Device::CPU, {2});
  EXPECT_THROW(cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl, losses, 1.f), Error);
}

TEST(CrossEntropyCpu, LargeLogitsAreShiftInvariant) {
  const int64_t n = 3, v = 50;
  OwnedTensor logits = test::random_tensor({n, v}, DType::F32, 6, -3, 3);
  OwnedTensor shifted = to(logits, Device::CPU, DType::F32);
  for (int64_t i = 0; i < n * v; ++i) shifted->data<float>()[i] += 1000.f;
  OwnedTensor targets = make_targets({0, 10, 49});
  OwnedTensor dl1(DType::F32, Device::CPU, {n, v}), dl2(DType::F32, Device::CPU, {n, v});
  OwnedTensor l1(DType::F32, Device::CPU, {n}), l2(DType::F32, Device::CPU, {n});
  cross_entropy_fwd_bwd(Ctx{}, logits, targets, dl1, l1, 1.f);
  cross_entropy_fwd_bwd(Ctx{}, shifted, targets, dl2, l2, 1.f);
  // The shifted logits lose their low bits to rounding (ulp(1000) = 6e-5).
  EXPECT_LT(test::max_abs_diff(to_doubles(l2), to_doubles(l1)), 1e-3);
  EXPECT_LT(test::max_abs_diff(to_doubles(dl2), to_doubles(dl1)), 1e-4);
}

}  // namespace
}  // namespace linac::test_cross_entropy
