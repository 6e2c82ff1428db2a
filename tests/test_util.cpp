#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "model/mixers/proj_views.h"

namespace linac::test {

std::string user_error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<double> random_values(size_t n, uint64_t seed, double lo, double hi) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * philox_uniform(seed, 0x7e57, i);
  return v;
}

void fill_random(const Tensor& t, uint64_t seed, double lo, double hi) {
  LINAC_CHECK(t.device == Device::CPU, "fill_random: CPU tensors only");
  auto v = random_values(static_cast<size_t>(t.numel()), seed, lo, hi);
  OwnedTensor src(DType::F64, Device::CPU, t.dims());
  std::copy(v.begin(), v.end(), src.t.data<double>());
  convert_host(t, src.t);
}

OwnedTensor random_tensor(const std::vector<int64_t>& dims, DType dt, uint64_t seed, double lo, double hi) {
  OwnedTensor t(dt, Device::CPU, dims);
  fill_random(t.t, seed, lo, hi);
  return t;
}

OwnedTensor small_integers(const std::vector<int64_t>& dims, uint64_t seed) {
  OwnedTensor t = random_tensor(dims, DType::F64, seed, -1.5, 1.5);
  double* p = t->data<double>();
  for (int64_t i = 0; i < t->numel(); ++i) p[i] = std::round(p[i]);
  return t;
}

std::vector<uint16_t> bf16_bits(const Tensor& t) {
  OwnedTensor c = to(t, Device::CPU, DType::BF16);
  const auto* p = c->data<uint16_t>();
  return std::vector<uint16_t>(p, p + c->numel());
}

bool same_bits(const Tensor& x, const Tensor& y) {
  LINAC_CHECK(x.dtype == y.dtype && same_shape(x, y), "same_bits: tensors of another dtype or shape");
  const OwnedTensor hx = to(x, Device::CPU, x.dtype), hy = to(y, Device::CPU, y.dtype);
  return std::memcmp(hx->ptr, hy->ptr, hx->nbytes()) == 0;
}

void poison(const Tensor& t) {
  OwnedTensor host(DType::F64, Device::CPU, t.dims());
  std::fill_n(host.t.data<double>(), t.numel(), std::numeric_limits<double>::quiet_NaN());
  OwnedTensor conv(t.dtype, Device::CPU, t.dims());
  convert_host(conv.t, host.t);
  copy_tensor(t, conv.t);
}

std::vector<double> view_values(const Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return {};
  int64_t extent = 1;  // elements from the first to the last one the view touches
  for (int d = 0; d < t.ndim; ++d) extent += (t.shape[d] - 1) * t.strides[d];
  const std::vector<double> span = to_doubles(Tensor(t.ptr, t.dtype, t.device, {extent}));
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<int64_t> idx(static_cast<size_t>(t.ndim), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim; ++d) off += idx[static_cast<size_t>(d)] * t.strides[d];
    out[static_cast<size_t>(i)] = span[static_cast<size_t>(off)];
    for (int d = t.ndim - 1; d >= 0 && ++idx[static_cast<size_t>(d)] == t.shape[d]; --d) idx[static_cast<size_t>(d)] = 0;
  }
  return out;
}

Tensor bthd(const Tensor& buf, int64_t col0, int64_t H, int64_t D) {
  const int64_t B = buf.size(0), T = buf.size(1);
  return linac::bthd(buf.view({B * T, buf.size(2)}), B, T, col0, H, D);
}

std::vector<double> columns(const Tensor& buf, int64_t col0, int64_t n) { return view_values(bthd(buf, col0, 1, n)); }

double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double rel_error(const Tensor& a, const Tensor& b) { return rel_error(to_doubles(a), to_doubles(b)); }

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_TRUE(all_finite(got)) << what;
  double scale = 0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  const double diff = max_abs_diff(got, want);
  EXPECT_LE(diff, tol * (1 + scale)) << what << ": max abs difference " << diff;
}

bool all_finite(const std::vector<double>& a) {
  return std::all_of(a.begin(), a.end(), [](double x) { return std::isfinite(x); });
}

double numeric_grad(const std::function<double()>& loss, double* x, size_t i, double h) {
  const double x0 = x[i];
  x[i] = x0 + h;
  const double lp = loss();
  x[i] = x0 - h;
  const double lm = loss();
  x[i] = x0;
  return (lp - lm) / (2 * h);
}

