// Matmul CPU: every transpose combination, alpha/beta, strided row views and batches against a
// naive triple loop; float against double; thread-count invariance; the linear-layer calls.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "matmul/matmul.h"
#include "test_util.h"

namespace linac::test_matmul {
namespace {

// A stored [rows, cols] matrix (or [batch, rows, cols]) viewed inside a random buffer `pad`
// columns wider, starting at column 1 when padded so the view's pointer is not aligned either.
struct Operand {
  OwnedTensor full;
  Tensor view;
  int64_t off = 0;
};

Operand make_operand(int64_t batch, int64_t rows, int64_t cols, int64_t pad, DType dt, uint64_t seed) {
  std::vector<int64_t> dims = {rows, cols + pad};
  if (batch > 0) dims.insert(dims.begin(), batch);
  Operand o{test::random_tensor(dims, dt, seed), {}, pad > 0 ? 1 : 0};
  o.view = o.full.t.narrow(batch > 0 ? 2 : 1, o.off, cols);
  return o;
}

double elem(const Tensor& t, int64_t bi, int64_t i, int64_t j) {
  const int r = t.ndim - 2;
  const int64_t off = (t.ndim == 3 ? bi * t.strides[0] : 0) + i * t.strides[r] + j * t.strides[r + 1];
  return t.dtype == DType::F64 ? t.data<double>()[off] : t.data<float>()[off];
}

// The view's elements as [batch][rows][cols] doubles.
std::vector<double> gather(const Tensor& t) {
  const int64_t nb = t.ndim == 3 ? t.shape[0] : 1, rows = t.size(-2), cols = t.size(-1);
  std::vector<double> out;
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out.push_back(elem(t, bi, i, j));
  return out;
}

// alpha * op(A) op(B) + beta * C0 by the definition, in long double.
std::vector<double> naive(const Tensor& a, bool ta, const Tensor& b, bool tb, const std::vector<double>& c0,
                          float alpha, float beta) {
  const int64_t nb = a.ndim == 3 ? a.shape[0] : 1;
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1), n = tb ? b.size(-2) : b.size(-1);
  std::vector<double> out(static_cast<size_t>(nb * m * n));
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        long double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += static_cast<long double>(ta ? elem(a, bi, p, i) : elem(a, bi, i, p)) *
               (tb ? elem(b, bi, j, p) : elem(b, bi, p, j));
        const size_t o = static_cast<size_t>((bi * m + i) * n + j);
        out[o] = static_cast<double>(alpha * s + (beta == 0.f ? 0.0L : beta * static_cast<long double>(c0[o])));
      }
  return out;
}

struct Case {
  int64_t m, n, k;
  int64_t batch = 0;  // 0: 2-D matmul
  int64_t pad = 0;    // extra columns around every operand
  float alpha = 1.f, beta = 0.f;
};

// Runs one case in double for every transpose combination and checks it against naive(),
// that beta = 0 ignores a NaN-filled C, and that nothing outside C's view is written.
void check_case(const Case& cs) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "M=" << cs.m << " N=" << cs.n << " K=" << cs.k << " batch=" << cs.batch
                                        << " pad=" << cs.pad << " alpha=" << cs.alpha << " beta=" << cs.beta
                                        << " ta=" << ta << " tb=" << tb);
      Operand a = make_operand(cs.batch, ta ? cs.k : cs.m, ta ? cs.m : cs.k, cs.pad, DType::F64, 1);
      Operand b = make_operand(cs.batch, tb ? cs.n : cs.k, tb ? cs.k : cs.n, cs.pad, DType::F64, 2);
      Operand c = make_operand(cs.batch, cs.m, cs.n, cs.pad, DType::F64, 3);
      if (cs.beta == 0.f) test::poison(c.full);
      const std::vector<double> c0 = gather(c.view), full0 = to_doubles(c.full);
      if (cs.batch > 0)
        matmul_batched(Ctx{}, a.view, ta, b.view, tb, c.view, cs.alpha, cs.beta);
      else
        matmul(Ctx{}, a.view, ta, b.view, tb, c.view, cs.alpha, cs.beta);
      const std::vector<double> got = gather(c.view);
      ASSERT_TRUE(test::all_finite(got));
      EXPECT_LT(test::rel_error(got, naive(a.view, ta, b.view, tb, c0, cs.alpha, cs.beta)), 1e-12);
      const std::vector<double> full = to_doubles(c.full);
      const int64_t width = cs.n + cs.pad;
      for (size_t i = 0; i < full.size(); ++i) {
        const int64_t col = static_cast<int64_t>(i) % width;
        if (col >= c.off && col < c.off + cs.n) continue;
        ASSERT_EQ(std::memcmp(&full[i], &full0[i], sizeof(double)), 0) << "wrote outside C at " << i;
      }
    }
}

