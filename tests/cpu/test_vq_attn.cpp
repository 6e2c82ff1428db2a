// VQ-attention CPU reference: block form == quadratic form (docs/transformer_vq.md §2, stop-gradient on cache
// keys), forward and backward, in double over several blocks with T not a multiple of Lb, a
// small codebook (codes repeat), H > 1 and Dk != Dv; gradient check of the block backward against
// central differences (khat as an input with the codes fixed: quantization is piecewise
// constant); the quantizer (ties, brute force), code statistics, the EMA/codebook update, the
// decode step against the forward across the window boundary and into the cache, and the prefill
// handover against the steps it replaces. q, khat, v are strided views of one fused buffer, as
// the mixer passes them.
#include <cmath>
#include <string>

#include "document_checks.h"
#include "elementwise/elementwise.h"
#include "test_util.h"
#include "vq_attn/vq_attn.h"
#include "vq_state_checks.h"

namespace linac::test_vq_attn {
namespace {

using test::token;

struct Shape {
  int64_t B, T, H, Dk, Dv, S, Lb;
};

std::string name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " Dk=" + std::to_string(s.Dk) + " Dv=" + std::to_string(s.Dv) + " S=" + std::to_string(s.S) +
         " Lb=" + std::to_string(s.Lb);
}

// Random q, v, codebook, biases and codes; khat holds the codewords of z.
struct Problem {
  Shape s;
  int64_t W;
  OwnedTensor in, grad;  // [B,T,W]: q | khat | v (+ a pad column so no view is contiguous)
  OwnedTensor z, codebook, u, vr, rho, dout;
  VqAttnOpts opts;

  explicit Problem(const Shape& sh, uint64_t seed = 1)
      : s(sh), W(sh.H * (2 * sh.Dk + sh.Dv) + 1), in(test::random_tensor({sh.B, sh.T, W}, DType::F64, seed)),
        grad(DType::F64, Device::CPU, {sh.B, sh.T, W}), z(DType::I32, Device::CPU, {sh.B, sh.T, sh.H}),
        codebook(test::random_tensor({sh.H, sh.S, sh.Dk}, DType::F64, seed + 1)),
        u(test::random_tensor({sh.H, sh.Dk}, DType::F64, seed + 2, -0.5, 0.5)),
        vr(test::random_tensor({sh.H, sh.Dk}, DType::F64, seed + 3, -0.5, 0.5)),
        rho(test::random_tensor({sh.H, sh.Lb + 1, sh.Dk}, DType::F64, seed + 4)),
        dout(test::random_tensor({sh.B, sh.T, sh.H, sh.Dv}, DType::F64, seed + 5)) {
    opts.block = sh.Lb;
    const auto r = test::random_values(static_cast<size_t>(sh.B * sh.T * sh.H), seed + 6, 0, static_cast<double>(sh.S));
    const Tensor kh = khat(in);
    for (int64_t b = 0; b < sh.B; ++b)
      for (int64_t t = 0; t < sh.T; ++t)
        for (int64_t h = 0; h < sh.H; ++h) {
          const int64_t i = (b * sh.T + t) * sh.H + h;
          const int32_t code = std::min(static_cast<int32_t>(r[i]), static_cast<int32_t>(sh.S - 1));
          z->data<int32_t>()[i] = code;
          for (int64_t d = 0; d < sh.Dk; ++d)
            kh.data<double>()[b * kh.strides[0] + t * kh.strides[1] + h * sh.Dk + d] =
                codebook->data<double>()[(h * sh.S + code) * sh.Dk + d];
        }
  }
  Tensor q(const Tensor& x) const { return test::bthd(x, 0, s.H, s.Dk); }
  Tensor khat(const Tensor& x) const { return test::bthd(x, s.H * s.Dk, s.H, s.Dk); }
  Tensor v(const Tensor& x) const { return test::bthd(x, 2 * s.H * s.Dk, s.H, s.Dv); }

