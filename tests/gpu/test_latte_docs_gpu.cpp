// Latte CUDA with document bounds (LatteOpts::docs) vs the CPU chunked reference (double, same
// bounds, same rounded inputs; tests/cpu/test_latte_docs.cpp checks that reference against each
// document run alone), f32 and bf16: forward (y, lse, mu_final) and backward (da, db, dv, dlocal).
// Rows of T = 300 hold documents of one token, documents starting exactly at the chunk boundaries
// 64 and 128, runs of 17-token documents (several per chunk), a row that is one document and a
// ragged last chunk. Logits +-3, documents' logits 400 apart (only the per-document factorisation
// reference keeps the tensor-core products finite), and +-1000 (exact exponents). The batch in
// groups (a workspace of two sequences: each group reads its own rows' bounds) gives the same bits,
// and so does keeping the forward's chunk states for the backward (LatteOpts::saved_states).
#include <string>
#include <utility>
#include <vector>

#include "latte/latte.h"
#include "latte_layout.h"
#include "test_util.h"

namespace linac::test_latte_docs_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67, 100}, {300}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 11},
    {130, 1, 1, 68, 100}};

struct Case {
  int64_t H, L, Dv;
  bool mac;
  double b_scale, doc_offset;  // b uniform in [-b_scale, b_scale], +-doc_offset alternately per document
  int64_t pad = 3;             // 3: misaligned rows (element loads); 0: aligned rows (vector loads)
};

std::string name(const Case& c) {
  return "H=" + std::to_string(c.H) + " L=" + std::to_string(c.L) + " Dv=" + std::to_string(c.Dv) +
         (c.mac ? " Macchiato" : " plain") + " b_scale=" + std::to_string(c.b_scale) +
         " offset=" + std::to_string(c.doc_offset) + " pad=" + std::to_string(c.pad);
}

struct Inputs : test::LatteLayout {
  Case c;
  int64_t B, T;
  OwnedTensor in, dy, docs;  // host; in: [B, T, W] in the layout's columns (f64), docs [2, B, T]
  Inputs(const Case& cs, const std::vector<std::vector<int64_t>>& lens, uint64_t seed)
      : LatteLayout(cs.H, cs.L, cs.Dv, cs.mac, cs.pad), c(cs), B(static_cast<int64_t>(lens.size())), T(0) {
    for (int64_t n : lens[0]) T += n;
    in = test::random_tensor({B, T, W}, DType::F64, seed);
    dy = test::random_tensor({B, T, c.H, c.Dv}, DType::F64, seed + 1);
    docs = test::doc_bounds_of(lens);
    // b scaled, and shifted by +-doc_offset alternately per document.
    const Tensor bv = b(in);
    for (int64_t bb = 0; bb < B; ++bb) {
      int64_t s = 0, k = 0;
      for (int64_t n : lens[static_cast<size_t>(bb)]) {
        for (int64_t t = s; t < s + n; ++t)
          for (int64_t e = 0; e < c.H * c.L; ++e) {
            double& x = bv.data<double>()[(bb * T + t) * W + e];
            x = c.b_scale * x + (k % 2 ? c.doc_offset : -c.doc_offset);
          }
        s += n, ++k;
      }
    }
  }
};

struct Result {
  OwnedTensor y, lse, mu, grad;
};

// Forward + backward on ctx's device with the bounds `docs` ([2, B, T] on that device); saved:
// LatteOpts::saved_states.
Result run(const Ctx& ctx, const Inputs& I, const Tensor& in, const Tensor& dy, const Tensor& docs, DType state_dt,
           const Tensor& saved = Tensor()) {
  const Device dev = ctx.device;
  const int64_t B = I.B, T = I.T, H = I.c.H, L = I.c.L, Dv = I.c.Dv;
  Result r{OwnedTensor(in.dtype, dev, {B, T, H, Dv}), OwnedTensor(state_dt, dev, {B, T, H, L}),
           OwnedTensor(state_dt, dev, {B, H, L, Dv}), OwnedTensor(in.dtype, dev, {B, T, I.W})};
  for (const Tensor* t : {&r.y.t, &r.lse.t, &r.mu.t, &r.grad.t}) test::poison(*t);
  LatteOpts opts;
  opts.docs = test::doc_view(docs);
  opts.saved_states = saved;
  latte_fwd(ctx, I.a(in), I.b(in), I.v(in), I.local(in), r.y, r.lse, r.mu, opts);
  latte_bwd(ctx, I.a(in), I.b(in), I.v(in), I.local(in), r.lse, dy, I.a(r.grad), I.b(r.grad), I.v(r.grad),
            I.local(r.grad), opts);
  ctx_synchronize(ctx);
  return r;
}

