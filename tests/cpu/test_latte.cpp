// Latte CPU reference: quadratic == recurrent == chunked, forward and backward (double), plain and
// Macchiato, L = 1/16/64, T not a multiple of the chunk, H > 1; logits that overflow a naive exp
// (b up to +-1000, the paper's [1, 10, 1000], lse growing past the factorisation's limit inside a
// chunk); gradient check against central differences; sum_s db_{s,l} = 0; v = 1 gives y = 1; decode
// steps == forward and the decode state == mu_final. a, b, v and local are strided views of one
// fused buffer, as the mixer passes them.
#include <cmath>
#include <functional>

#include "latte/latte.h"
#include "latte_layout.h"
#include "test_util.h"

namespace linac::test_latte {
namespace {

// [B,H,X] view of token t of a [B,T,H,X] view.
Tensor at_token(const Tensor& x, int64_t t) {
  Tensor r(static_cast<char*>(x.ptr) + t * x.strides[1] * static_cast<int64_t>(dtype_size(x.dtype)), x.dtype, x.device,
           {x.size(0), x.size(2), x.size(3)});
  r.strides = {x.strides[0], x.strides[2], 1};
  return r;
}

struct Problem : test::LatteLayout {
  int64_t B, T;
  DType dt;
  OwnedTensor in, grad, dy;  // in, grad: [B, T, W] in the layout's columns

  Problem(int64_t b, int64_t t, int64_t h, int64_t l, int64_t dv, bool macchiato, DType d = DType::F64,
          uint64_t seed = 1, double b_scale = 3.0)
      : LatteLayout(h, l, dv, macchiato),
        B(b),
        T(t),
        dt(d),
        in(test::random_tensor({b, t, W}, d, seed)),
        grad(d, Device::CPU, {b, t, W}),
        dy(test::random_tensor({b, t, h, dv}, d, seed + 1)) {
    scale_b(b_scale);
  }

  static void set(const Tensor& x, int64_t i, double value) {
    if (x.dtype == DType::F64)
      x.data<double>()[i] = value;
    else
      x.data<float>()[i] = static_cast<float>(value);
  }
  // Sets b[bb, t, h, l] = fn(bb, t, h, l) (double inputs only).
  template <class Fn>
  void set_b(Fn fn) {
    const Tensor bv = b(in);
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t l = 0; l < L; ++l) {
            set(bv, bb * bv.strides[0] + t * bv.strides[1] + h * L + l, fn(bb, t, h, l));
          }
  }
  void scale_b(double s) {
    const auto vals = test::view_values(b(in));
    set_b([&](int64_t bb, int64_t t, int64_t h, int64_t l) { return s * vals[((bb * T + t) * H + h) * L + l]; });
  }

  struct Out {
    OwnedTensor y, lse, mu;
  };
  Out forward(LatteForm form, int64_t chunk = 16) const {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, H, Dv}), OwnedTensor(dt, Device::CPU, {B, T, H, L}),
          OwnedTensor(dt, Device::CPU, {B, H, L, Dv})};
    test::poison(r.y);
    test::poison(r.lse);
    test::poison(r.mu);
    latte_fwd(Ctx{}, a(in), b(in), v(in), local(in), r.y, r.lse, r.mu, LatteOpts{chunk}, form);
    return r;
  }
  // Gradients of loss = sum(y * dy) land in `grad` (same layout as `in`, pad column 0).
  void backward(LatteForm form, int64_t chunk = 16) {
    Out f = forward(LatteForm::Recurrent);
    test::poison(grad);
    for (int64_t i = W - 1; i < grad->numel(); i += W) set(grad, i, 0.0);
    latte_bwd(Ctx{}, a(in), b(in), v(in), local(in), f.lse, dy, a(grad), b(grad), v(grad), local(grad),
              LatteOpts{chunk}, form);
  }
  double loss(LatteForm form, int64_t chunk) const {
    const auto y = to_doubles(forward(form, chunk).y), u = to_doubles(dy);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * u[i];
    return l;
  }
};

struct Case {
  int64_t L, T, chunk;
};

std::string name(const Case& c, bool mac) {
  return "L=" + std::to_string(c.L) + " T=" + std::to_string(c.T) + " C=" + std::to_string(c.chunk) +
         (mac ? " Macchiato" : " plain");
}

std::vector<Case> form_cases() {
  std::vector<Case> cs;
  for (int64_t L : {1, 16, 64})
    for (int64_t T : {1, 17, 64, 65, 150})
      for (int64_t C : {16, 64}) cs.push_back({L, T, C});
  return cs;
}