  struct Out {
    OwnedTensor o, lse;
  };
  Out forward(VqAttnForm form) const {
    Out r{OwnedTensor(DType::F64, Device::CPU, {s.B, s.T, s.H, s.Dv}), OwnedTensor(DType::F64, Device::CPU, {s.B, s.T, s.H})};
    test::poison(r.o);
    test::poison(r.lse);
    vq_attn_fwd(Ctx{}, q(in), khat(in), z, v(in), codebook, u, vr, rho, r.o, r.lse, opts, form);
    return r;
  }
  struct Grads {
    std::vector<double> dq, dkhat, dv, du, dvr, drho;
  };
  // Gradients of loss = sum(o * dout); dq/dkhat/dv also land in `grad` (same layout as `in`).
  Grads backward(VqAttnForm form) {
    const Out f = forward(form);
    OwnedTensor du(DType::F64, Device::CPU, {s.H, s.Dk}), dvr(DType::F64, Device::CPU, {s.H, s.Dk});
    OwnedTensor drho(DType::F64, Device::CPU, {s.H, s.Lb + 1, s.Dk});
    test::poison(grad);
    test::poison(du), test::poison(dvr), test::poison(drho);
    vq_attn_bwd(Ctx{}, q(in), khat(in), z, v(in), codebook, u, vr, rho, f.o, f.lse, dout, q(grad), khat(grad),
                v(grad), du, dvr, drho, opts, form);
    // The pad column is no gradient: zero it so `grad` lines up with `in` for the gradient check.
    for (int64_t bt = 0; bt < s.B * s.T; ++bt) grad->data<double>()[bt * W + W - 1] = 0;
    return {test::view_values(q(grad)), test::view_values(khat(grad)), test::view_values(v(grad)),
            to_doubles(du), to_doubles(dvr), to_doubles(drho)};
  }
  double loss(VqAttnForm form) const {
    const auto o = to_doubles(forward(form).o), d = to_doubles(dout);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * d[i];
    return l;
  }
};

// Several blocks (so the cache fills), T not a multiple of Lb, T < Lb, Lb = 1, Dk != Dv.
const Shape kShapes[] = {{2, 37, 2, 8, 12, 7, 5}, {1, 50, 3, 6, 10, 7, 8}, {2, 9, 1, 4, 5, 3, 1},
                         {1, 6, 2, 5, 3, 7, 8},   {1, 33, 1, 8, 8, 2, 4}};

TEST(VqAttnCpu, BlockFormEqualsQuadratic) {
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE(name(sh));
    Problem p(sh);
    const auto blk = p.forward(VqAttnForm::Block), quad = p.forward(VqAttnForm::Quadratic);
    EXPECT_TRUE(test::all_finite(to_doubles(blk.o)));
    EXPECT_LT(test::rel_error(blk.o, quad.o), 1e-12);
    EXPECT_LT(test::rel_error(blk.lse, quad.lse), 1e-12);
  }
}

TEST(VqAttnCpu, BlockBackwardEqualsQuadratic) {
  for (const Shape& sh : kShapes) {
    SCOPED_TRACE(name(sh));
    Problem p(sh);
    const auto blk = p.backward(VqAttnForm::Block), quad = p.backward(VqAttnForm::Quadratic);
    EXPECT_TRUE(test::all_finite(blk.dq) && test::all_finite(blk.dkhat) && test::all_finite(blk.dv));
    EXPECT_LT(test::rel_error(blk.dq, quad.dq), 1e-12);
    EXPECT_LT(test::rel_error(blk.dkhat, quad.dkhat), 1e-12);
    EXPECT_LT(test::rel_error(blk.dv, quad.dv), 1e-12);
    EXPECT_LT(test::rel_error(blk.du, quad.du), 1e-12);
    EXPECT_LT(test::rel_error(blk.dvr, quad.dvr), 1e-12);
    EXPECT_LT(test::rel_error(blk.drho, quad.drho), 1e-12);
  }
}

// Keys compressed into the cache send no gradient to khat (docs/transformer_vq.md §4.2): with STE on every key the
// gradient would differ, so a cache-region query must leave dkhat of an old key untouched.
TEST(VqAttnCpu, CacheKeysGetNoGradient) {
  Problem p({1, 12, 1, 4, 3, 3, 3});
  // Only the last query's output matters: it sits in block 3, so keys 0..5 are in its cache.
  auto d = p.dout->data<double>();
  for (int64_t i = 0; i < 11 * 3; ++i) d[i] = 0;
  const auto g = p.backward(VqAttnForm::Block);
  for (int64_t j = 0; j < 6 * 4; ++j) EXPECT_EQ(g.dkhat[j], 0.0) << j;
  double window = 0;
  for (int64_t j = 6 * 4; j < 12 * 4; ++j) window += std::fabs(g.dkhat[j]);
  EXPECT_GT(window, 0.0);
  // The cache still routes value gradients to old tokens (docs/transformer_vq.md §4.3).
  double old_dv = 0;
  for (int64_t j = 0; j < 6 * 3; ++j) old_dv += std::fabs(g.dv[j]);
  EXPECT_GT(old_dv, 0.0);
}

TEST(VqAttnCpu, BlockGradCheckDouble) {
  for (const Shape& sh : {Shape{2, 23, 2, 6, 5, 4, 4}, Shape{1, 30, 1, 4, 7, 3, 6}}) {
    SCOPED_TRACE(name(sh));
    Problem p(sh);
    const auto g = p.backward(VqAttnForm::Block);
    const auto analytic = to_doubles(p.grad);  // dq | dkhat | dv in the fused layout, 0 in the pad
    auto loss = [&] { return p.loss(VqAttnForm::Block); };
    EXPECT_LT(test::check_grad(loss, p.in->data<double>(), analytic.data(), analytic.size(), 200, 3, 1e-5), 1e-6);
    EXPECT_LT(test::check_grad(loss, p.u->data<double>(), g.du.data(), g.du.size(), 30, 4, 1e-5), 1e-6);
    EXPECT_LT(test::check_grad(loss, p.vr->data<double>(), g.dvr.data(), g.dvr.size(), 30, 5, 1e-5), 1e-6);
    EXPECT_LT(test::check_grad(loss, p.rho->data<double>(), g.drho.data(), g.drho.size(), 60, 6, 1e-5), 1e-6);
  }
}

