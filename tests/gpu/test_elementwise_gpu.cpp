// Elementwise CUDA ops vs the CPU reference (double) on the same rounded inputs, every dtype
// pair, aligned and misaligned views.
#include <vector>

#include "elementwise/elementwise.h"
#include "test_util.h"

namespace linac::test_elementwise_gpu {
namespace {

constexpr int64_t kN = 1000003;

// n elements of dtype dt at `offset` of a fresh device buffer, filled with random values.
struct DeviceSlice {
  OwnedTensor buf;
  Tensor t;
  std::vector<double> values;  // what the device holds, in double
  DeviceSlice(DType dt, int64_t offset, uint64_t seed) : buf(dt, Device::CUDA, {kN + offset}) {
    t = buf.t.narrow(0, offset, kN);
    OwnedTensor host = test::random_tensor({kN}, dt, seed);
    copy_tensor(t, host);
    values = to_doubles(host);
  }
};

TEST(ElementwiseGpu, AddInplace) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType dd : {DType::F32, DType::BF16})
    for (DType sd : {DType::F32, DType::BF16})
      for (auto [od, os] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{0, 1}}) {
        DeviceSlice dst(dd, od, 1), src(sd, os, 2);
        add_inplace(gctx.ctx(), dst.t, src.t, -0.37f);
        gctx.synchronize();
        std::vector<double> expect(dst.values);
        for (size_t i = 0; i < expect.size(); ++i) expect[i] += static_cast<double>(-0.37f) * src.values[i];
        // f32 results round once (~6e-8); bf16 results round to 8 bits (~2e-3).
        EXPECT_LT(test::rel_error(to_doubles(dst.t), expect), dd == DType::F32 ? 1e-6 : 1e-2)
            << dtype_name(dd) << " += " << dtype_name(sd) << " offsets " << od << "," << os;
      }
}

TEST(ElementwiseGpu, CastRoundsToNearestEven) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (auto [od, os] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{0, 1}}) {
    DeviceSlice f(DType::F32, os, 3), b(DType::BF16, od, 4);
    test::poison(b.t);
    cast(gctx.ctx(), b.t, f.t);
    gctx.synchronize();
    const std::vector<double> got = to_doubles(b.t);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], round_bf16(static_cast<float>(f.values[i]))) << "element " << i;
    DeviceSlice back(DType::F32, os, 5);
    cast(gctx.ctx(), back.t, b.t);
    gctx.synchronize();
    EXPECT_EQ(to_doubles(back.t), got);
  }
}

TEST(ElementwiseGpu, CastSameDtypeCopies) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceSlice src(dt, 1, 6), dst(dt, 0, 7);
    cast(gctx.ctx(), dst.t, src.t);
    gctx.synchronize();
    EXPECT_EQ(to_doubles(dst.t), src.values);
  }
}

TEST(ElementwiseGpu, ScaleInplace) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t offset : {0, 1}) {
      DeviceSlice x(dt, offset, 8);
      scale_inplace(gctx.ctx(), x.t, 0.3f);
      gctx.synchronize();
      std::vector<double> expect(x.values);
      for (double& e : expect) e *= static_cast<double>(0.3f);
      EXPECT_LT(test::rel_error(to_doubles(x.t), expect), dt == DType::F32 ? 1e-6 : 1e-2)
          << dtype_name(dt) << " offset " << offset;
    }
}

}  // namespace
}  // namespace linac::test_elementwise_gpu