TEST(LatteCpu, ForwardFormsAgree) {
  for (const Case& c : form_cases())
    for (bool mac : {false, true}) {
      SCOPED_TRACE(name(c, mac));
      Problem p(2, c.T, 2, c.L, 5, mac);
      auto quad = p.forward(LatteForm::Quadratic), rec = p.forward(LatteForm::Recurrent);
      auto chk = p.forward(LatteForm::Chunked, c.chunk);
      ASSERT_TRUE(test::all_finite(to_doubles(chk.y)));
      for (const auto* r : {&quad, &chk}) {
        EXPECT_LT(test::rel_error(r->y, rec.y), 1e-12);
        EXPECT_LT(test::rel_error(r->lse, rec.lse), 1e-13);
        EXPECT_LT(test::rel_error(r->mu, rec.mu), 1e-12);
      }
    }
}

std::vector<double> all_grads(const Problem& p) {
  std::vector<double> g;
  for (const Tensor& x : {p.a(p.grad), p.b(p.grad), p.v(p.grad), p.local(p.grad)}) {
    if (!x.defined()) continue;
    const auto part = test::view_values(x);
    g.insert(g.end(), part.begin(), part.end());
  }
  return g;
}

TEST(LatteCpu, BackwardFormsAgree) {
  for (const Case& c : form_cases())
    for (bool mac : {false, true}) {
      SCOPED_TRACE(name(c, mac));
      Problem p(2, c.T, 2, c.L, 5, mac);
      std::vector<std::vector<double>> g;
      for (LatteForm f : {LatteForm::Recurrent, LatteForm::Quadratic, LatteForm::Chunked}) {
        p.backward(f, c.chunk);
        g.push_back(all_grads(p));
      }
      ASSERT_TRUE(test::all_finite(g[2]));
      EXPECT_LT(test::rel_error(g[1], g[0]), 1e-11) << "quadratic vs recurrent";
      EXPECT_LT(test::rel_error(g[2], g[0]), 1e-11) << "chunked vs recurrent";
    }
}

TEST(LatteCpu, GradCheckDouble) {
  for (bool mac : {false, true})
    for (const Case& c : {Case{3, 37, 16}, Case{16, 21, 8}, Case{1, 19, 16}}) {
      SCOPED_TRACE(name(c, mac));
      Problem p(1, c.T, 2, c.L, 4, mac, DType::F64, 9, 1.0);
      p.backward(LatteForm::Chunked, c.chunk);
      const auto analytic = to_doubles(p.grad);
      auto loss = [&] { return p.loss(LatteForm::Chunked, c.chunk); };
      EXPECT_LT(test::check_grad(loss, p.in->data<double>(), analytic.data(), analytic.size(), 200, 3, 1e-4), 1e-6);
    }
}

// Shifting b_{.,l} by a constant changes nothing, so sum_s db_{s,l} = 0 (docs/latte.md §4.1); likewise
// every row of da sums to 0.
TEST(LatteCpu, GradientIdentities) {
  for (bool mac : {false, true}) {
    Problem p(2, 70, 3, 16, 6, mac, DType::F64, 4);
    p.backward(LatteForm::Chunked, 16);
    const auto db = test::view_values(p.b(p.grad)), da = test::view_values(p.a(p.grad));
    double scale = 0;
    for (double x : db) scale = std::max(scale, std::abs(x));
    ASSERT_GT(scale, 1e-3);
    for (int64_t bb = 0; bb < p.B; ++bb)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t l = 0; l < p.L; ++l) {
          double s = 0;
          for (int64_t t = 0; t < p.T; ++t) s += db[((bb * p.T + t) * p.H + h) * p.L + l];
          EXPECT_LT(std::abs(s), 1e-12 * scale);
        }
    for (int64_t r = 0; r < p.B * p.T * p.H; ++r) {
      double s = 0;
      for (int64_t j = 0; j < p.La; ++j) s += da[r * p.La + j];
      EXPECT_LT(std::abs(s), 1e-12);
    }
  }
}

// Every row of the implicit attention matrix sums to 1: v = 1 (and local = 1) gives y = 1.
TEST(LatteCpu, ConstantValuesGiveConstantOutput) {
  for (bool mac : {false, true}) {
    Problem p(1, 83, 2, 16, 4, mac, DType::F64, 6, 20.0);
    for (const Tensor& x : {p.v(p.in), p.local(p.in)}) {
      if (!x.defined()) continue;
      for (int64_t t = 0; t < p.T; ++t)
        for (int64_t e = 0; e < p.H * p.Dv; ++e) x.data<double>()[t * x.strides[1] + e] = 1.0;
    }
    for (double y : to_doubles(p.forward(LatteForm::Chunked, 16).y)) EXPECT_NEAR(y, 1.0, 1e-13);
  }
}