// VqAttnOpts::v_pre: with v = SiLU(v_pre) the backward writes d/dv_pre into dv, in both forms;
// checked against central differences through the SiLU (fails if its derivative is skipped).
TEST(VqAttnCpu, SiluValueGradCheckDouble) {
  for (const VqAttnForm form : {VqAttnForm::Block, VqAttnForm::Quadratic}) {
    SCOPED_TRACE(static_cast<int>(form));
    Problem p({2, 23, 2, 6, 5, 4, 4}, 17);
    // `in` holds q | khat | v_pre; `act` the same with SiLU applied to the v columns.
    OwnedTensor act(DType::F64, Device::CPU, {p.s.B, p.s.T, p.W});
    const int64_t v0 = 2 * p.s.H * p.s.Dk, v1 = v0 + p.s.H * p.s.Dv;
    auto activate = [&] {
      const double* x = p.in->data<double>();
      double* y = act->data<double>();
      for (int64_t r = 0; r < p.s.B * p.s.T; ++r)
        for (int64_t j = 0; j < p.W; ++j) {
          const double v = x[r * p.W + j];
          y[r * p.W + j] = j >= v0 && j < v1 ? v / (1 + std::exp(-v)) : v;
        }
    };
    auto forward = [&] {
      activate();
      Problem::Out r{OwnedTensor(DType::F64, Device::CPU, {p.s.B, p.s.T, p.s.H, p.s.Dv}),
                     OwnedTensor(DType::F64, Device::CPU, {p.s.B, p.s.T, p.s.H})};
      vq_attn_fwd(Ctx{}, p.q(act), p.khat(act), p.z, p.v(act), p.codebook, p.u, p.vr, p.rho, r.o, r.lse, p.opts, form);
      return r;
    };
    const Problem::Out f = forward();
    OwnedTensor du(DType::F64, Device::CPU, {p.s.H, p.s.Dk}), dvr(DType::F64, Device::CPU, {p.s.H, p.s.Dk});
    OwnedTensor drho(DType::F64, Device::CPU, {p.s.H, p.s.Lb + 1, p.s.Dk});
    VqAttnOpts og = p.opts;
    og.v_pre = p.v(p.in);
    test::poison(p.grad);
    vq_attn_bwd(Ctx{}, p.q(act), p.khat(act), p.z, p.v(act), p.codebook, p.u, p.vr, p.rho, f.o, f.lse, p.dout,
                p.q(p.grad), p.khat(p.grad), p.v(p.grad), du, dvr, drho, og, form);
    std::vector<double> analytic = to_doubles(p.grad);
    const int64_t n = p.in->numel();
    for (int64_t i = p.W - 1; i < n; i += p.W) analytic[static_cast<size_t>(i)] = 0;  // the pad column
    auto loss = [&] {
      const auto o = to_doubles(forward().o), d = to_doubles(p.dout);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += o[i] * d[i];
      return l;
    };
    EXPECT_LT(test::check_grad(loss, p.in->data<double>(), analytic.data(), static_cast<size_t>(n), 200, 3, 1e-5),
              1e-6);
  }
}

// The pre-activations must have v's shape.
TEST(VqAttnCpu, SiluValueNeedsVShape) {
  Problem p({1, 9, 1, 4, 5, 3, 4});
  const Problem::Out f = p.forward(VqAttnForm::Block);
  OwnedTensor du(DType::F64, Device::CPU, {1, 4}), dvr(DType::F64, Device::CPU, {1, 4}),
      drho(DType::F64, Device::CPU, {1, 5, 4});
  VqAttnOpts opts = p.opts;
  opts.v_pre = p.v(p.in).narrow(1, 0, 8);  // T = 8 against 9
  EXPECT_THROW(vq_attn_bwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, f.o, f.lse,
                           p.dout, p.q(p.grad), p.khat(p.grad), p.v(p.grad), du, dvr, drho, opts),
               Error);
}

TEST(VqAttnCpu, FloatMatchesDouble) {
  const Shape sh{2, 41, 2, 8, 12, 7, 6};
  Problem p(sh);
  const auto ref = p.forward(VqAttnForm::Block);
  auto f = [](const Tensor& t) { return to(t, Device::CPU, DType::F32); };
  OwnedTensor in = f(p.in), cb = f(p.codebook), u = f(p.u), vr = f(p.vr), rho = f(p.rho);
  OwnedTensor o(DType::F32, Device::CPU, {sh.B, sh.T, sh.H, sh.Dv}), lse(DType::F32, Device::CPU, {sh.B, sh.T, sh.H});
  test::poison(o);
  vq_attn_fwd(Ctx{}, p.q(in), p.khat(in), p.z, p.v(in), cb, u, vr, rho, o, lse, p.opts);
  EXPECT_LT(test::rel_error(o, ref.o), 1e-5);
  EXPECT_LT(test::rel_error(lse, ref.lse), 1e-5);
}