TEST(MatmulCpu, AllTransposesMatchNaive) {
  // Odd sizes, a single row/column/inner term, and sizes past every block edge
  // (MR, NR, MC = 96, NC = 128 for double, KC = 256).
  for (Case cs : {Case{7, 129, 37}, Case{1, 1, 1}, Case{13, 16, 1}, Case{1, 300, 9}, Case{97, 131, 513}})
    check_case(cs);
}

TEST(MatmulCpu, AlphaBeta) {
  check_case({7, 129, 37, 0, 0, 0.5f, 0.f});
  check_case({7, 129, 37, 0, 0, -1.5f, 1.f});
  check_case({23, 40, 300, 0, 0, 2.f, -0.75f});
}

TEST(MatmulCpu, StridedRowViews) {
  check_case({7, 129, 37, 0, 3});
  check_case({50, 33, 260, 0, 5, 1.f, 1.f});
}

TEST(MatmulCpu, BiasIsAddedToEveryRow) {
  // matmul_bias == naive product + bias[j] on every row, for both transposes of A and a strided C
  // (C's padding columns untouched).
  for (bool ta : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "ta=" << ta);
    const int64_t m = 37, n = 19, k = 29;
    Operand a = make_operand(0, ta ? k : m, ta ? m : k, 0, DType::F64, 11);
    Operand b = make_operand(0, n, k, 0, DType::F64, 12);
    Operand c = make_operand(0, m, n, 3, DType::F64, 13);
    OwnedTensor bias = test::random_tensor({n}, DType::F64, 14);
    const std::vector<double> c0 = gather(c.view), full0 = to_doubles(c.full);
    matmul_bias(Ctx{}, a.view, ta, b.view, true, bias, c.view);
    std::vector<double> want = naive(a.view, ta, b.view, true, c0, 1.f, 0.f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) want[static_cast<size_t>(i * n + j)] += bias->data<double>()[j];
    EXPECT_LT(test::rel_error(gather(c.view), want), 1e-12);
    const std::vector<double> full = to_doubles(c.full);
    for (size_t i = 0; i < full.size(); ++i) {
      const int64_t col = static_cast<int64_t>(i) % (n + 3);
      if (col < c.off || col >= c.off + n) ASSERT_EQ(std::memcmp(&full[i], &full0[i], sizeof(double)), 0);
    }
  }
  OwnedTensor x = test::random_tensor({4, 5}, DType::F64, 1), w = test::random_tensor({3, 5}, DType::F64, 2);
  OwnedTensor y(DType::F64, Device::CPU, {4, 3}), short_bias(DType::F64, Device::CPU, {2});
  EXPECT_THROW(matmul_bias(Ctx{}, x, false, w, true, short_bias, y), Error);
}

