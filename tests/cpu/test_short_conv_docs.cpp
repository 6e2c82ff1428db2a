// Short gated convolution with document bounds (ShortConvOpts::docs), CPU reference: a row packed
// from documents gives, document by document, what convolving each document alone gives: z, da, dg
// and the accumulated dh, dba, dbg, in f64 and f32, for widths 1 to 8 with documents shorter than
// the filter (one token, two tokens), with and without biases, both activations; the bounds change
// the result; the decode step refuses bounds (a document restarts from a zeroed state).
#include <algorithm>
#include <cmath>

#include "short_conv/short_conv.h"
#include "test_util.h"

namespace linac::test_short_conv_docs {
namespace {

// T = 21 per row: documents of 1 and 2 tokens (shorter than most filters), a row that is one
// document, runs of one-token documents.
const std::vector<std::vector<int64_t>> kLayouts = {{1, 2, 5, 13}, {21}, {3, 1, 1, 3, 8, 5}};

// A [B, T, C] view of columns [col0, col0 + C) of a contiguous [B, T, P] buffer.
Tensor btc(const Tensor& buf, int64_t col0, int64_t C) { return test::bthd(buf, col0, 1, C).select(2, 0); }

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_TRUE(test::all_finite(got)) << what;
  EXPECT_LE(test::max_abs_diff(got, want), tol * (1 + max_abs(want))) << what;
}

struct Run {
  OwnedTensor z, dproj, dh, dba, dbg;
};

struct Problem {
  int64_t B, T, C, W, P;
  DType dt;
  bool silu, biases;
  OwnedTensor proj, dz, h, ba, bg, dh0, dba0, dbg0, bounds;
  Problem(DType d, int64_t w, bool s, bool bias)
      : B(static_cast<int64_t>(kLayouts.size())), T(21), C(5), W(w), P(2 * 5 + 1), dt(d), silu(s), biases(bias),
        proj(test::random_tensor({B, T, P}, d, 1, -2, 2)), dz(test::random_tensor({B, T, C}, d, 2)),
        h(test::random_tensor({C, W}, d, 3)), ba(test::random_tensor({C}, d, 4)), bg(test::random_tensor({C}, d, 5)),
        dh0(test::random_tensor({C, W}, d, 6)), dba0(test::random_tensor({C}, d, 7)),
        dbg0(test::random_tensor({C}, d, 8)), bounds(test::doc_bounds_of(kLayouts)) {}

  Run fresh() const {
    Run r{OwnedTensor(dt, Device::CPU, {B, T, C}), OwnedTensor(dt, Device::CPU, {B, T, P}), to(dh0, Device::CPU, dt),
          to(dba0, Device::CPU, dt), to(dbg0, Device::CPU, dt)};
    test::poison(r.z);
    test::poison(r.dproj);
    return r;
  }
  // Forward and backward over tokens [t0, t0 + n) of rows [b0, b0 + nb), accumulating into r.
  void run(Run& r, int64_t b0, int64_t nb, int64_t t0, int64_t n, const DocBounds& docs) const {
    auto cut = [&](const Tensor& x) { return x.narrow(0, b0, nb).narrow(1, t0, n); };
    const Tensor bav = biases ? ba.t : Tensor(), bgv = biases ? bg.t : Tensor();
    const ShortConvOpts opts{silu, docs};
    short_conv_fwd(Ctx{}, cut(btc(proj, 0, C)), cut(btc(proj, C, C)), h, bav, bgv, cut(r.z), opts);
    short_conv_bwd(Ctx{}, cut(btc(proj, 0, C)), cut(btc(proj, C, C)), h, bav, bgv, cut(dz), cut(btc(r.dproj, 0, C)),
                   cut(btc(r.dproj, C, C)), r.dh, biases ? r.dba.t : Tensor(), biases ? r.dbg.t : Tensor(), opts);
  }
};

void check_packed_equals_alone(DType dt, double tol) {
  for (int64_t W : {1, 2, 3, 4, 8})
    for (const auto& [silu, biases] : {std::pair{true, true}, {false, true}, {true, false}}) {
      SCOPED_TRACE("W=" + std::to_string(W) + (silu ? " silu" : " identity") + (biases ? "" : " no biases"));
      const Problem s(dt, W, silu, biases);
      Run packed = s.fresh(), alone = s.fresh(), stream = s.fresh();
      s.run(packed, 0, s.B, 0, s.T, test::doc_view(s.bounds));
      for (int64_t b = 0; b < s.B; ++b) {
        int64_t t0 = 0;
        for (int64_t len : kLayouts[static_cast<size_t>(b)]) {
          s.run(alone, b, 1, t0, len, DocBounds{});
          t0 += len;
        }
      }
      expect_close(to_doubles(packed.z), to_doubles(alone.z), tol, "z");
      expect_close(test::columns(packed.dproj, 0, s.C), test::columns(alone.dproj, 0, s.C), tol, "da");
      expect_close(test::columns(packed.dproj, s.C, s.C), test::columns(alone.dproj, s.C, s.C), tol, "dg");
      expect_close(to_doubles(packed.dh), to_doubles(alone.dh), tol, "dh");
      expect_close(to_doubles(packed.dba), to_doubles(alone.dba), tol, "dba");
      expect_close(to_doubles(packed.dbg), to_doubles(alone.dbg), tol, "dbg");
      // Without bounds the filter reaches into the previous document (W > 1).
      s.run(stream, 0, s.B, 0, s.T, DocBounds{});
      if (W > 1) {
        EXPECT_GT(test::max_abs_diff(to_doubles(stream.z), to_doubles(packed.z)), 1e-3) << "z";
        EXPECT_GT(test::max_abs_diff(test::columns(stream.dproj, 0, s.C), test::columns(packed.dproj, 0, s.C)), 1e-3)
            << "da";
      } else {
        EXPECT_EQ(to_doubles(stream.z), to_doubles(packed.z));
      }
    }
}

TEST(ShortConvDocs, PackedEqualsDocumentsAloneF64) { check_packed_equals_alone(DType::F64, 1e-13); }

TEST(ShortConvDocs, PackedEqualsDocumentsAloneF32) { check_packed_equals_alone(DType::F32, 2e-6); }

TEST(ShortConvDocs, StepRefusesBounds) {
  const Problem s(DType::F64, 3, true, true);
  OwnedTensor state(DType::F64, Device::CPU, {s.B, 2, s.C}), z(DType::F64, Device::CPU, {s.B, s.C});
  const Tensor a = btc(s.proj, 0, s.C).select(1, 0), g = btc(s.proj, s.C, s.C).select(1, 0);
  EXPECT_THROW(short_conv_step(Ctx{}, a, g, s.h, s.ba, s.bg, state, z, {true, test::doc_view(s.bounds)}), Error);
}

}  // namespace
}  // namespace linac::test_short_conv_docs