TEST(VqAttnCpu, DecodeStepsMatchForward) {
  for (const Shape& sh : {Shape{2, 19, 2, 6, 5, 4, 4}, Shape{1, 12, 3, 4, 6, 7, 1}}) {
    SCOPED_TRACE(name(sh));
    Problem p(sh);
    const auto ref = p.forward(VqAttnForm::Block);
    OwnedTensor rk(DType::F64, Device::CPU, {sh.B, sh.H, sh.Lb, sh.Dk}), rv(DType::F64, Device::CPU, {sh.B, sh.H, sh.Lb, sh.Dv});
    OwnedTensor rz(DType::I32, Device::CPU, {sh.B, sh.H, sh.Lb}), n(DType::F64, Device::CPU, {sh.B, sh.H, sh.S});
    OwnedTensor m(DType::F64, Device::CPU, {sh.B, sh.H, sh.S, sh.Dv});
    const VqAttnState st{rk, rv, rz, n, m};
    test::poison(rk), test::poison(rv), test::poison(n), test::poison(m);
    vq_attn_state_reset(Ctx{}, st);
    OwnedTensor o(DType::F64, Device::CPU, {sh.B, sh.T, sh.H, sh.Dv});
    test::poison(o);
    for (int64_t t = 0; t < sh.T; ++t) {
      // z of one token, as the contiguous [B,H] the step takes.
      OwnedTensor zc(DType::I32, Device::CPU, {sh.B, sh.H});
      for (int64_t b = 0; b < sh.B; ++b)
        for (int64_t h = 0; h < sh.H; ++h) zc->data<int32_t>()[b * sh.H + h] = p.z->data<int32_t>()[(b * sh.T + t) * sh.H + h];
      const OwnedTensor pos = test::int32_values(std::vector<int32_t>(sh.B, static_cast<int32_t>(t)), Device::CPU);
      vq_attn_step(Ctx{}, token(p.q(p.in), t), token(p.khat(p.in), t), zc, token(p.v(p.in), t), p.codebook, p.u, p.vr,
                   p.rho, st, pos, token(o.t, t));
    }
    EXPECT_LT(test::rel_error(o, ref.o), 1e-12);
    // The cache holds every token older than Lb, counted once per head.
    const auto counts = to_doubles(n);
    double total = 0;
    for (double c : counts) total += c;
    EXPECT_EQ(total, static_cast<double>(sh.B * sh.H * std::max<int64_t>(0, sh.T - sh.Lb)));
  }
}

// Documents (vq_attn.h): both forms over rows of packed documents equal every document run alone
// as its own sequence, forward (o, lse) and backward (dq, dkhat, dv; du, dvr, drho summed over the
// documents). T = 37 with Lb 8 and 5: documents of one token, shorter than a block, starting
// exactly at a block boundary, spanning several blocks (so their caches fill), a row that is one
// document. khat is moved off the codewords so that the forward, not only dkhat, depends on where
// a document's blocks begin.
void check_documents_alone(DType dt, double tol) {
  const std::vector<std::vector<int64_t>> lengths = {{1, 7, 8, 5, 16}, {37}, {3, 1, 1, 3, 9, 20}};
  const test::PackedWindow w = test::packed_window(lengths, 16, 3);
  const int32_t* bounds = w.docs->data<int32_t>();
  for (const int64_t Lb : {8, 5}) {
    SCOPED_TRACE("Lb " + std::to_string(Lb));
    const Shape sh{3, 37, 2, 6, 5, 5, Lb};
    Problem p(sh, 9);
    const Tensor kh = p.khat(p.in);
    const auto noise = test::random_values(static_cast<size_t>(sh.B * sh.T * sh.H * sh.Dk), 31, -0.3, 0.3);
    for (int64_t bt = 0, i = 0; bt < sh.B * sh.T; ++bt)
      for (int64_t e = 0; e < sh.H * sh.Dk; ++e) kh.data<double>()[bt * p.W + e] += noise[static_cast<size_t>(i++)];
    auto cv = [&](const Tensor& x) { return to(x, Device::CPU, dt); };
    const OwnedTensor in = cv(p.in), cb = cv(p.codebook), u = cv(p.u), vr = cv(p.vr), rho = cv(p.rho), dout = cv(p.dout);
    struct Out {
      OwnedTensor o, lse, grad, du, dvr, drho;
    };
    auto fresh = [&] {
      Out r{OwnedTensor(dt, Device::CPU, {sh.B, sh.T, sh.H, sh.Dv}), OwnedTensor(dt, Device::CPU, {sh.B, sh.T, sh.H}),
            OwnedTensor(dt, Device::CPU, {sh.B, sh.T, p.W}), OwnedTensor(dt, Device::CPU, {sh.H, sh.Dk}),
            OwnedTensor(dt, Device::CPU, {sh.H, sh.Dk}), OwnedTensor(dt, Device::CPU, {sh.H, sh.Lb + 1, sh.Dk})};
      for (const Tensor* t : {&r.o.t, &r.lse.t, &r.grad.t}) test::poison(*t);
      for (const Tensor* t : {&r.du.t, &r.dvr.t, &r.drho.t}) zero_tensor(*t);
      return r;
    };
    auto values = [&](const Out& r) {
      std::vector<std::vector<double>> v = {to_doubles(r.o), to_doubles(r.lse)};
      for (const Tensor& x : {p.q(r.grad), p.khat(r.grad), p.v(r.grad)}) v.push_back(test::view_values(x));
      for (const Tensor* x : {&r.du.t, &r.dvr.t, &r.drho.t}) v.push_back(to_doubles(*x));
      return v;
    };
    const char* names[] = {"o", "lse", "dq", "dkhat", "dv", "du", "dvr", "drho"};
    for (const VqAttnForm form : {VqAttnForm::Block, VqAttnForm::Quadratic}) {
      SCOPED_TRACE(form == VqAttnForm::Block ? "block" : "quadratic");
      Out packed = fresh(), alone = fresh();
      VqAttnOpts opts = p.opts;
      opts.docs = {bounds, bounds + sh.B * sh.T};
      vq_attn_fwd(Ctx{}, p.q(in), p.khat(in), p.z, p.v(in), cb, u, vr, rho, packed.o, packed.lse, opts, form);
      vq_attn_bwd(Ctx{}, p.q(in), p.khat(in), p.z, p.v(in), cb, u, vr, rho, packed.o, packed.lse, dout,
                  p.q(packed.grad), p.khat(packed.grad), p.v(packed.grad), packed.du, packed.dvr, packed.drho, opts,
                  form);
      OwnedTensor du(dt, Device::CPU, {sh.H, sh.Dk}), dvr(dt, Device::CPU, {sh.H, sh.Dk});
      OwnedTensor drho(dt, Device::CPU, {sh.H, sh.Lb + 1, sh.Dk});
      for (int64_t b = 0; b < sh.B; ++b) {
        int64_t s = 0;
        for (const int64_t n : lengths[static_cast<size_t>(b)]) {
          auto seg = [&](const Tensor& x) { return x.narrow(0, b, 1).narrow(1, s, n); };
          vq_attn_fwd(Ctx{}, seg(p.q(in)), seg(p.khat(in)), seg(p.z), seg(p.v(in)), cb, u, vr, rho, seg(alone.o),
                      seg(alone.lse), p.opts, form);
          vq_attn_bwd(Ctx{}, seg(p.q(in)), seg(p.khat(in)), seg(p.z), seg(p.v(in)), cb, u, vr, rho, seg(alone.o),
                      seg(alone.lse), seg(dout), seg(p.q(alone.grad)), seg(p.khat(alone.grad)),
                      seg(p.v(alone.grad)), du, dvr, drho, p.opts, form);
          add_inplace(Ctx{}, alone.du, du, 1.f);
          add_inplace(Ctx{}, alone.dvr, dvr, 1.f);
          add_inplace(Ctx{}, alone.drho, drho, 1.f);
          s += n;
        }
      }
      const auto got = values(packed), want = values(alone);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(test::all_finite(got[i])) << names[i];
        EXPECT_LT(test::rel_error(got[i], want[i]), tol) << names[i];
      }
      // Without the bounds the later documents see their predecessors.
      Out stream = fresh();
      vq_attn_fwd(Ctx{}, p.q(in), p.khat(in), p.z, p.v(in), cb, u, vr, rho, stream.o, stream.lse, p.opts, form);
      EXPECT_GT(test::rel_error(to_doubles(stream.o), got[0]), 1e-3);
    }
  }
}