void expect_parity(const Inputs& I, const Result& g, const Result& c, double tol) {
  EXPECT_LT(test::rel_error(g.y, c.y), tol) << "y";
  EXPECT_LT(test::rel_error(g.lse, c.lse), tol) << "lse";
  EXPECT_LT(test::rel_error(g.mu, c.mu), tol) << "mu_final";
  using View = Tensor (Inputs::*)(const Tensor&) const;
  const std::pair<const char*, View> grads[] = {{"da", &Inputs::a}, {"db", &Inputs::b}, {"dv", &Inputs::v},
                                                {"dlocal", &Inputs::local}};
  for (const auto& [what, fn] : grads) {
    const Tensor gx = (I.*fn)(g.grad), cx = (I.*fn)(c.grad);
    if (!gx.defined()) continue;
    const auto gv = test::view_values(gx);
    ASSERT_TRUE(test::all_finite(gv)) << what;
    EXPECT_LT(test::rel_error(gv, test::view_values(cx)), tol) << what;
  }
}

const Case kCases[] = {{2, 16, 64, false, 3.0, 0.0},   {3, 64, 96, true, 3.0, 200.0}, {2, 1, 128, true, 2.0, 0.0},
                       {2, 32, 128, false, 3.0, 100.0, 0}, {1, 16, 64, true, 3.0, 0.0, 0}};

void parity(DType act, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs I(c, kLayouts, 1);
    const OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
    const OwnedTensor docs_g = to(I.docs, Device::CUDA, DType::I32);
    const Result g = run(gctx.ctx(), I, in_g, dy_g, docs_g, DType::F32);
    const OwnedTensor in_c = to(in_g, Device::CPU, DType::F64), dy_c = to(dy_g, Device::CPU, DType::F64);
    const Result r = run(Ctx{}, I, in_c, dy_c, I.docs, DType::F64);
    // lse near 200 holds f32 to ~1e-5 relative in every exp(b - lse).
    expect_parity(I, g, r, c.doc_offset > 0 && act == DType::F32 ? 1e-4 : tol);
  }
}

TEST(LatteDocsGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  parity(DType::F32, 1e-5);
}

TEST(LatteDocsGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  parity(DType::BF16, 1e-2);
}

// b uniform in [-1000, 1000]: the exact-exponent path in almost every chunk, with documents.
TEST(LatteDocsGpu, LargeLogits) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::F32, DType::BF16})
    for (bool mac : {false, true}) {
      const Case c{2, 16, 96, mac, 1000.0, 0.0};
      SCOPED_TRACE(name(c) + " " + dtype_name(act));
      Inputs I(c, kLayouts, 5);
      const OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
      const OwnedTensor docs_g = to(I.docs, Device::CUDA, DType::I32);
      const Result g = run(gctx.ctx(), I, in_g, dy_g, docs_g, DType::F32);
      const OwnedTensor in_c = to(in_g, Device::CPU, DType::F64), dy_c = to(dy_g, Device::CPU, DType::F64);
      const Result r = run(Ctx{}, I, in_c, dy_c, I.docs, DType::F64);
      expect_parity(I, g, r, act == DType::F32 ? 5e-4 : 1e-2);
    }
}

// Bitwise reruns; a workspace of two sequences (groups of rows, each reading its own rows' bounds)
// gives the bits of one group; the forward's chunk states kept for the backward change no bit.
TEST(LatteDocsGpu, DeterministicAndGrouped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(act));
    const Case c{2, 16, 96, true, 3.0, 0.0};
    Inputs I(c, kLayouts, 11);
    const OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
    const OwnedTensor docs_g = to(I.docs, Device::CUDA, DType::I32);
    const Result r1 = run(gctx.ctx(), I, in_g, dy_g, docs_g, DType::F32);
    const Result r2 = run(gctx.ctx(), I, in_g, dy_g, docs_g, DType::F32);
    Ctx small = gctx.ctx();
    small.workspace_bytes = 2 * latte_workspace_bytes_per_seq(I.T, c.H, c.L, c.Dv, act) + 1000;
    const Result r3 = run(small, I, in_g, dy_g, docs_g, DType::F32);
    OwnedTensor states(DType::F32, Device::CUDA,
                       {static_cast<int64_t>(latte_saved_state_bytes(I.B, I.T, c.H, c.L, c.Dv) / 4)});
    test::poison(states);
    const Result r4 = run(gctx.ctx(), I, in_g, dy_g, docs_g, DType::F32, states);
    const Result r5 = run(small, I, in_g, dy_g, docs_g, DType::F32, states);
    for (const Result* r : {&r2, &r3, &r4, &r5}) {
      EXPECT_TRUE(test::same_bits(r1.y, r->y));
      EXPECT_TRUE(test::same_bits(r1.lse, r->lse));
      EXPECT_TRUE(test::same_bits(r1.mu, r->mu));
      EXPECT_TRUE(test::same_bits(r1.grad, r->grad));
    }
  }
}

}  // namespace
}  // namespace linac::test_latte_docs_gpu
