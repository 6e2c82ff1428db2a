// GLA CPU reference: recurrent == parallel == chunkwise, forward and backward (double), for chunk
// sizes 16/64, T not a multiple of them and gates from mild to strong; gradient check of the
// chunkwise backward (dg and the initial-state gradient included); special cases, a long
// strong-gate stress run in float, state carry and the decode step. q/k/v/g are strided views
// of one fused buffer, as the model passes them.
#include <cmath>

#include "gla/gla.h"
#include "state_scan_problem.h"
#include "test_util.h"

namespace linac::test_gla {
namespace {

enum class Gates { Mild, Strong, Zero, Mixed, Wide };

// q | k | v | g, the gates' H Dk columns after v.
struct Problem : test::StateScanProblem {
  Problem(int64_t b, int64_t t, int64_t h, int64_t dk, int64_t dv, Gates gates, DType d = DType::F64, uint64_t seed = 1)
      : StateScanProblem(b, t, h, dk, dv, h * dk, d, seed) {
    // Gates: mild = logsigmoid(z)/16 for z in [-6, 6] (the model's range, about -0.4 .. -0.002);
    // strong = uniform in [-3, 0] (the clamp); mixed = strong on half the key dims; wide = uniform
    // in [-8, 0] on half the key dims (a 16-token sub-chunk decays by about 60 = kGlaFactorSpan, so
    // both forms of the chunkwise diagonal blocks run), mild on the others.
    const auto z = test::random_values(static_cast<size_t>(b * t * h * dk), seed + 4, -6, 6);
    const auto s = test::random_values(static_cast<size_t>(b * t * h * dk), seed + 5, -3, 0);
    OwnedTensor host(DType::F64, Device::CPU, {b, t, W});
    convert_host(host, in);
    size_t n = 0;
    for (int64_t bt = 0; bt < b * t; ++bt)
      for (int64_t e = 0; e < h * dk; ++e, ++n) {
        const double mild = (std::min(z[n], 0.0) - std::log1p(std::exp(-std::fabs(z[n])))) / 16;
        const double strong = gates == Gates::Wide ? 8 * s[n] / 3 : s[n];
        double val = gates == Gates::Mild     ? mild
                     : gates == Gates::Strong ? s[n]
                     : gates == Gates::Zero   ? 0.0
                                              : ((e % dk) % 2 ? strong : mild);
        host->data<double>()[bt * W + h * (2 * dk + dv) + e] = val;
      }
    convert_host(in, host);
  }
  Tensor g(const Tensor& x) const { return test::bthd(x, 2 * H * Dk + H * Dv, H, Dk); }