TEST(VqAttnCpu, DocumentsEqualEachDocumentAlone) {
  {
    SCOPED_TRACE("double");
    check_documents_alone(DType::F64, 1e-12);
  }
  SCOPED_TRACE("float");
  check_documents_alone(DType::F32, 2e-5);
}

// Document bounds need both arrays (each document's end is read).
TEST(VqAttnCpu, DocumentsNeedBothBounds) {
  Problem p({1, 5, 1, 4, 3, 3, 2});
  OwnedTensor o(DType::F64, Device::CPU, {1, 5, 1, 3}), lse(DType::F64, Device::CPU, {1, 5, 1});
  const int32_t start[5] = {0, 0, 2, 2, 2};
  VqAttnOpts opts = p.opts;
  opts.docs.start = start;
  EXPECT_THROW(vq_attn_fwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, opts),
               Error);
}

// A saved cache or saved weights (VqAttnOpts::saved_cache, saved_weights) smaller than their
// vq_attn_saved_*_bytes (with documents: of the documents variant, sized for their placement's
// blocks) are refused; of that size they are accepted (the CPU forms do not use them).
TEST(VqAttnCpu, SavedBufferChecks) {
  Problem p({2, 9, 1, 4, 3, 3, 4});
  OwnedTensor o(DType::F64, Device::CPU, {2, 9, 1, 3}), lse(DType::F64, Device::CPU, {2, 9, 1});
  const size_t cache_bytes = vq_attn_saved_cache_bytes(2, 9, 1, 3, 3, 4, DType::F64);
  EXPECT_EQ(cache_bytes, (2 * 3 * 3 * 3 * 8 + 255) / 256 * 256 + 2 * 3 * 3 * 4);  // 3 blocks per sequence
  // Per padded row (12 per sequence) a window of 2 Lb and S cache entries, each rounded up to 8.
  const size_t weight_bytes = vq_attn_saved_weights_bytes(2, 9, 1, 3, 4, DType::F64);
  EXPECT_EQ(weight_bytes, 2 * 12 * 8 * 8 + 2 * 12 * 8 * 8);
  EXPECT_EQ(vq_attn_saved_weights_bytes(16, 2048, 1, 512, 512, DType::BF16), size_t{32768} * (1024 + 512) * 2);
  // Documents: up to 6 blocks of 512 per row of 2048 (two moved documents, gaps of up to 1022).
  EXPECT_EQ(vq_attn_saved_weights_bytes(16, 2048, 1, 512, 512, DType::BF16, true),
            size_t{16} * 6 * 512 * (1024 + 512) * 2);
  auto fwd = [&](const VqAttnOpts& opts) {
    vq_attn_fwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, opts);
  };
  const int32_t start[18] = {}, end[18] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  for (auto [field, bytes] :
       {std::pair{&VqAttnOpts::saved_cache, cache_bytes}, std::pair{&VqAttnOpts::saved_weights, weight_bytes}}) {
    SCOPED_TRACE(field == &VqAttnOpts::saved_cache ? "saved_cache" : "saved_weights");
    OwnedTensor buf(DType::U16, Device::CPU, {static_cast<int64_t>(bytes / 2)});
    VqAttnOpts opts = p.opts;
    opts.*field = buf;
    EXPECT_NO_THROW(fwd(opts));
    opts.*field = buf->narrow(0, 0, static_cast<int64_t>(bytes / 2) - 1);
    EXPECT_THROW(fwd(opts), Error);
    opts.docs = {start, end};
    const size_t doc_bytes = field == &VqAttnOpts::saved_cache
                                 ? vq_attn_saved_cache_bytes(2, 9, 1, 3, 3, 4, DType::F64, true)
                                 : vq_attn_saved_weights_bytes(2, 9, 1, 3, 4, DType::F64, true);
    OwnedTensor doc_buf(DType::U16, Device::CPU, {static_cast<int64_t>(doc_bytes / 2)});
    opts.*field = doc_buf;
    EXPECT_NO_THROW(fwd(opts));
    opts.*field = doc_buf->narrow(0, 0, static_cast<int64_t>(doc_bytes / 2) - 1);
    EXPECT_THROW(fwd(opts), Error);
    opts.*field = Tensor();
    EXPECT_NO_THROW(fwd(opts));
  }
}