double check_grad(const std::function<double()>& loss, double* x, const double* analytic, size_t n, size_t n_probe,
                  uint64_t seed, double h) {
  double worst = 0;
  const bool all = n <= n_probe;
  const size_t count = all ? n : n_probe;
  // A central difference carries a rounding error of about eps |loss| / h: a gradient entry of
  // that size (a loss summed over many tokens, an entry near 0) cannot be checked more finely.
  const double noise = std::numeric_limits<double>::epsilon() * std::fabs(loss()) / h;
  for (size_t p = 0; p < count; ++p) {
    const size_t i = all ? p : static_cast<size_t>(philox_uniform(seed, 0x9c, p) * static_cast<double>(n)) % n;
    const double num = numeric_grad(loss, x, i, h);
    const double err = std::max(0.0, std::fabs(num - analytic[i]) - noise) /
                       std::max(1e-6, std::fabs(num) + std::fabs(analytic[i]));
    worst = std::max(worst, err);
  }
  return worst;
}

ScopedEnv::ScopedEnv(const char* var, const char* value) : var_(var) {
  if (const char* old = std::getenv(var)) old_ = old, had_ = true;
  if (value)
    setenv(var, value, 1);
  else
    unsetenv(var);
}

ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(var_.c_str(), old_.c_str(), 1);
  else
    unsetenv(var_.c_str());
}

Tensor token(const Tensor& x, int64_t t) {
  Tensor r(static_cast<char*>(x.ptr) + t * x.strides[1] * static_cast<int64_t>(dtype_size(x.dtype)), x.dtype,
           x.device, {x.size(0), x.size(2), x.size(3)});
  r.strides = {x.strides[0], x.size(3), 1};
  return r;
}

OwnedTensor int32_values(const std::vector<int32_t>& values, Device dev) {
  const auto n = static_cast<int64_t>(values.size());
  return to(Tensor(const_cast<int32_t*>(values.data()), DType::I32, Device::CPU, {n}), dev, DType::I32);
}

DocBounds doc_view(const Tensor& bounds) {
  const int32_t* p = bounds.data<int32_t>();
  return {p, p + bounds.size(1) * bounds.size(2)};
}

OwnedTensor DocLayout::starts() const {
  OwnedTensor s(DType::I32, Device::CPU, {bounds->size(1), bounds->size(2)});
  copy_tensor(s, bounds->select(0, 0));
  return s;
}

DocLayout doc_layout(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& rows, bool gpu_copy) {
  DocLayout d{OwnedTensor(DType::I32, Device::CPU, {2, B, T}), {}};
  int32_t* start = d.bounds->data<int32_t>();
  int32_t* end = start + B * T;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t>& len = rows[static_cast<size_t>(b) % rows.size()];
    for (int64_t t = 0, i = 0; t < T; ++i) {
      const int64_t n = std::min(len[static_cast<size_t>(i) % len.size()], T - t);
      LINAC_CHECK(n > 0, "doc_layout: empty document");
      for (int64_t j = t; j < t + n; ++j) {
        start[b * T + j] = static_cast<int32_t>(t);
        end[b * T + j] = static_cast<int32_t>(t + n);
      }
      t += n;
    }
  }
  if (gpu_copy) d.bounds_gpu = to(d.bounds, Device::CUDA, DType::I32);
  return d;
}

OwnedTensor doc_bounds_of(const std::vector<std::vector<int64_t>>& lengths) {
  int64_t T = 0;
  for (int64_t l : lengths.at(0)) T += l;
  for (const auto& row : lengths) {
    int64_t sum = 0;
    for (int64_t l : row) sum += l;
    LINAC_CHECK(sum == T, "doc_bounds_of: rows of different lengths");
  }
  return std::move(doc_layout(static_cast<int64_t>(lengths.size()), T, lengths).bounds);
}

std::vector<std::vector<int64_t>> rotated_rows(const std::vector<int64_t>& lengths, int64_t n) {
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> row = lengths;
    std::rotate(row.begin(), row.begin() + r % static_cast<int64_t>(lengths.size()), row.end());
    rows.push_back(row);
  }
  return rows;
}

}  // namespace linac::test