TEST(MatmulCpu, AddendFromAnotherBufferIsLeftAsItWas) {
  // matmul_add: C = naive product + C_in with C_in a buffer of its own (C's row stride, inside a
  // padded allocation), also with matmul_bias's bias; C_in unchanged bit for bit, C's padding
  // untouched. C_in == C is beta 1.
  const int64_t m = 37, n = 19, k = 29;
  Operand a = make_operand(0, m, k, 0, DType::F64, 21), b = make_operand(0, n, k, 0, DType::F64, 22);
  OwnedTensor bias = test::random_tensor({n}, DType::F64, 23);
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "bias=" << with_bias);
    Operand c = make_operand(0, m, n, 3, DType::F64, 24), c_in = make_operand(0, m, n, 3, DType::F64, 25);
    const std::vector<double> in0 = to_doubles(c_in.full), c_full0 = to_doubles(c.full);
    if (with_bias)
      matmul_bias(Ctx{}, a.view, false, b.view, true, bias, c.view, c_in.view);
    else
      matmul_add(Ctx{}, a.view, false, b.view, true, c_in.view, c.view);
    std::vector<double> want = naive(a.view, false, b.view, true, gather(c_in.view), 1.f, 1.f);
    if (with_bias)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) want[static_cast<size_t>(i * n + j)] += bias->data<double>()[j];
    EXPECT_LT(test::rel_error(gather(c.view), want), 1e-12);
    const std::vector<double> in1 = to_doubles(c_in.full), c_full = to_doubles(c.full);
    ASSERT_EQ(std::memcmp(in1.data(), in0.data(), in0.size() * sizeof(double)), 0);
    for (size_t i = 0; i < c_full.size(); ++i) {
      const int64_t col = static_cast<int64_t>(i) % (n + 3);
      if (col < c.off || col >= c.off + n) ASSERT_EQ(std::memcmp(&c_full[i], &c_full0[i], sizeof(double)), 0);
    }
  }
  Operand c = make_operand(0, m, n, 0, DType::F64, 26);
  const std::vector<double> c0 = gather(c.view);
  matmul_add(Ctx{}, a.view, false, b.view, true, c.view, c.view);
  EXPECT_LT(test::rel_error(gather(c.view), naive(a.view, false, b.view, true, c0, 1.f, 1.f)), 1e-12);

  // An addend of another shape, stride or dtype, or one overlapping C, is refused.
  OwnedTensor big = test::random_tensor({2 * m, n}, DType::F64, 27);
  OwnedTensor wide = test::random_tensor({m, n + 1}, DType::F64, 28), f32 = test::random_tensor({m, n}, DType::F32, 29);
  EXPECT_THROW(matmul_add(Ctx{}, a.view, false, b.view, true, wide.t.narrow(1, 0, n), big.t.narrow(0, 0, m)), Error);
  EXPECT_THROW(matmul_add(Ctx{}, a.view, false, b.view, true, f32, big.t.narrow(0, 0, m)), Error);
  EXPECT_THROW(matmul_add(Ctx{}, a.view, false, b.view, true, big.t.narrow(0, 1, m), big.t.narrow(0, 0, m)), Error);
  EXPECT_NO_THROW(matmul_add(Ctx{}, a.view, false, b.view, true, big.t.narrow(0, m, m), big.t.narrow(0, 0, m)));
}

TEST(MatmulCpu, Batched) {
  check_case({7, 129, 37, 3});
  check_case({19, 20, 21, 4, 2, 0.5f, 1.f});
}

TEST(MatmulCpu, BatchedBroadcastsZeroBatchStride) {
  const int64_t batch = 3, m = 11, n = 17, k = 29;
  OwnedTensor a = test::random_tensor({batch, m, k}, DType::F64, 4);
  OwnedTensor w = test::random_tensor({n, k}, DType::F64, 5);
  Tensor wb = w.t;  // [batch, n, k] view of one matrix
  wb.ndim = 3;
  wb.shape = {batch, n, k};
  wb.strides = {0, k, 1};
  OwnedTensor c(DType::F64, Device::CPU, {batch, m, n});
  test::poison(c);
  matmul_batched(Ctx{}, a, false, wb, true, c);
  for (int64_t bi = 0; bi < batch; ++bi) {
    OwnedTensor cb(DType::F64, Device::CPU, {m, n});
    matmul(Ctx{}, a->select(0, bi), false, w, true, cb);
    EXPECT_EQ(to_doubles(c->select(0, bi)), to_doubles(cb)) << "batch " << bi;
  }
}

TEST(MatmulCpu, FloatMatchesDouble) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 70, n = 150, k = 300;
      OwnedTensor af = test::random_tensor(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, DType::F32, 6);
      OwnedTensor bf = test::random_tensor(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, DType::F32, 7);
      OwnedTensor cf = test::random_tensor({m, n}, DType::F32, 8);
      OwnedTensor ad = to(af, Device::CPU, DType::F64), bd = to(bf, Device::CPU, DType::F64);
      OwnedTensor cd = to(cf, Device::CPU, DType::F64);
      matmul(Ctx{}, af, ta, bf, tb, cf, 0.5f, 1.f);
      matmul(Ctx{}, ad, ta, bd, tb, cd, 0.5f, 1.f);
      EXPECT_LT(test::rel_error(cf, cd), 1e-5) << "ta=" << ta << " tb=" << tb;
    }
}