// VqAttnOpts::delta_units: [B, T, H Dv / 8] f32 with Dv a multiple of 8 is accepted (the CPU
// forms do not use it: the same bits as without), any other table refused.
TEST(VqAttnCpu, DeltaUnitsChecks) {
  for (int64_t Dv : {8, 3}) {
    SCOPED_TRACE("Dv " + std::to_string(Dv));
    Problem p({2, 9, 1, 4, Dv, 3, 4});
    OwnedTensor o(DType::F64, Device::CPU, {2, 9, 1, Dv}), lse(DType::F64, Device::CPU, {2, 9, 1});
    OwnedTensor grad(DType::F64, Device::CPU, p.in->dims()), grad2(DType::F64, Device::CPU, p.in->dims());
    OwnedTensor du(DType::F64, Device::CPU, {1, 4}), dvr(DType::F64, Device::CPU, {1, 4}),
        drho(DType::F64, Device::CPU, {1, 5, 4});
    vq_attn_fwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, p.opts);
    auto bwd = [&](const VqAttnOpts& opts, const Tensor& g) {
      zero_tensor(g);
      vq_attn_bwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, p.dout, p.q(g),
                  p.khat(g), p.v(g), du, dvr, drho, opts);
    };
    bwd(p.opts, grad);
    const OwnedTensor units = test::random_tensor({2, 9, 1}, DType::F32, 4), wide(DType::F32, Device::CPU, {2, 9, 2});
    const OwnedTensor f64(DType::F64, Device::CPU, {2, 9, 1});
    VqAttnOpts opts = p.opts;
    opts.delta_units = units;
    if (Dv == 8) {
      EXPECT_NO_THROW(bwd(opts, grad2));
      EXPECT_TRUE(test::same_bits(grad, grad2));
    } else {
      EXPECT_THROW(bwd(opts, grad2), Error);
    }
    for (const Tensor* bad : {&wide.t, &f64.t}) {
      opts.delta_units = *bad;
      EXPECT_THROW(bwd(opts, grad2), Error);
    }
  }
}

// The prefill handover leaves the state of the steps it replaces, bit for bit: the cache filled
// (T past two windows), a prompt shorter than the window, exactly one window, windows of one; with
// documents, last documents of one token, of fewer tokens than the window and of more.
TEST(VqAttnCpu, PrefillLeavesTheStateOfItsSteps) {
  const std::vector<std::vector<int64_t>> one_doc;
  const std::pair<Shape, std::vector<std::vector<int64_t>>> cases[] = {{{2, 19, 2, 6, 5, 4, 4}, one_doc},
                                                                       {{2, 19, 2, 6, 5, 4, 4}, {{3, 16}, {18, 1}}},
                                                                       {{2, 23, 1, 3, 7, 5, 4}, {{1, 6, 16}, {20, 3}}},
                                                                       {{1, 3, 1, 4, 6, 7, 8}, one_doc},
                                                                       {{2, 8, 1, 3, 4, 5, 8}, {{2, 6}, {8}}},
                                                                       {{1, 12, 3, 4, 6, 7, 1}, {{5, 7}}}};
  for (const auto& [sh, docs] : cases) {
    SCOPED_TRACE(name(sh) + (docs.empty() ? "" : ", documents"));
    Problem p(sh, 31);
    test::check_state_prefill_matches_steps(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr,
                                            p.rho, docs);
  }
}

