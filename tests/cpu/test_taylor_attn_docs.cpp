// Taylor attention with document bounds (TaylorAttnOpts::docs), CPU: in every form (quadratic,
// recurrent, chunked with chunks of 4, 8 and 16) a row packed from documents gives, document by
// document, what each document alone gives: o, den, the final state (the last document's) and dq,
// dk, dv, in f64 and f32; documents of one token, starting mid-chunk and exactly on chunk
// boundaries, spanning several chunks, a row that is one document; the forms agree with each
// other under bounds; the bounds change the result; a document's outputs do not move when another
// document of the row changes.
#include <algorithm>
#include <cmath>

#include "taylor_attn/taylor_attn.h"
#include "test_util.h"

namespace linac::test_taylor_attn_docs {
namespace {

// T = 21 per row; starts {0, 1, 8, 13}, {0}, {0, 3, 4, 5, 8, 16}: on the boundaries of chunks of
// 4 and 8 (4, 8, 16) and between them.
const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 5, 8}, {21}, {3, 1, 1, 3, 8, 5}};

const TaylorAttnForm kForms[] = {TaylorAttnForm::Quadratic, TaylorAttnForm::Recurrent, TaylorAttnForm::Chunk};
const char* form_name(TaylorAttnForm f) {
  return f == TaylorAttnForm::Quadratic ? "quadratic" : f == TaylorAttnForm::Recurrent ? "recurrent" : "chunk";
}

using test::expect_close;

struct Problem : test::QkvLayout {
  int64_t B, T, F, R;
  DType dt;
  OwnedTensor in, dout, bounds;  // in: [B, T, W] q | k | v | pad
  Problem(DType d, uint64_t seed = 3)
      : QkvLayout(2, 4, 5),
        B(static_cast<int64_t>(kLayouts.size())),
        T(21),
        F(4),
        R(taylor_attn_state_rows(F)),
        dt(d),
        in(test::random_tensor({B, T, W}, d, seed, -1.5, 1.5)),
        dout(test::random_tensor({B, T, H, Dv}, d, seed + 1)),
        bounds(test::doc_bounds_of(kLayouts)) {}
};

// Results as flat vectors in the packed layout: o [B,T,H,Dv], den [B,H,T], s_final [B,H,R,Dv+1],
// the gradient buffer's q | k | v columns.
struct Result {
  std::vector<double> o, den, sf, dq, dk, dv;
};

// Rows [b0, b0 + nb), tokens [t0, t0 + n) of s through the forward and the backward: o and the
// gradients land in views of o_all and grad_all, den and s_final in tensors of their own.
struct Pass {
  OwnedTensor o, den, sf, grad;
};
Pass run(const Problem& s, int64_t b0, int64_t nb, int64_t t0, int64_t n, const TaylorAttnOpts& opts,
         TaylorAttnForm form, OwnedTensor& o_all, OwnedTensor& grad_all) {
  auto cut = [&](const Tensor& x) { return x.narrow(0, b0, nb).narrow(1, t0, n); };
  Pass p{OwnedTensor(), OwnedTensor(s.dt, Device::CPU, {nb, s.H, n}), OwnedTensor(s.dt, Device::CPU, {nb, s.H, s.R, s.Dv + 1}),
         OwnedTensor()};
  test::poison(p.den);
  test::poison(p.sf);
  taylor_attn_fwd(Ctx{}, cut(s.q(s.in)), cut(s.k(s.in)), cut(s.v(s.in)), cut(o_all), p.den, p.sf, opts, form);
  taylor_attn_bwd(Ctx{}, cut(s.q(s.in)), cut(s.k(s.in)), cut(s.v(s.in)), cut(o_all), p.den, cut(s.dout),
                  cut(s.q(grad_all)), cut(s.k(grad_all)), cut(s.v(grad_all)), opts, form);
  return p;
}

Result packed(const Problem& s, const TaylorAttnOpts& opts, TaylorAttnForm form) {
  OwnedTensor o(s.dt, Device::CPU, {s.B, s.T, s.H, s.Dv}), grad(s.dt, Device::CPU, {s.B, s.T, s.W});
  test::poison(o);
  test::poison(grad);
  const Pass p = run(s, 0, s.B, 0, s.T, opts, form, o, grad);
  return {to_doubles(o), to_doubles(p.den), to_doubles(p.sf), test::columns(grad, 0, s.H * s.F),
          test::columns(grad, s.H * s.F, s.H * s.F), test::columns(grad, 2 * s.H * s.F, s.H * s.Dv)};
}

