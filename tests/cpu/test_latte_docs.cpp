// Latte CPU forms with document bounds (LatteOpts::docs, latte.h): a packed row of several
// documents gives, in every form (quadratic, recurrent, chunked at two chunk lengths), the y, lse,
// da, db, dv and dlocal of each document run alone, and mu_final of the row's last document; f64
// and f32, plain and Macchiato. Layouts put documents of one token, documents shorter than a chunk,
// documents starting exactly at chunk boundaries and a row that is one document; the logits of
// consecutive documents sit +-200 apart (so only a per-document factorisation reference keeps the
// chunked products finite), or span +-1000 (the exact-exponent path). The bounds matter: the same
// row without them gives other outputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "latte/latte.h"
#include "latte_layout.h"
#include "test_util.h"

namespace linac::test_latte_docs {
namespace {

struct DocProblem : test::LatteLayout {
  int64_t B, T;
  DType dt;
  std::vector<std::vector<int64_t>> lengths;
  OwnedTensor in, dy, docs;  // in: [B, T, W] in the layout's columns; docs [2, B, T]

  DocProblem(const std::vector<std::vector<int64_t>>& lens, int64_t h, int64_t l, int64_t dv, bool macchiato, DType d,
             double b_scale, double doc_offset, uint64_t seed = 3)
      : LatteLayout(h, l, dv, macchiato), B(static_cast<int64_t>(lens.size())), T(0), dt(d), lengths(lens) {
    for (int64_t n : lens[0]) T += n;
    in = test::random_tensor({B, T, W}, DType::F64, seed);
    dy = test::random_tensor({B, T, H, Dv}, DType::F64, seed + 1);
    docs = test::doc_bounds_of(lens);
    // b scaled, and shifted by +-doc_offset alternately per document.
    const Tensor bv = b(in);
    for (int64_t bb = 0; bb < B; ++bb) {
      int64_t s = 0, k = 0;
      for (int64_t n : lens[static_cast<size_t>(bb)]) {
        for (int64_t t = s; t < s + n; ++t)
          for (int64_t e = 0; e < H * L; ++e) {
            double& x = bv.data<double>()[bb * bv.strides[0] + t * bv.strides[1] + e];
            x = b_scale * x + (k % 2 ? doc_offset : -doc_offset);
          }
        s += n, ++k;
      }
    }
    if (dt != DType::F64) in = to(in, Device::CPU, dt), dy = to(dy, Device::CPU, dt);
  }
  DocBounds bounds() const { return test::doc_view(docs); }

  struct Out {
    OwnedTensor y, lse, mu, grad;  // grad: the layout of `in`
  };
  Out fresh() const {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, H, Dv}), OwnedTensor(dt, Device::CPU, {B, T, H, L}),
          OwnedTensor(dt, Device::CPU, {B, H, L, Dv}), OwnedTensor(dt, Device::CPU, {B, T, W})};
    for (const Tensor* t : {&r.y.t, &r.lse.t, &r.mu.t, &r.grad.t}) test::poison(*t);
    return r;
  }

  // The whole window at once, with (or without) its bounds.
  Out packed(LatteForm form, int64_t chunk, bool with_docs = true) const {
    Out r = fresh();
    LatteOpts o;
    o.chunk = chunk;
    if (with_docs) o.docs = bounds();
    latte_fwd(Ctx{}, a(in), b(in), v(in), local(in), r.y, r.lse, r.mu, o, form);
    latte_bwd(Ctx{}, a(in), b(in), v(in), local(in), r.lse, dy, a(r.grad), b(r.grad), v(r.grad), local(r.grad), o,
              form);
    return r;
  }

  // Every document as its own [1, n] sequence (recurrent form, no bounds), into the same layout.
  Out alone() const {
    Out r = fresh();
    for (int64_t bb = 0; bb < B; ++bb) {
      int64_t s = 0;
      for (int64_t n : lengths[static_cast<size_t>(bb)]) {
        auto cut = [&](const Tensor& x) { return x.defined() ? x.narrow(0, bb, 1).narrow(1, s, n) : Tensor(); };
        OwnedTensor lse(dt, Device::CPU, {1, n, H, L}), mu(dt, Device::CPU, {1, H, L, Dv});
        latte_fwd(Ctx{}, cut(a(in)), cut(b(in)), cut(v(in)), cut(local(in)), cut(r.y), lse, mu, {}, LatteForm::Recurrent);
        latte_bwd(Ctx{}, cut(a(in)), cut(b(in)), cut(v(in)), cut(local(in)), lse, cut(dy), cut(a(r.grad)),
                  cut(b(r.grad)), cut(v(r.grad)), cut(local(r.grad)), {}, LatteForm::Recurrent);
        copy_tensor(r.lse->narrow(0, bb, 1).narrow(1, s, n).select(0, 0), lse->select(0, 0));
        copy_tensor(r.mu->narrow(0, bb, 1), mu);  // the last document's stays
        s += n;
      }
    }
    return r;
  }
};