// Each element's K-sum runs in one fixed order, so the thread count cannot change a bit.
TEST(MatmulCpu, BitwiseIdenticalForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 301, n = 290, k = 520;
      OwnedTensor a = test::random_tensor(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, DType::F32, 9);
      OwnedTensor b = test::random_tensor(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, DType::F32, 10);
      std::vector<OwnedTensor> outs;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        outs.push_back(test::random_tensor({m, n}, DType::F32, 11));
        matmul(Ctx{}, a, ta, b, tb, outs.back(), 1.f, 1.f);
      }
      for (size_t i = 1; i < outs.size(); ++i)
        EXPECT_EQ(std::memcmp(outs[0]->ptr, outs[i]->ptr, outs[0]->nbytes()), 0) << "ta=" << ta << " tb=" << tb;
    }
  omp_set_num_threads(saved);
}

// Y = X W^T, dX = dY W, dW += dY^T X (W stored [out, in]) against finite differences of
// loss = sum(Y * U).
TEST(MatmulCpu, LinearLayerGradients) {
  const int64_t rows = 5, in = 7, out = 4;
  OwnedTensor x = test::random_tensor({rows, in}, DType::F64, 12);
  OwnedTensor w = test::random_tensor({out, in}, DType::F64, 13);
  OwnedTensor u = test::random_tensor({rows, out}, DType::F64, 14);
  auto loss = [&] {
    OwnedTensor y(DType::F64, Device::CPU, {rows, out});
    matmul(Ctx{}, x, false, w, true, y);
    double l = 0;
    for (int64_t i = 0; i < rows * out; ++i) l += y->data<double>()[i] * u->data<double>()[i];
    return l;
  };
  OwnedTensor dx(DType::F64, Device::CPU, {rows, in});
  matmul(Ctx{}, u, false, w, false, dx);
  OwnedTensor dw = test::random_tensor({out, in}, DType::F64, 15);  // accumulates onto this
  const std::vector<double> dw0 = to_doubles(dw);
  matmul(Ctx{}, u, true, x, false, dw, 1.f, 1.f);
  std::vector<double> gw = to_doubles(dw);
  for (size_t i = 0; i < gw.size(); ++i) gw[i] -= dw0[i];
  EXPECT_LT(test::check_grad(loss, x->data<double>(), dx->data<double>(), rows * in), 1e-6);
  EXPECT_LT(test::check_grad(loss, w->data<double>(), gw.data(), gw.size()), 1e-6);
}

TEST(MatmulCpu, RejectsInconsistentOperands) {
  OwnedTensor a(DType::F64, Device::CPU, {4, 5}), b(DType::F64, Device::CPU, {6, 3});
  OwnedTensor c(DType::F64, Device::CPU, {4, 3}), cf(DType::F32, Device::CPU, {4, 3});
  OwnedTensor b_ok(DType::F64, Device::CPU, {5, 3});
  EXPECT_THROW(matmul(Ctx{}, a, false, b, false, c), Error);        // K mismatch
  EXPECT_THROW(matmul(Ctx{}, a, false, b_ok, true, c), Error);      // B^T is [3, 5]
  EXPECT_THROW(matmul(Ctx{}, a, false, b_ok, false, cf), Error);    // mixed CPU dtypes
  EXPECT_THROW(matmul_batched(Ctx{}, a, false, b_ok, false, c), Error);  // 2-D to batched
  EXPECT_NO_THROW(matmul(Ctx{}, a, false, b_ok, false, c));
}

TEST(MatmulCpu, FlopCount) {
  EXPECT_EQ(matmul_flops(7, 129, 37), 2.0 * 7 * 129 * 37);
  EXPECT_EQ(matmul_flops(2, 3, 4, 5), 240.0);
}

}  // namespace
}  // namespace linac::test_matmul