// Decoding: after vq_attn_state_start_document(row 0) at a position that is not a multiple of Lb
// (its position back to 0, row 1's running on), row 0 continues exactly as the forward of its
// second document alone (ring slots of the first document absent, cache empty, then refilled),
// while row 1 decodes on as its one-document forward.
TEST(VqAttnCpu, DecodeStartDocumentMatchesDocumentAlone) {
  const Shape sh{2, 23, 2, 6, 5, 4, 4};
  const int64_t n1 = 7;
  Problem p(sh);
  const auto ref = p.forward(VqAttnForm::Block);
  Problem::Out second{OwnedTensor(DType::F64, Device::CPU, {1, sh.T - n1, sh.H, sh.Dv}),
                      OwnedTensor(DType::F64, Device::CPU, {1, sh.T - n1, sh.H})};
  auto seg = [&](const Tensor& x) { return x.narrow(0, 0, 1).narrow(1, n1, sh.T - n1); };
  vq_attn_fwd(Ctx{}, seg(p.q(p.in)), seg(p.khat(p.in)), seg(p.z), seg(p.v(p.in)), p.codebook, p.u, p.vr, p.rho,
              second.o, second.lse, p.opts);
  OwnedTensor rk(DType::F64, Device::CPU, {sh.B, sh.H, sh.Lb, sh.Dk}), rv(DType::F64, Device::CPU, {sh.B, sh.H, sh.Lb, sh.Dv});
  OwnedTensor rz(DType::I32, Device::CPU, {sh.B, sh.H, sh.Lb}), n(DType::F64, Device::CPU, {sh.B, sh.H, sh.S});
  OwnedTensor m(DType::F64, Device::CPU, {sh.B, sh.H, sh.S, sh.Dv});
  const VqAttnState st{rk, rv, rz, n, m};
  vq_attn_state_reset(Ctx{}, st);
  OwnedTensor o(DType::F64, Device::CPU, {sh.B, sh.T, sh.H, sh.Dv});
  test::poison(o);
  for (int64_t t = 0; t < sh.T; ++t) {
    if (t == n1) vq_attn_state_start_document(Ctx{}, st, 0);
    OwnedTensor zc(DType::I32, Device::CPU, {sh.B, sh.H});
    for (int64_t b = 0; b < sh.B; ++b)
      for (int64_t h = 0; h < sh.H; ++h) zc->data<int32_t>()[b * sh.H + h] = p.z->data<int32_t>()[(b * sh.T + t) * sh.H + h];
    const OwnedTensor pos =
        test::int32_values({static_cast<int32_t>(t < n1 ? t : t - n1), static_cast<int32_t>(t)}, Device::CPU);
    vq_attn_step(Ctx{}, token(p.q(p.in), t), token(p.khat(p.in), t), zc, token(p.v(p.in), t), p.codebook, p.u, p.vr,
                 p.rho, st, pos, token(o.t, t));
  }
  EXPECT_LT(test::rel_error(test::view_values(o->narrow(0, 0, 1).narrow(1, n1, sh.T - n1)), to_doubles(second.o)), 1e-12);
  EXPECT_LT(test::rel_error(test::view_values(o->narrow(0, 0, 1).narrow(1, 0, n1)),
                            test::view_values(ref.o->narrow(0, 0, 1).narrow(1, 0, n1))), 1e-12);
  EXPECT_LT(test::rel_error(test::view_values(o->narrow(0, 1, 1)), test::view_values(ref.o->narrow(0, 1, 1))), 1e-12);
  // Row 0's cache holds only its second document's tokens older than Lb.
  double row0 = 0;
  for (int64_t i = 0; i < sh.H * sh.S; ++i) row0 += n->data<double>()[i];
  EXPECT_EQ(row0, static_cast<double>(sh.H * (sh.T - n1 - sh.Lb)));
}

// Squared distance computed directly, for the brute-force checks.
double sq_dist(const double* a, const double* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return d;
}

TEST(VqQuantCpu, MatchesBruteForce) {
  const int64_t B = 2, T = 13, H = 3, Dk = 5, S = 9;
  OwnedTensor buf = test::random_tensor({B, T, 2 * H * Dk + 1}, DType::F64, 11);
  const Tensor k = test::bthd(buf, 0, H, Dk), khat = test::bthd(buf, H * Dk, H, Dk);
  OwnedTensor cb = test::random_tensor({H, S, Dk}, DType::F64, 12);
  OwnedTensor z(DType::I32, Device::CPU, {B, T, H}), err(DType::F64, Device::CPU, {B, T, H});
  test::poison(err);  // khat is a strided view: it holds random values, never a codeword
  vq_quantize(Ctx{}, k, cb, z, khat, err);
  const auto kv = test::view_values(k), khv = test::view_values(khat), e = to_doubles(err);
  const double* c = cb->data<double>();
  for (int64_t i = 0; i < B * T * H; ++i) {
    const int64_t h = i % H;
    int64_t best = 0;
    for (int64_t s = 1; s < S; ++s)
      if (sq_dist(&kv[i * Dk], c + (h * S + s) * Dk, Dk) < sq_dist(&kv[i * Dk], c + (h * S + best) * Dk, Dk)) best = s;
    ASSERT_EQ(z->data<int32_t>()[i], best) << i;
    for (int64_t d = 0; d < Dk; ++d) EXPECT_EQ(khv[i * Dk + d], c[(h * S + best) * Dk + d]);
    EXPECT_NEAR(e[i], sq_dist(&kv[i * Dk], c + (h * S + best) * Dk, Dk), 1e-14);
  }
}

