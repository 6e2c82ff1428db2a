// Full reductions, CPU reference, against a long-double direct sum.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/mix64.h"
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

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::vector<unsigned char> b(n);
  const std::vector<double> v = test::random_values(n, seed, 0.0, 256.0);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(v[i]);
  return b;
}

// reduce.h's formula, one word at a time.
uint64_t hash_by_formula(const std::vector<unsigned char>& b, uint64_t seed) {
  uint64_t sum = 0;
  for (size_t i = 0; i * 8 < b.size(); ++i) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8 && 8 * i + k < b.size(); ++k) w |= static_cast<uint64_t>(b[8 * i + k]) << (8 * k);
    sum += mix64(w ^ (seed + (i + 1) * kMixOdd1));
  }
  return mix64(sum + b.size() * kMixOdd3 + seed * kMixOdd2);
}

uint64_t hash_of(const std::vector<unsigned char>& b, uint64_t seed = 0) {
  return hash_words_cpu(b.data(), static_cast<int64_t>(b.size()), seed);
}

// The replica hash is its formula at every length (whole words, a tail of 1..7 bytes) whatever
// the thread count, and through the entry point on a tensor of any dtype.
TEST(HashWordsCpu, IsItsFormulaOnAnyThreadCount) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{100}, size_t{100003}}) {
    const std::vector<unsigned char> b = random_bytes(n, n + 3);
    for (uint64_t seed : {uint64_t{0}, uint64_t{12345}}) {
      const uint64_t want = hash_by_formula(b, seed);
      const int before = omp_get_max_threads();
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        EXPECT_EQ(hash_of(b, seed), want) << "n " << n << " threads " << threads;
      }
      omp_set_num_threads(before);
    }
  }
  OwnedTensor x = test::random_tensor({37, 3}, DType::F32, 9);
  std::vector<unsigned char> b(x->nbytes());
  std::memcpy(b.data(), x->ptr, b.size());
  EXPECT_EQ(hash_words(Ctx{}, x, 77), hash_by_formula(b, 77));
}

// Any one flipped bit changes the hash, and so do the length (zero bytes appended), the seed and
// the order of two words.
TEST(HashWordsCpu, SeesEveryBitTheLengthAndTheOrder) {
  for (size_t n : {size_t{1}, size_t{8}, size_t{13}, size_t{40}}) {
    const std::vector<unsigned char> b = random_bytes(n, n);
    const uint64_t h = hash_of(b);
    for (size_t i = 0; i < n; ++i)
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<unsigned char> f = b;
        f[i] = static_cast<unsigned char>(f[i] ^ (1 << bit));
        EXPECT_NE(hash_of(f), h) << "n " << n << " byte " << i << " bit " << bit;
      }
    EXPECT_NE(hash_of(b, 1), h) << n;
  }
  EXPECT_NE(hash_of(std::vector<unsigned char>(16, 0)), hash_of(std::vector<unsigned char>(17, 0)));
  EXPECT_NE(hash_of(std::vector<unsigned char>(16, 0)), hash_of(std::vector<unsigned char>(24, 0)));
  std::vector<unsigned char> b = random_bytes(32, 5), swapped = b;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 24);
  ASSERT_NE(b, swapped);
  EXPECT_NE(hash_of(swapped), hash_of(b));
}

}  // namespace
}  // namespace linac::test_reduce