  Out forward(const GlaOpts& opts, GlaForm form, bool with_s0 = true) const {
    Out r = new_out();
    gla_fwd(Ctx{}, q(in), k(in), v(in), g(in), r.o, with_s0 ? s0.t : Tensor(), r.sf, opts, form);
    return r;
  }
  // Gradients of the loss land in `grad`; returns ds0.
  OwnedTensor backward(const GlaOpts& opts, GlaForm form, bool with_s0 = true) {
    OwnedTensor ds0 = new_ds0();
    test::poison(grad);
    gla_bwd(Ctx{}, q(in), k(in), v(in), g(in), u, with_s0 ? s0.t : Tensor(), dsf, q(grad), k(grad), v(grad), g(grad),
            ds0, opts, form);
    return ds0;
  }
  double loss(const GlaOpts& opts, GlaForm form) const { return loss_of(forward(opts, form)); }
};

GlaOpts opts_of(int64_t chunk, int64_t sub, double scale = 0.7) {
  GlaOpts o;
  o.chunk = chunk;
  o.sub_chunk = sub;
  o.scale = scale;
  return o;
}

struct FormCase {
  int64_t T, chunk, sub;
  Gates gates;
};

const FormCase kForms[] = {{1, 16, 16, Gates::Mild},   {7, 16, 4, Gates::Strong},  {40, 16, 16, Gates::Mixed},
                           {40, 16, 4, Gates::Strong}, {129, 64, 16, Gates::Mild}, {100, 64, 16, Gates::Strong},
                           {64, 64, 16, Gates::Mixed}, {150, 64, 16, Gates::Zero}, {100, 64, 16, Gates::Wide},
                           {45, 16, 16, Gates::Wide}};

std::string name(const FormCase& c) {
  return "T=" + std::to_string(c.T) + " C=" + std::to_string(c.chunk) + " c=" + std::to_string(c.sub) +
         " gates=" + std::to_string(static_cast<int>(c.gates));
}

TEST(GlaCpu, ForwardFormsAgree) {
  for (const FormCase& c : kForms)
    for (bool with_s0 : {false, true}) {
      SCOPED_TRACE(name(c) + (with_s0 ? " with s0" : ""));
      Problem p(2, c.T, 2, 8, 12, c.gates);
      const GlaOpts o = opts_of(c.chunk, c.sub);
      auto rec = p.forward(o, GlaForm::Recurrent, with_s0), par = p.forward(o, GlaForm::Parallel, with_s0);
      auto chk = p.forward(o, GlaForm::Chunk, with_s0);
      EXPECT_LT(test::rel_error(par.o, rec.o), 1e-12);
      EXPECT_LT(test::rel_error(chk.o, rec.o), 1e-12);
      EXPECT_LT(test::rel_error(par.sf, rec.sf), 1e-12);
      EXPECT_LT(test::rel_error(chk.sf, rec.sf), 1e-12);
    }
}

TEST(GlaCpu, BackwardFormsAgree) {
  for (const FormCase& c : kForms)
    for (bool with_s0 : {false, true}) {
      SCOPED_TRACE(name(c) + (with_s0 ? " with s0" : ""));
      Problem p(2, c.T, 2, 8, 12, c.gates);
      const GlaOpts o = opts_of(c.chunk, c.sub);
      std::vector<std::vector<double>> grads, ds0s;
      for (GlaForm f : {GlaForm::Recurrent, GlaForm::Parallel, GlaForm::Chunk}) {
        OwnedTensor ds0 = p.backward(o, f, with_s0);
        grads.push_back(p.grads({p.g(p.grad)}));
        ds0s.push_back(to_doubles(ds0));
      }
      ASSERT_TRUE(test::all_finite(grads[2]));
      EXPECT_LT(test::rel_error(grads[1], grads[0]), 1e-11) << "parallel vs recurrent";
      EXPECT_LT(test::rel_error(grads[2], grads[0]), 1e-11) << "chunk vs recurrent";
      EXPECT_LT(test::rel_error(ds0s[1], ds0s[0]), 1e-11);
      EXPECT_LT(test::rel_error(ds0s[2], ds0s[0]), 1e-11);
      // dg alone (the closed form of the chunkwise backward vs the recurrence's own derivative).
      Problem p2(2, c.T, 2, 8, 12, c.gates);
      p2.backward(o, GlaForm::Recurrent, with_s0);
      const auto dg_rec = test::view_values(p2.g(p2.grad));
      p2.backward(o, GlaForm::Chunk, with_s0);
      EXPECT_LT(test::rel_error(test::view_values(p2.g(p2.grad)), dg_rec), 1e-10) << "dg";
    }
}

TEST(GlaCpu, ChunkwiseGradCheckDouble) {
  for (const FormCase& c : {FormCase{37, 16, 4, Gates::Mixed}, FormCase{70, 64, 16, Gates::Strong},
                            FormCase{21, 16, 16, Gates::Mild}, FormCase{50, 64, 16, Gates::Wide}}) {
    SCOPED_TRACE(name(c));
    Problem p(1, c.T, 2, 6, 5, c.gates, DType::F64, 9);
    const GlaOpts o = opts_of(c.chunk, c.sub);
    OwnedTensor ds0 = p.backward(o, GlaForm::Chunk);
    p.expect_grads_match([&] { return p.loss(o, GlaForm::Chunk); }, ds0);
  }
}

TEST(GlaCpu, SpecialCases) {
  const int64_t T = 45, Dk = 8, Dv = 12;
  const double scale = 0.7;
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    // 0: g = 0 is plain linear attention; 1: constant g = log(0.9) is a gamma^(t-s) decay (RetNet);
    // 2: g = -30 forgets everything but the current token.
    const double gv = which == 0 ? 0.0 : which == 1 ? std::log(0.9) : -30.0;
    Problem p(1, T, 1, Dk, Dv, Gates::Zero);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < Dk; ++i) p.in->data<double>()[t * p.W + 2 * Dk + Dv + i] = gv;
    auto r = p.forward(opts_of(16, 4, scale), GlaForm::Chunk, false);
    const double* x = p.in->data<double>();
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < Dk; ++i) dot += x[t * p.W + i] * x[s * p.W + Dk + i];
          acc += scale * dot * std::exp(gv * static_cast<double>(t - s)) * x[s * p.W + 2 * Dk + j];
        }
        ref.push_back(acc);
      }
    EXPECT_LT(test::rel_error(to_doubles(r.o), ref), 1e-12);
  }
}