TEST(VqQuantCpu, TiesGoToTheLowestCode) {
  // Codes 1 and 3 are +-e0, code 4 repeats code 1; k = 0.5 e1 is equally far from 1, 3 and 4.
  const int64_t Dk = 3, S = 5;
  OwnedTensor cb = test::random_tensor({1, S, Dk}, DType::F64, 21, 5, 9);
  double* c = cb->data<double>();
  for (int64_t d = 0; d < Dk; ++d) c[1 * Dk + d] = c[3 * Dk + d] = c[4 * Dk + d] = 0;
  c[1 * Dk] = 1, c[3 * Dk] = -1, c[4 * Dk] = 1;
  OwnedTensor k(DType::F64, Device::CPU, {1, 1, 1, Dk}), khat(DType::F64, Device::CPU, {1, 1, 1, Dk});
  OwnedTensor z(DType::I32, Device::CPU, {1, 1, 1});
  k->data<double>()[0] = 0, k->data<double>()[1] = 0.5, k->data<double>()[2] = 0;
  vq_quantize(Ctx{}, k, cb, z, khat, Tensor());
  EXPECT_EQ(z->data<int32_t>()[0], 1);
  // Moving k a little towards -e0 picks code 3.
  k->data<double>()[0] = -1e-3;
  vq_quantize(Ctx{}, k, cb, z, khat, Tensor());
  EXPECT_EQ(z->data<int32_t>()[0], 3);
}

TEST(VqQuantCpu, CodeStatsMatchDirectLoop) {
  const int64_t B = 3, T = 17, H = 2, Dk = 4, S = 6;
  OwnedTensor buf = test::random_tensor({B, T, H * Dk + 3}, DType::F64, 31);
  const Tensor k = test::bthd(buf, 1, H, Dk);
  OwnedTensor z(DType::I32, Device::CPU, {B, T, H});
  const auto r = test::random_values(static_cast<size_t>(B * T * H), 32, 0, S);
  for (int64_t i = 0; i < B * T * H; ++i) z->data<int32_t>()[i] = std::min<int32_t>(static_cast<int32_t>(r[i]), S - 1);
  OwnedTensor sums(DType::F64, Device::CPU, {H, S, Dk}), counts(DType::F64, Device::CPU, {H, S});
  test::poison(sums), test::poison(counts);
  vq_code_stats(Ctx{}, k, z, sums, counts);
  std::vector<double> want_s(static_cast<size_t>(H * S * Dk)), want_c(static_cast<size_t>(H * S));
  const auto kv = test::view_values(k);
  for (int64_t i = 0; i < B * T * H; ++i) {
    const int64_t h = i % H, s = z->data<int32_t>()[i];
    want_c[h * S + s] += 1;
    for (int64_t d = 0; d < Dk; ++d) want_s[(h * S + s) * Dk + d] += kv[i * Dk + d];
  }
  EXPECT_LT(test::max_abs_diff(to_doubles(sums), want_s), 1e-13);
  EXPECT_EQ(to_doubles(counts), want_c);
}

TEST(VqQuantCpu, EmaUpdateAndCodebook) {
  const int64_t H = 2, S = 5, Dk = 3;
  OwnedTensor sums = test::random_tensor({H, S, Dk}, DType::F64, 41), counts = test::random_tensor({H, S}, DType::F64, 42, 0, 4);
  OwnedTensor c_sum = test::random_tensor({H, S, Dk}, DType::F64, 43), c_count = test::random_tensor({H, S}, DType::F64, 44, 0.5, 2);
  const auto s0 = to_doubles(c_sum), n0 = to_doubles(c_count), ds = to_doubles(sums), dn = to_doubles(counts);
  vq_ema_update(Ctx{}, sums, counts, c_sum, c_count, 0.9);
  const auto s1 = to_doubles(c_sum), n1 = to_doubles(c_count);
  for (size_t i = 0; i < s1.size(); ++i) EXPECT_NEAR(s1[i], 0.9 * s0[i] + 0.1 * ds[i], 1e-15);
  for (size_t i = 0; i < n1.size(); ++i) EXPECT_NEAR(n1[i], 0.9 * n0[i] + 0.1 * dn[i], 1e-15);
  c_count->data<double>()[3] = 0.001;  // a nearly dead code: divided by the floor 0.01
  OwnedTensor cb(DType::F64, Device::CPU, {H, S, Dk});
  test::poison(cb);
  vq_codebook_from_stats(Ctx{}, c_sum, c_count, cb);
  const auto c = to_doubles(cb), n = to_doubles(c_count);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], s1[i] / std::max(n[i / Dk], 0.01), 1e-14);
}

TEST(VqAttnCpu, RejectsBadShapes) {
  Problem p({1, 8, 1, 4, 3, 3, 4});
  OwnedTensor o(DType::F64, Device::CPU, {1, 8, 1, 3}), lse(DType::F64, Device::CPU, {1, 8, 1});
  VqAttnOpts bad = p.opts;
  bad.block = 3;  // rho covers distances 0..4
  EXPECT_ANY_THROW(vq_attn_fwd(Ctx{}, p.q(p.in), p.khat(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, bad));
  EXPECT_ANY_THROW(vq_attn_fwd(Ctx{}, p.q(p.in), p.v(p.in), p.z, p.v(p.in), p.codebook, p.u, p.vr, p.rho, o, lse, p.opts));
}

}  // namespace
}  // namespace linac::test_vq_attn