// Logits a naive exp overflows: b uniform in [-1000, 1000], the paper's [1, 10, 1000] ramp, a +70
// spike inside a chunk (the chunk's lse grows past 60: the direct path) and growth of 50 (the
// factorised path with Kt ~ e^50). Double forms agree; the float chunked form stays finite and
// agrees with the double recurrence.
TEST(LatteCpu, LargeLogitsStayFinite) {
  using Fn = std::function<double(int64_t, int64_t, int64_t, int64_t)>;
  const std::vector<std::pair<const char*, Fn>> shapes = {
      {"uniform +-1000", nullptr},
      {"[1, 10, 1000]", [](int64_t, int64_t t, int64_t, int64_t l) { return std::pow(10.0, t % 3) + 0.1 * l; }},
      {"+70 spike", [](int64_t, int64_t t, int64_t h, int64_t l) { return (t == 40 + h ? 70.0 : 0.0) + 0.01 * (t % 7) * l; }},
      {"+50 ramp", [](int64_t, int64_t t, int64_t, int64_t l) { return t >= 32 && t < 48 ? 3.2 * (t - 31) : 0.1 * l; }},
      {"linear growth", [](int64_t, int64_t t, int64_t, int64_t l) { return static_cast<double>(t) * (1 + l % 3); }}};
  for (const auto& [what, fn] : shapes)
    for (bool mac : {false, true}) {
      SCOPED_TRACE(std::string(what) + (mac ? " Macchiato" : " plain"));
      Problem pf(1, 100, 2, 4, 6, mac, DType::F32, 11, 1000.0), pd(1, 100, 2, 4, 6, mac, DType::F64, 11);
      if (fn) pf.set_b(fn);
      convert_host(pd.in, pf.in);  // the same rounded inputs
      convert_host(pd.dy, pf.dy);
      auto rec = pd.forward(LatteForm::Recurrent), quad = pd.forward(LatteForm::Quadratic);
      auto chk = pd.forward(LatteForm::Chunked, 32), flt = pf.forward(LatteForm::Chunked, 32);
      ASSERT_TRUE(test::all_finite(to_doubles(chk.y)));
      ASSERT_TRUE(test::all_finite(to_doubles(flt.y)));
      EXPECT_LT(test::rel_error(quad.y, rec.y), 1e-12);
      EXPECT_LT(test::rel_error(chk.y, rec.y), 1e-12);
      EXPECT_LT(test::rel_error(to_doubles(flt.y), to_doubles(rec.y)), 1e-4);
      std::vector<std::vector<double>> g;
      for (LatteForm f : {LatteForm::Recurrent, LatteForm::Chunked}) {
        pd.backward(f, 32);
        g.push_back(all_grads(pd));
      }
      pf.backward(LatteForm::Chunked, 32);
      const auto gf = all_grads(pf);
      ASSERT_TRUE(test::all_finite(g[1]));
      ASSERT_TRUE(test::all_finite(gf));
      EXPECT_LT(test::rel_error(g[1], g[0]), 1e-10);
      EXPECT_LT(test::rel_error(gf, g[0]), 1e-3);
    }
}

// T decode steps from a reset state reproduce the forward's outputs; the state then equals
// (lse of the last token, mu_final).
TEST(LatteCpu, DecodeStepsMatchForward) {
  for (bool mac : {false, true}) {
    SCOPED_TRACE(mac ? "Macchiato" : "plain");
    Problem p(2, 23, 3, 16, 8, mac);
    auto ref = p.forward(LatteForm::Chunked, 16);
    OwnedTensor lse(DType::F64, Device::CPU, {p.B, p.H, p.L}), mu(DType::F64, Device::CPU, {p.B, p.H, p.L, p.Dv});
    test::poison(lse);
    test::poison(mu);
    latte_state_reset(Ctx{}, lse, mu);
    OwnedTensor y(DType::F64, Device::CPU, {p.B, p.H, p.Dv});
    const auto refy = to_doubles(ref.y);
    std::vector<double> got(refy.size());
    for (int64_t t = 0; t < p.T; ++t) {
      test::poison(y);
      latte_step(Ctx{}, at_token(p.a(p.in), t), at_token(p.b(p.in), t), at_token(p.v(p.in), t),
                 mac ? at_token(p.local(p.in), t) : Tensor(), lse, mu, y);
      const auto yd = to_doubles(y);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t e = 0; e < p.H * p.Dv; ++e) got[(b * p.T + t) * p.H * p.Dv + e] = yd[b * p.H * p.Dv + e];
    }
    EXPECT_LT(test::rel_error(got, refy), 1e-13);
    EXPECT_LT(test::rel_error(mu, ref.mu), 1e-13);
    EXPECT_LT(test::rel_error(test::view_values(lse), test::view_values(at_token(ref.lse, p.T - 1))), 1e-14);
  }
}

}  // namespace
}  // namespace linac::test_latte
