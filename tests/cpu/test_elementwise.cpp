// Elementwise ops, CPU reference.
#include "elementwise/elementwise.h"
#include "test_util.h"

namespace linac::test_elementwise {
namespace {

TEST(ElementwiseCpu, AddInplace) {
  for (DType dt : {DType::F32, DType::F64}) {
    OwnedTensor dst = test::random_tensor({1000003}, dt, 1), src = test::random_tensor({1000003}, dt, 2);
    const std::vector<double> d0 = to_doubles(dst), s0 = to_doubles(src);
    add_inplace(Ctx{}, dst, src, -0.75f);
    std::vector<double> expect(d0.size());
    for (size_t i = 0; i < d0.size(); ++i) expect[i] = d0[i] - 0.75 * s0[i];
    EXPECT_LT(test::rel_error(to_doubles(dst), expect), dt == DType::F32 ? 1e-7 : 1e-15);
  }
}

TEST(ElementwiseCpu, ScaleInplace) {
  OwnedTensor x = test::random_tensor({7, 37}, DType::F64, 3);
  const std::vector<double> x0 = to_doubles(x);
  scale_inplace(Ctx{}, x, 0.125f);
  const std::vector<double> x1 = to_doubles(x);
  for (size_t i = 0; i < x0.size(); ++i) EXPECT_EQ(x1[i], x0[i] * 0.125);
}

TEST(ElementwiseCpu, CastBetweenFloatAndDouble) {
  OwnedTensor d = test::random_tensor({1001}, DType::F64, 4);
  OwnedTensor f(DType::F32, Device::CPU, {1001}), back(DType::F64, Device::CPU, {1001});
  cast(Ctx{}, f, d);
  cast(Ctx{}, back, f);
  for (int64_t i = 0; i < 1001; ++i) {
    EXPECT_EQ(f->data<float>()[i], static_cast<float>(d->data<double>()[i]));
    EXPECT_EQ(back->data<double>()[i], static_cast<double>(f->data<float>()[i]));
  }
  OwnedTensor copy(DType::F64, Device::CPU, {1001});
  cast(Ctx{}, copy, d);
  EXPECT_EQ(to_doubles(copy), to_doubles(d));
}

// bf16 (gradients reduced in bf16 on CPU ranks) goes through the host conversion: nearest-even.
TEST(ElementwiseCpu, CastToAndFromBf16Rounds) {
  OwnedTensor f = test::random_tensor({1001}, DType::F32, 5);
  OwnedTensor h(DType::BF16, Device::CPU, {1001}), back(DType::F32, Device::CPU, {1001});
  cast(Ctx{}, h, f);
  cast(Ctx{}, back, h);
  int moved = 0;
  for (int64_t i = 0; i < 1001; ++i) {
    const float x = f->data<float>()[i];
    EXPECT_EQ(back->data<float>()[i], round_bf16(x));
    moved += back->data<float>()[i] != x;
  }
  EXPECT_GT(moved, 900);
}

}  // namespace
}  // namespace linac::test_elementwise