Result alone(const Problem& s, const TaylorAttnOpts& opts, TaylorAttnForm form) {
  OwnedTensor o(s.dt, Device::CPU, {s.B, s.T, s.H, s.Dv}), grad(s.dt, Device::CPU, {s.B, s.T, s.W});
  test::poison(o);
  test::poison(grad);
  Result r;
  r.den.assign(static_cast<size_t>(s.B * s.H * s.T), 0);
  for (int64_t b = 0; b < s.B; ++b) {
    int64_t t0 = 0;
    for (int64_t len : kLayouts[static_cast<size_t>(b)]) {
      const Pass p = run(s, b, 1, t0, len, opts, form, o, grad);
      const std::vector<double> den = to_doubles(p.den);
      for (int64_t h = 0; h < s.H; ++h)
        std::copy_n(den.begin() + h * len, len, r.den.begin() + (b * s.H + h) * s.T + t0);
      t0 += len;
      if (t0 == s.T) {  // the row's last document: its state is the row's final state
        const std::vector<double> sf = to_doubles(p.sf);
        r.sf.insert(r.sf.end(), sf.begin(), sf.end());
      }
    }
  }
  r.o = to_doubles(o);
  r.dq = test::columns(grad, 0, s.H * s.F);
  r.dk = test::columns(grad, s.H * s.F, s.H * s.F);
  r.dv = test::columns(grad, 2 * s.H * s.F, s.H * s.Dv);
  return r;
}

void expect_results(const Result& got, const Result& want, double tol) {
  expect_close(got.o, want.o, tol, "o");
  expect_close(got.den, want.den, tol, "den");
  expect_close(got.sf, want.sf, tol, "final state");
  expect_close(got.dq, want.dq, tol, "dq");
  expect_close(got.dk, want.dk, tol, "dk");
  expect_close(got.dv, want.dv, tol, "dv");
}

void check_packed_equals_alone(DType dt, double tol) {
  const Problem s(dt);
  for (TaylorAttnForm form : kForms)
    for (int64_t chunk : {4, 8, 16}) {
      if (form != TaylorAttnForm::Chunk && chunk != 4) continue;
      SCOPED_TRACE(std::string(form_name(form)) + " chunk " + std::to_string(chunk));
      TaylorAttnOpts opts;
      opts.chunk = chunk;
      const Result want = alone(s, opts, form);
      opts.docs = test::doc_view(s.bounds);
      expect_results(packed(s, opts, form), want, tol);
    }
}

TEST(TaylorAttnDocs, PackedEqualsDocumentsAloneF64) { check_packed_equals_alone(DType::F64, 1e-12); }

TEST(TaylorAttnDocs, PackedEqualsDocumentsAloneF32) { check_packed_equals_alone(DType::F32, 2e-5); }

// Under bounds the recurrent and chunked forms equal the quadratic one, and the bounds matter.
TEST(TaylorAttnDocs, FormsAgreeAndBoundsMatter) {
  const Problem s(DType::F64, 11);
  TaylorAttnOpts opts;
  opts.chunk = 8;
  opts.docs = test::doc_view(s.bounds);
  const Result ref = packed(s, opts, TaylorAttnForm::Quadratic);
  for (TaylorAttnForm form : {TaylorAttnForm::Recurrent, TaylorAttnForm::Chunk}) {
    SCOPED_TRACE(form_name(form));
    expect_results(packed(s, opts, form), ref, 1e-12);
  }
  opts.docs = {};
  const Result stream = packed(s, opts, TaylorAttnForm::Chunk);
  EXPECT_GT(test::max_abs_diff(stream.o, ref.o), 1e-2);
  EXPECT_GT(test::max_abs_diff(stream.dk, ref.dk), 1e-2);
  EXPECT_GT(test::max_abs_diff(stream.sf, ref.sf), 1e-2);
}

// Changing the first document of row 2 (tokens 0..2) leaves every output of its later documents
// bitwise unchanged, and the gradients of the other documents too.
TEST(TaylorAttnDocs, DocumentsDoNotSeeEachOther) {
  for (TaylorAttnForm form : kForms) {
    SCOPED_TRACE(form_name(form));
    Problem s(DType::F64, 5);
    TaylorAttnOpts opts;
    opts.chunk = 4;
    opts.docs = test::doc_view(s.bounds);
    const Result before = packed(s, opts, form);
    double* row2 = s.in->data<double>() + 2 * s.T * s.W;
    for (int64_t i = 0; i < 3 * s.W; ++i) row2[i] += 0.25;
    const Result after = packed(s, opts, form);
    const int64_t row_o = s.T * s.H * s.Dv, tok_o = s.H * s.Dv;
    for (int64_t i = 2 * row_o + 3 * tok_o; i < 3 * row_o; ++i) ASSERT_NEAR(after.o[i], before.o[i], 1e-13) << i;
    const int64_t row_k = s.T * s.H * s.F, tok_k = s.H * s.F;
    for (int64_t i = 2 * row_k + 3 * tok_k; i < 3 * row_k; ++i) ASSERT_NEAR(after.dk[i], before.dk[i], 1e-13) << i;
    double changed = 0;
    for (int64_t i = 2 * row_o; i < 2 * row_o + 3 * tok_o; ++i) changed = std::max(changed, std::abs(after.o[i] - before.o[i]));
    EXPECT_GT(changed, 1e-3);
  }
}

}  // namespace
}  // namespace linac::test_taylor_attn_docs