void expect_same(const DocProblem& p, const DocProblem::Out& got, const DocProblem::Out& want, double tol) {
  EXPECT_LT(test::rel_error(got.y, want.y), tol) << "y";
  EXPECT_LT(test::rel_error(got.lse, want.lse), tol) << "lse";
  EXPECT_LT(test::rel_error(got.mu, want.mu), tol) << "mu_final";
  const char* names[] = {"da", "db", "dv", "dlocal"};
  int i = 0;
  for (const Tensor& g : {p.a(got.grad), p.b(got.grad), p.v(got.grad), p.local(got.grad)}) {
    const Tensor w = i == 0 ? p.a(want.grad) : i == 1 ? p.b(want.grad) : i == 2 ? p.v(want.grad) : p.local(want.grad);
    if (g.defined()) {
      const auto gv = test::view_values(g), wv = test::view_values(w);
      ASSERT_TRUE(test::all_finite(gv)) << names[i];
      EXPECT_LT(test::rel_error(gv, wv), tol) << names[i];
    }
    ++i;
  }
}

// Rows of T = 40: documents of 1 to 19 tokens, starts at 8, 16 and 24 (chunk boundaries of the
// chunked form at C = 8), runs of one-token documents, one document for the whole row.
const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 7, 5, 8, 19}, {40}, {3, 1, 1, 3, 8, 5, 16, 3}, {8, 8, 1, 1, 1, 1, 20}};

struct DocCase {
  std::string name;
  double b_scale, offset;
};
const DocCase kLogits[] = {{"logits +-3", 3.0, 0.0}, {"documents' logits 400 apart", 3.0, 200.0},
                           {"logits +-1000 (exact exponents)", 1000.0, 0.0}};

void check_forms(DType dt, double tol) {
  for (const DocCase& dc : kLogits)
    for (bool mac : {false, true}) {
      SCOPED_TRACE(dc.name + (mac ? " Macchiato" : " plain") + " " + dtype_name(dt));
      const DocProblem p(kLayouts, 2, 3, 4, mac, dt, dc.b_scale, dc.offset);
      const DocProblem::Out want = p.alone();
      {
        SCOPED_TRACE("recurrent");
        expect_same(p, p.packed(LatteForm::Recurrent, 8), want, tol);
      }
      {
        SCOPED_TRACE("quadratic");
        expect_same(p, p.packed(LatteForm::Quadratic, 8), want, tol);
      }
      for (int64_t C : {8, 5, 64}) {
        SCOPED_TRACE("chunked C=" + std::to_string(C));
        expect_same(p, p.packed(LatteForm::Chunked, C), want, tol);
      }
    }
}

TEST(LatteDocs, PackedEqualsDocumentsAloneF64) { check_forms(DType::F64, 1e-12); }

TEST(LatteDocs, PackedEqualsDocumentsAloneF32) { check_forms(DType::F32, 2e-5); }

// L = 16 latents and a wider value: the chunked form's latent sums at a realistic width.
TEST(LatteDocs, PackedEqualsDocumentsAloneWide) {
  for (bool mac : {false, true}) {
    SCOPED_TRACE(mac ? "Macchiato" : "plain");
    const DocProblem p(kLayouts, 1, 16, 8, mac, DType::F64, 3.0, 50.0, 7);
    expect_same(p, p.packed(LatteForm::Chunked, 8), p.alone(), 1e-12);
  }
}

// Without the bounds a later document sees its predecessors: y and the gradients change.
TEST(LatteDocs, BoundsMatter) {
  const DocProblem p(kLayouts, 2, 3, 4, true, DType::F64, 3.0, 0.0);
  const DocProblem::Out with = p.packed(LatteForm::Chunked, 8), without = p.packed(LatteForm::Chunked, 8, false);
  EXPECT_GT(test::rel_error(with.y, without.y), 1e-2);
  EXPECT_GT(test::rel_error(test::view_values(p.b(with.grad)), test::view_values(p.b(without.grad))), 1e-2);
}

}  // namespace
}  // namespace linac::test_latte_docs
