// Helpers shared by the test suites: random tensors (never zeros), error norms, finite
// differences, and the GPU skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/doc_bounds.h"
#include "core/gpu.h"

namespace linac::test {

// The message of the UserError that fn throws; a test failure (and "") when it throws none.
std::string user_error_message(const std::function<void()>& fn);

// Uniform in [lo, hi) from a Philox stream; deterministic per seed.
std::vector<double> random_values(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0);
// A file's whole contents ("" when it cannot be read).
std::string file_bytes(const std::string& path);
// A CPU tensor of dtype dt filled with random_values.
OwnedTensor random_tensor(const std::vector<int64_t>& dims, DType dt, uint64_t seed, double lo = -1.0, double hi = 1.0);
// Fills an existing CPU tensor (f32/f64/bf16) with random values.
void fill_random(const Tensor& t, uint64_t seed, double lo = -1.0, double hi = 1.0);
// An f64 CPU tensor of values in {-1, 0, 1}: products and sums of up to 256 terms are exact in f32
// and bf16, so a GEMM's result does not depend on its summation order.
OwnedTensor small_integers(const std::vector<int64_t>& dims, uint64_t seed);
// The bf16 bit patterns of any tensor's values (converted to bf16 first), for bit-identity checks.
std::vector<uint16_t> bf16_bits(const Tensor& t);
// Whether two contiguous tensors (any device) of one dtype and shape hold the same bytes: bitwise
// reruns of a kernel.
bool same_bits(const Tensor& x, const Tensor& y);
// Fills any tensor (CPU or GPU) with NaN, so unwritten outputs are caught.
void poison(const Tensor& t);

// The elements of a strided view (any device, non-negative strides, e.g. a column range or a
// slice of a fused buffer) in row-major order of its shape.
std::vector<double> view_values(const Tensor& t);
// A [B, T, H, D] view of columns [col0, col0 + H * D) of a contiguous [B, T, W] buffer (any
// device): q, k, v as the models pass them, strided views of one fused buffer.
Tensor bthd(const Tensor& buf, int64_t col0, int64_t H, int64_t D);
// The columns of the attention-like ops' tests: q | k | v (H heads of Dk, Dk, Dv), then
// `extra` columns of the op's own (e.g. GLA's gates) and a pad column, so no view is contiguous.
struct QkvLayout {
  int64_t H, Dk, Dv, W;
  QkvLayout(int64_t h, int64_t dk, int64_t dv, int64_t extra = 0)
      : H(h), Dk(dk), Dv(dv), W(h * (2 * dk + dv) + extra + 1) {}
  Tensor q(const Tensor& x) const { return bthd(x, 0, H, Dk); }
  Tensor k(const Tensor& x) const { return bthd(x, H * Dk, H, Dk); }
  Tensor v(const Tensor& x) const { return bthd(x, 2 * H * Dk, H, Dv); }
};
// The values of columns [col0, col0 + n) of every row of a contiguous [B, T, W] buffer, in order.
std::vector<double> columns(const Tensor& buf, int64_t col0, int64_t n);

// Token t of a [B, T, H, D] view as a [B, H, D] view (one decoding step's rows).
Tensor token(const Tensor& x, int64_t t);
// These values as a contiguous int32 [n] on dev (e.g. a decoding step's per-row positions).
OwnedTensor int32_values(const std::vector<int32_t>& values, Device dev);

// ||a - b|| / ||b||.
double rel_error(const std::vector<double>& a, const std::vector<double>& b);
double rel_error(const Tensor& a, const Tensor& b);
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b);
// Expects got finite and within tol * (1 + max |want|) of want everywhere; `what` names it.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what);
bool all_finite(const std::vector<double>& a);

// Central difference d loss / d x[i] with step h; restores x[i].
double numeric_grad(const std::function<double()>& loss, double* x, size_t i, double h = 1e-6);

// Checks an analytic gradient against central differences at `n_probe` random indices (all
// indices when the tensor is small). Returns the worst relative error, after forgiving each
// entry the differences' rounding error (eps |loss| / h).
double check_grad(const std::function<double()>& loss, double* x, const double* analytic, size_t n,
                  size_t n_probe = 64, uint64_t seed = 7, double h = 1e-6);

// The DocBounds of a [2, B, T] int32 bounds tensor (starts, then ends, as data/documents.h writes
// them; any device).
DocBounds doc_view(const Tensor& bounds);
// Document bounds (core/doc_bounds.h) of a [B, T] window whose row b holds documents of the
// lengths rows[b % rows.size()], cycled until the row is full (the last one cut): on the host for
// CPU references and, with gpu_copy, on the device.
struct DocLayout {
  OwnedTensor bounds, bounds_gpu;  // [2, B, T] int32
  DocBounds host() const { return doc_view(bounds); }
  DocBounds gpu() const { return doc_view(bounds_gpu); }
  OwnedTensor starts() const;  // a [B, T] copy of the starts
};
DocLayout doc_layout(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& rows, bool gpu_copy = false);
// The [2, B, T] bounds of rows holding exactly the documents of lengths[b] (every row's lengths
// summing to the same T).
OwnedTensor doc_bounds_of(const std::vector<std::vector<int64_t>>& lengths);
// n rows of `lengths`, row r cycled to start at its r-th entry (so the rows differ).
std::vector<std::vector<int64_t>> rotated_rows(const std::vector<int64_t>& lengths, int64_t n);

// Sets environment variable `var` to `value` (nullptr: unsets it) for the guard's lifetime, e.g.
// LINAC_ATTENTION_KERNELS to run the same checks through each kernel family.
class ScopedEnv {
 public:
  ScopedEnv(const char* var, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string var_, old_;
  bool had_ = false;
};

}  // namespace linac::test

#define LINAC_SKIP_WITHOUT_GPU() \
  do {                           \
    if (!::linac::gpu_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