// Unclamped strong gates (z in [-60, 5] -> g down to -3.75 per step) over a long sequence in float:
// no exponent overflows, and the result matches double.
TEST(GlaCpu, StrongGatesLongSequenceFloat) {
  const int64_t T = 3000;
  Problem pd(1, T, 1, 16, 16, Gates::Zero, DType::F64, 5);
  const auto z = test::random_values(static_cast<size_t>(T * 16), 77, -60, 5);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < 16; ++i) {
      const double zz = z[static_cast<size_t>(t * 16 + i)];
      pd.in->data<double>()[t * pd.W + 48 + i] = (std::min(zz, 0.0) - std::log1p(std::exp(-std::fabs(zz)))) / 16;
    }
  Problem pf(1, T, 1, 16, 16, Gates::Zero, DType::F32, 5);
  convert_host(pf.in, pd.in);
  convert_host(pf.u, pd.u);
  convert_host(pf.dsf, pd.dsf);
  convert_host(pf.s0, pd.s0);
  const GlaOpts o = opts_of(64, 16);
  auto rd = pd.forward(o, GlaForm::Chunk), rf = pf.forward(o, GlaForm::Chunk);
  ASSERT_TRUE(test::all_finite(to_doubles(rf.o)));
  EXPECT_LT(test::rel_error(to_doubles(rf.o), to_doubles(rd.o)), 1e-5);
  pd.backward(o, GlaForm::Chunk);
  pf.backward(o, GlaForm::Chunk);
  for (int part = 0; part < 4; ++part) {
    auto pick = [&](const Problem& p) {
      const Tensor views[] = {p.q(p.grad), p.k(p.grad), p.v(p.grad), p.g(p.grad)};
      return test::view_values(views[part]);
    };
    const auto gf = pick(pf);
    ASSERT_TRUE(test::all_finite(gf)) << part;
    EXPECT_LT(test::rel_error(gf, pick(pd)), part == 3 ? 1e-3 : 1e-4) << part;
  }
}

// Running [0, T1) and then [T1, T) from its final state equals one run, forward and backward.
// gla_bwd calls GlaOpts::after_reverse_scan (where training opens its gradient-reduction window)
// once per call, in every form.
TEST(GlaCpu, AfterReverseScanCalledOnce) {
  Problem p(2, 37, 2, 16, 8, Gates::Mild);
  for (GlaForm form : {GlaForm::Chunk, GlaForm::Recurrent, GlaForm::Parallel}) {
    int calls = 0;
    GlaOpts o = opts_of(16, 8);
    o.after_reverse_scan = [&calls] { ++calls; };
    p.backward(o, form);
    EXPECT_EQ(calls, 1) << static_cast<int>(form);
  }
}

