// Full reductions on the GPU vs the CPU reference (double) on the same rounded inputs;
// determinism; aligned and misaligned views; tiny sizes.
#include <limits>
#include <vector>

#include "reduce/reduce.h"
#include "test_util.h"

namespace linac::test_reduce_gpu {
namespace {

// x is n elements at `offset` of a larger buffer (offset 1 takes the scalar path).
void run_parity(DType dt, int64_t n, int64_t offset) {
  GpuContext gctx;
  OwnedTensor buf(dt, Device::CUDA, {n + offset});
  const Tensor x = buf.t.narrow(0, offset, n);
  OwnedTensor host = test::random_tensor({n}, dt, static_cast<uint64_t>(n) + 1, -1, 1.5);
  copy_tensor(x, host);
  OwnedTensor xr = to(host, Device::CPU, DType::F64);
  OwnedTensor s(DType::F32, Device::CUDA, {1}), ss(DType::F32, Device::CUDA, {1});
  OwnedTensor sr(DType::F64, Device::CPU, {1}), ssr(DType::F64, Device::CPU, {1});
  test::poison(s);
  test::poison(ss);
  sum(gctx.ctx(), x, s);
  sum_squares(gctx.ctx(), x, ss);
  gctx.synchronize();
  sum(Ctx{}, xr, sr);
  sum_squares(Ctx{}, xr, ssr);
  // Double accumulation on both sides: what remains is the final rounding to f32.
  EXPECT_LT(test::rel_error(s, sr), 1e-6) << "n " << n << " offset " << offset;
  EXPECT_LT(test::rel_error(ss, ssr), 1e-6) << "n " << n << " offset " << offset;
}

TEST(ReduceGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t offset : {0, 1}) {
    run_parity(DType::F32, 10000003, offset);
    run_parity(DType::F32, 1, offset);
    run_parity(DType::F32, 1000, offset);
  }
}

TEST(ReduceGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (int64_t offset : {0, 1}) {
    run_parity(DType::BF16, 10000003, offset);
    run_parity(DType::BF16, 3, offset);
  }
}

// count_nonfinite against the CPU count of the same rounded values: infinities and NaNs at
// scattered places (the scalar tail and a misaligned view included), in f32 and bf16.
TEST(ReduceGpu, CountNonFiniteParity) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t{3}, int64_t{1001}, int64_t{4000037}}) {
      for (int64_t offset : {0, 1}) {
        OwnedTensor host = test::random_tensor({n}, DType::F32, static_cast<uint64_t>(n) + 11, -3, 3);
        const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN()};
        int64_t k = 0;
        for (int64_t i = n / 3; i < n; i += 1 + n / 7) host->data<float>()[i] = specials[k++ % 3];
        host->data<float>()[n - 1] = specials[2];
        OwnedTensor buf(dt, Device::CUDA, {n + offset});
        const Tensor x = buf.t.narrow(0, offset, n);
        copy_tensor(x, to(host, Device::CPU, dt));
        OwnedTensor out(DType::F32, Device::CUDA, {1});
        test::poison(out);
        count_nonfinite(gctx.ctx(), x, out);
        OwnedTensor ref(DType::F64, Device::CPU, {1});
        count_nonfinite(Ctx{}, to(host, Device::CPU, DType::F64), ref);
        gctx.synchronize();
        EXPECT_GT(to_doubles(ref)[0], 0.0);
        EXPECT_EQ(to_doubles(out)[0], to_doubles(ref)[0]) << dtype_name(dt) << " n " << n << " offset " << offset;
      }
    }
  }
}

TEST(ReduceGpu, EmptyIsZero) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  OwnedTensor x(DType::F32, Device::CUDA, {0}), out(DType::F32, Device::CUDA, {1});
  test::poison(out);
  sum_squares(gctx.ctx(), x, out);
  gctx.synchronize();
  EXPECT_EQ(to_doubles(out)[0], 0.0);
}

TEST(ReduceGpu, Deterministic) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  OwnedTensor x = to(test::random_tensor({10000003}, DType::F32, 4), Device::CUDA, DType::F32);
  OwnedTensor a(DType::F32, Device::CUDA, {1}), b(DType::F32, Device::CUDA, {1});
  sum(gctx.ctx(), x, a);
  sum(gctx.ctx(), x, b);
  gctx.synchronize();
  EXPECT_EQ(to_doubles(a), to_doubles(b));
}

// to_doubles(ctx, t) reads t once ctx's stream has reached the call: a sum queued just before on
// that (non-blocking) stream, over enough data to still be running, is what it returns, each
// time, and what a device-wide read sees.
TEST(ReduceGpu, StreamOrderedReadBack) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t n = 64 << 20;
  OwnedTensor x(DType::F32, Device::CUDA, {n});
  copy_tensor(x, test::random_tensor({n}, DType::F32, 5, 0, 1));
  OwnedTensor s(DType::F32, Device::CUDA, {1});
  test::poison(s);
  sum(gctx.ctx(), x, s);
  const double expect = to_doubles(gctx.ctx(), s)[0];
  EXPECT_GT(expect, 0.4 * static_cast<double>(n));  // not NaN, not the poison
  gctx.synchronize();
  EXPECT_EQ(to_doubles(s)[0], expect);
  for (int rep = 0; rep < 3; ++rep) {
    test::poison(s);
    sum(gctx.ctx(), x, s);
    EXPECT_EQ(to_doubles(gctx.ctx(), s)[0], expect) << "rep " << rep;
  }
}

// The replica hash on the GPU is the CPU's to the bit: 16-byte aligned (paired loads) and only
// 8-byte aligned data, tails of 2, 4 and 6 bytes, sizes from one element to past a full grid's
// stride, reruns, and a seed chained over two tensors as the trainer chains the replica's parts.
TEST(ReduceGpu, HashWordsMatchesCpuBitForBit) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{7}, int64_t{1001}, int64_t{(33 << 20) + 5}}) {
    for (int64_t offset : {0, 4}) {  // U16 elements: offset 4 is 8 bytes, so not 16-byte aligned
      OwnedTensor buf(DType::U16, Device::CUDA, {n + offset});
      const Tensor x = buf.t.narrow(0, offset, n);
      OwnedTensor host(DType::U16, Device::CPU, {n});
      const std::vector<double> v = test::random_values(static_cast<size_t>(n), static_cast<uint64_t>(n), 0, 65536);
      for (int64_t i = 0; i < n; ++i) host->data<uint16_t>()[i] = static_cast<uint16_t>(v[static_cast<size_t>(i)]);
      copy_tensor(x, host);
      const uint64_t want = hash_words(Ctx{}, host, 3);
      EXPECT_EQ(hash_words(gctx.ctx(), x, 3), want) << "n " << n << " offset " << offset;
      EXPECT_EQ(hash_words(gctx.ctx(), x, 3), want) << "rerun, n " << n << " offset " << offset;
      EXPECT_EQ(hash_words(gctx.ctx(), x, hash_words(gctx.ctx(), x, 0)),
                hash_words(Ctx{}, host, hash_words(Ctx{}, host, 0)))
          << "chained, n " << n << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace linac::test_reduce_gpu