TEST(GlaCpu, StateCarry) {
  const int64_t T = 100, T1 = 37, H = 2, Dk = 8, Dv = 12;
  Problem full(1, T, H, Dk, Dv, Gates::Mixed);
  const GlaOpts o = opts_of(16, 4);
  auto ref = full.forward(o, GlaForm::Chunk);
  OwnedTensor dref = full.backward(o, GlaForm::Chunk);
  auto narrow_t = [](const Tensor& x, int64_t t0, int64_t n) { return x.narrow(1, t0, n); };
  const Tensor in = full.in;
  auto q = full.q(in), k = full.k(in), v = full.v(in), g = full.g(in);
  OwnedTensor o1(DType::F64, Device::CPU, {1, T1, H, Dv}), o2(DType::F64, Device::CPU, {1, T - T1, H, Dv});
  OwnedTensor s1(DType::F64, Device::CPU, {1, H, Dk, Dv}), s2(DType::F64, Device::CPU, {1, H, Dk, Dv});
  gla_fwd(Ctx{}, narrow_t(q, 0, T1), narrow_t(k, 0, T1), narrow_t(v, 0, T1), narrow_t(g, 0, T1), o1, full.s0, s1, o);
  gla_fwd(Ctx{}, narrow_t(q, T1, T - T1), narrow_t(k, T1, T - T1), narrow_t(v, T1, T - T1), narrow_t(g, T1, T - T1),
          o2, s1, s2, o);
  auto both = to_doubles(o1);
  const auto second = to_doubles(o2);
  both.insert(both.end(), second.begin(), second.end());
  EXPECT_LT(test::rel_error(both, to_doubles(ref.o)), 1e-12);
  EXPECT_LT(test::rel_error(s2, ref.sf), 1e-12);

  // Backward: the second half's initial-state gradient is the first half's final-state gradient.
  OwnedTensor gbuf(DType::F64, Device::CPU, {1, T, full.W}), ds_mid(DType::F64, Device::CPU, {1, H, Dk, Dv});
  OwnedTensor ds0(DType::F64, Device::CPU, {1, H, Dk, Dv});
  const Tensor gb = gbuf;
  auto part_bwd = [&](int64_t t0, int64_t n, const Tensor& s_init, const Tensor& dsf, const Tensor& ds_out) {
    gla_bwd(Ctx{}, narrow_t(q, t0, n), narrow_t(k, t0, n), narrow_t(v, t0, n), narrow_t(g, t0, n),
            narrow_t(full.u, t0, n), s_init, dsf, narrow_t(full.q(gb), t0, n), narrow_t(full.k(gb), t0, n),
            narrow_t(full.v(gb), t0, n), narrow_t(full.g(gb), t0, n), ds_out, o);
  };
  part_bwd(T1, T - T1, s1, full.dsf, ds_mid);
  part_bwd(0, T1, full.s0, ds_mid, ds0);
  const Tensor got[] = {full.q(gb), full.k(gb), full.v(gb), full.g(gb)};
  const Tensor want[] = {full.q(full.grad), full.k(full.grad), full.v(full.grad), full.g(full.grad)};
  for (int i = 0; i < 4; ++i) EXPECT_LT(test::rel_error(test::view_values(got[i]), test::view_values(want[i])), 1e-11);
  EXPECT_LT(test::rel_error(ds0, dref), 1e-11);
}

// The decode step, token by token, reproduces the chunkwise forward's outputs and final state.
TEST(GlaCpu, DecodeStepMatchesChunkwise) {
  const int64_t B = 2, T = 29, H = 2, Dk = 8, Dv = 12;
  Problem p(B, T, H, Dk, Dv, Gates::Mixed);
  const GlaOpts o = opts_of(16, 4);
  auto ref = p.forward(o, GlaForm::Chunk);
  OwnedTensor state = to(p.s0, Device::CPU, DType::F64), ot(DType::F64, Device::CPU, {B, H, Dv});
  std::vector<double> outs(static_cast<size_t>(B * T * H * Dv));
  for (int64_t t = 0; t < T; ++t) {
    auto at_t = [&](const Tensor& x) { return x.select(1, t); };
    gla_step(Ctx{}, at_t(p.q(p.in)), at_t(p.k(p.in)), at_t(p.v(p.in)), at_t(p.g(p.in)), state, ot, o.scale);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < H * Dv; ++e) outs[((b * T + t) * H * Dv) + e] = ot->data<double>()[b * H * Dv + e];
  }
  EXPECT_LT(test::rel_error(outs, to_doubles(ref.o)), 1e-12);
  EXPECT_LT(test::rel_error(state, ref.sf), 1e-12);
}

}  // namespace
}  // namespace linac::test_gla
