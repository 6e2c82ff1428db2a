// Lightning Attention CPU reference: recurrent == quadratic == block, forward and backward
// (double), block sizes 16/64, T not a multiple of them, decays from none to strong, Dk != Dv,
// H > 1; gradient check of the block backward (initial state included); s = 0 is plain causal
// linear attention; decode steps == forward; state carry; strong decay over a long T in float;
// the SiLU feature map's derivative in the backward (gradient check in every form).
// q/k/v are strided views of one fused buffer, as the model passes them. Documents: every form
// over packed rows equals each document run alone, forward and backward, double and float.
#include <cmath>

#include "document_checks.h"
#include "lightning/lightning.h"
#include "state_scan_problem.h"
#include "test_util.h"

namespace linac::test_lightning {
namespace {

// Decay rates per head: a spread from none to strong, or one value for every head.
OwnedTensor decays(int64_t H, double smax, DType dt, double fixed = -1) {
  OwnedTensor host(DType::F64, Device::CPU, {H});
  for (int64_t h = 0; h < H; ++h)
    host->data<double>()[h] = fixed >= 0 ? fixed : H == 1 ? smax : smax * static_cast<double>(h) / (H - 1);
  OwnedTensor out(dt, Device::CPU, {H});
  convert_host(out, host);
  return out;
}

// q | k | v, with per-head decay rates spread over [0, smax].
struct Problem : test::StateScanProblem {
  OwnedTensor decay;

  Problem(int64_t b, int64_t t, int64_t h, int64_t dk, int64_t dv, double smax, DType d = DType::F64, uint64_t seed = 1)
      : StateScanProblem(b, t, h, dk, dv, 0, d, seed), decay(decays(h, smax, d)) {}

  Out forward(const LightningOpts& opts, LightningForm form, bool with_s0 = true) const {
    Out r = new_out();
    lightning_fwd(Ctx{}, q(in), k(in), v(in), decay, r.o, with_s0 ? s0.t : Tensor(), r.sf, opts, form);
    return r;
  }
  // Gradients of the loss land in `grad`; returns ds0.
  OwnedTensor backward(const LightningOpts& opts, LightningForm form, bool with_s0 = true) {
    OwnedTensor ds0 = new_ds0();
    test::poison(grad);
    lightning_bwd(Ctx{}, q(in), k(in), v(in), decay, u, with_s0 ? s0.t : Tensor(), dsf, q(grad), k(grad), v(grad),
                  ds0, opts, form);
    return ds0;
  }
  double loss(const LightningOpts& opts, LightningForm form) const { return loss_of(forward(opts, form)); }
};

LightningOpts block_of(int64_t c) {
  LightningOpts o;
  o.block = c;
  return o;
}

struct FormCase {
  int64_t T, block;
  double smax;  // decay rates spread over [0, smax] across the heads
};

const FormCase kForms[] = {{1, 16, 0.5},   {15, 16, 3.0}, {64, 16, 0.0},  {65, 16, 1.0},
                           {100, 64, 3.0}, {64, 64, 0.2}, {65, 64, 0.02}, {100, 16, 0.7}};

std::string name(const FormCase& c) {
  return "T=" + std::to_string(c.T) + " C=" + std::to_string(c.block) + " smax=" + std::to_string(c.smax);
}

TEST(LightningCpu, ForwardFormsAgree) {
  for (const FormCase& c : kForms)
    for (bool with_s0 : {false, true}) {
      SCOPED_TRACE(name(c) + (with_s0 ? " with s0" : ""));
      Problem p(2, c.T, 3, 8, 12, c.smax);
      const LightningOpts o = block_of(c.block);
      auto rec = p.forward(o, LightningForm::Recurrent, with_s0), quad = p.forward(o, LightningForm::Quadratic, with_s0);
      auto blk = p.forward(o, LightningForm::Block, with_s0);
      ASSERT_TRUE(test::all_finite(to_doubles(blk.o)));
      EXPECT_LT(test::rel_error(quad.o, rec.o), 1e-12);
      EXPECT_LT(test::rel_error(blk.o, rec.o), 1e-12);
      EXPECT_LT(test::rel_error(quad.sf, rec.sf), 1e-12);
      EXPECT_LT(test::rel_error(blk.sf, rec.sf), 1e-12);
    }
}

TEST(LightningCpu, BackwardFormsAgree) {
  for (const FormCase& c : kForms)
    for (bool with_s0 : {false, true}) {
      SCOPED_TRACE(name(c) + (with_s0 ? " with s0" : ""));
      Problem p(2, c.T, 3, 8, 12, c.smax);
      const LightningOpts o = block_of(c.block);
      std::vector<std::vector<double>> grads, ds0s;
      for (LightningForm f : {LightningForm::Recurrent, LightningForm::Quadratic, LightningForm::Block}) {
        OwnedTensor ds0 = p.backward(o, f, with_s0);
        grads.push_back(p.grads());
        ds0s.push_back(to_doubles(ds0));
      }
      ASSERT_TRUE(test::all_finite(grads[2]));
      ASSERT_TRUE(test::all_finite(ds0s[2]));
      EXPECT_LT(test::rel_error(grads[1], grads[0]), 1e-11) << "quadratic vs recurrent";
      EXPECT_LT(test::rel_error(grads[2], grads[0]), 1e-11) << "block vs recurrent";
      EXPECT_LT(test::rel_error(ds0s[1], ds0s[0]), 1e-11);
      EXPECT_LT(test::rel_error(ds0s[2], ds0s[0]), 1e-11);
    }
}

TEST(LightningCpu, BlockGradCheckDouble) {
  for (const FormCase& c : {FormCase{37, 16, 1.5}, FormCase{70, 64, 0.3}, FormCase{21, 16, 0.0}}) {
    SCOPED_TRACE(name(c));
    Problem p(1, c.T, 2, 6, 5, c.smax, DType::F64, 9);
    const LightningOpts o = block_of(c.block);
    OwnedTensor ds0 = p.backward(o, LightningForm::Block);
    p.expect_grads_match([&] { return p.loss(o, LightningForm::Block); }, ds0);
  }
}

// The SiLU feature map in the backward (LightningOpts::q_pre, k_pre): with q = SiLU(q_pre) and
// k = SiLU(k_pre), dq and dk are the gradients of q_pre and k_pre; checked against finite
// differences of the loss through SiLU, in every form, with documents too.
TEST(LightningCpu, SiluFeatureGradCheckDouble) {
  for (const LightningForm form : {LightningForm::Block, LightningForm::Recurrent, LightningForm::Quadratic}) {
    SCOPED_TRACE(static_cast<int>(form));
    Problem p(2, 37, 2, 6, 5, 1.5, DType::F64, 13);
    const LightningOpts o = block_of(16);
    const int64_t HK = p.H * p.Dk;
    // `in` holds [q_pre | k_pre | v]; `act` the same with SiLU applied to the q and k columns.
    OwnedTensor act(DType::F64, Device::CPU, {p.B, p.T, p.W});
    auto activate = [&] {
      const double* x = p.in->data<double>();
      double* y = act->data<double>();
      for (int64_t r = 0; r < p.B * p.T; ++r)
        for (int64_t j = 0; j < p.W; ++j) {
          const double v = x[r * p.W + j];
          y[r * p.W + j] = j < 2 * HK ? v / (1 + std::exp(-v)) : v;
        }
    };
    activate();
    LightningOpts og = o;
    og.q_pre = p.q(p.in);
    og.k_pre = p.k(p.in);
    OwnedTensor ds0 = p.new_ds0();
    test::poison(p.grad);
    lightning_bwd(Ctx{}, p.q(act), p.k(act), p.v(act), p.decay, p.u, p.s0, p.dsf, p.q(p.grad), p.k(p.grad), p.v(p.grad),
                  ds0, og, form);
    auto loss = [&] {
      activate();
      Problem::Out r = p.new_out();
      lightning_fwd(Ctx{}, p.q(act), p.k(act), p.v(act), p.decay, r.o, p.s0, r.sf, o, form);
      return p.loss_of(r);
    };
    p.expect_grads_match(loss, ds0);
  }
}

// The pre-activations must have q's shape.
TEST(LightningCpu, SiluFeatureNeedsQShape) {
  Problem p(1, 5, 1, 4, 4, 1.0);
  OwnedTensor ds0(DType::F64, Device::CPU, {1, 1, 4, 4});
  LightningOpts opts;
  opts.q_pre = p.q(p.in).narrow(1, 0, 4);  // T = 4 against 5
  EXPECT_THROW(lightning_bwd(Ctx{}, p.q(p.in), p.k(p.in), p.v(p.in), p.decay, p.u, Tensor(), Tensor(), p.q(p.grad),
                             p.k(p.grad), p.v(p.grad), ds0, opts),
               Error);
}

// s = 0: o_t = sum_{u<=t} (q_t . k_u) v_u, written out directly; the hand check of docs/transnormer.md §2.3 too.
TEST(LightningCpu, NoDecayIsCausalLinearAttention) {
  Problem p(1, 45, 2, 8, 12, 0.0);
  auto r = p.forward(block_of(16), LightningForm::Block, false);
  const auto q = test::view_values(p.q(p.in)), k = test::view_values(p.k(p.in)), v = test::view_values(p.v(p.in));
  std::vector<double> ref;
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t j = 0; j < p.Dv; ++j) {
        double acc = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < p.Dk; ++i) d += q[(t * p.H + h) * p.Dk + i] * k[(u * p.H + h) * p.Dk + i];
          acc += d * v[(u * p.H + h) * p.Dv + j];
        }
        ref.push_back(acc);
      }
  EXPECT_LT(test::rel_error(to_doubles(r.o), ref), 1e-13);

  // n = 2, d = e = 1, lambda = 0.5, q = k = [1, 1], v = [1, 2] -> o = [1, 2.5] (docs/transnormer.md §2.3).
  OwnedTensor x(DType::F64, Device::CPU, {1, 2, 1, 1}), vv(DType::F64, Device::CPU, {1, 2, 1, 1}),
      o(DType::F64, Device::CPU, {1, 2, 1, 1});
  x->data<double>()[0] = x->data<double>()[1] = 1;
  vv->data<double>()[0] = 1, vv->data<double>()[1] = 2;
  OwnedTensor s = decays(1, 0, DType::F64, std::log(2.0));
  for (LightningForm f : {LightningForm::Block, LightningForm::Recurrent, LightningForm::Quadratic}) {
    lightning_fwd(Ctx{}, x, x, vv, s, o, Tensor(), Tensor(), block_of(1), f);
    EXPECT_NEAR(o->data<double>()[0], 1.0, 1e-15);
    EXPECT_NEAR(o->data<double>()[1], 2.5, 1e-15);
  }
}

// Decode steps from s0 reproduce the forward's outputs and final state.
TEST(LightningCpu, DecodeStepsMatchForward) {
  Problem p(2, 19, 3, 8, 12, 2.0);
  auto ref = p.forward(block_of(16), LightningForm::Block);
  OwnedTensor state(DType::F64, Device::CPU, {p.B, p.H, p.Dk, p.Dv});
  convert_host(state, p.s0);
  const auto refo = to_doubles(ref.o);
  std::vector<double> got(refo.size());
  OwnedTensor o(DType::F64, Device::CPU, {p.B, p.H, p.Dv});
  for (int64_t t = 0; t < p.T; ++t) {
    auto at = [&](const Tensor& x) {  // [B,H,D] view of token t
      Tensor r(static_cast<char*>(x.ptr) + t * x.strides[1] * 8, x.dtype, x.device, {x.size(0), x.size(2), x.size(3)});
      r.strides = {x.strides[0], x.strides[2], 1};
      return r;
    };
    test::poison(o);
    lightning_step(Ctx{}, at(p.q(p.in)), at(p.k(p.in)), at(p.v(p.in)), p.decay, state, o);
    const auto od = to_doubles(o);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t e = 0; e < p.H * p.Dv; ++e) got[(b * p.T + t) * p.H * p.Dv + e] = od[b * p.H * p.Dv + e];
  }
  EXPECT_LT(test::rel_error(got, refo), 1e-13);
  EXPECT_LT(test::rel_error(state, ref.sf), 1e-13);
}

// Two calls carrying the state (T1 = 37 ends mid-block) equal one call over T1 + T2.
TEST(LightningCpu, StateCarryAcrossCalls) {
  const int64_t T1 = 37, T2 = 30;
  Problem p(2, T1 + T2, 2, 8, 12, 1.0);
  auto whole = p.forward(block_of(16), LightningForm::Block);
  auto part = [&](const Tensor& x, int64_t t0, int64_t n) {
    Tensor r = x;
    r.ptr = static_cast<char*>(x.ptr) + t0 * x.strides[1] * 8;
    r.shape[1] = n;
    return r;
  };
  OwnedTensor o(DType::F64, Device::CPU, {p.B, p.T, p.H, p.Dv}), mid(DType::F64, Device::CPU, {p.B, p.H, p.Dk, p.Dv}),
      fin(DType::F64, Device::CPU, {p.B, p.H, p.Dk, p.Dv});
  test::poison(o);
  lightning_fwd(Ctx{}, part(p.q(p.in), 0, T1), part(p.k(p.in), 0, T1), part(p.v(p.in), 0, T1), p.decay,
                part(o, 0, T1), p.s0, mid, block_of(16));
  lightning_fwd(Ctx{}, part(p.q(p.in), T1, T2), part(p.k(p.in), T1, T2), part(p.v(p.in), T1, T2), p.decay,
                part(o, T1, T2), mid, fin, block_of(16));
  EXPECT_LT(test::rel_error(o, whole.o), 1e-13);
  EXPECT_LT(test::rel_error(fin, whole.sf), 1e-13);
}

// Strong decay (s = 3: lambda^64 ~ 1e-84) and none over 3000 tokens in float: finite everywhere,
// and the float block form agrees with the double recurrence.
TEST(LightningCpu, LongStrongDecayStaysFinite) {
  for (double s : {3.0, 0.0}) {
    SCOPED_TRACE(s);
    Problem pf(1, 3000, 2, 16, 16, s, DType::F32, 5), pd(1, 3000, 2, 16, 16, s, DType::F64, 5);
    auto of = pf.forward(block_of(64), LightningForm::Block);
    OwnedTensor ds0 = pf.backward(block_of(64), LightningForm::Block);
    const auto o = to_doubles(of.o);
    ASSERT_TRUE(test::all_finite(o));
    ASSERT_TRUE(test::all_finite(pf.grads()));
    ASSERT_TRUE(test::all_finite(to_doubles(ds0)));
    auto od = pd.forward(block_of(64), LightningForm::Recurrent);
    EXPECT_LT(test::rel_error(o, to_doubles(od.o)), 1e-4);
  }
}

// Documents (lightning.h): each form over rows of packed documents equals every document run
// alone, forward (o; s_final is the last document's, and s0 continues the first) and backward (dq,
// dk, dv; ds_final reaches the last document only, ds0 comes from the first). Block 8 and 16 over
// T = 37: documents of one token, shorter than a block, starting exactly at a block boundary (8,
// 16), spanning blocks, a row that is one document; decays from none to strong.
void check_documents_alone(DType dt, double tol) {
  const std::vector<std::vector<int64_t>> lengths = {{1, 7, 8, 5, 16}, {37}, {3, 1, 1, 3, 9, 20}};
  const test::PackedWindow w = test::packed_window(lengths, 16, 3);
  const int32_t* bounds = w.docs->data<int32_t>();
  Problem p(3, 37, 3, 8, 12, 2.0, dt, 21);
  const int64_t B = p.B, T = p.T;
  struct Out {
    OwnedTensor o, sf, grad, ds0;
  };
  auto fresh = [&] {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, p.H, p.Dv}), OwnedTensor(dt, Device::CPU, {B, p.H, p.Dk, p.Dv}),
          OwnedTensor(dt, Device::CPU, {B, T, p.W}), OwnedTensor(dt, Device::CPU, {B, p.H, p.Dk, p.Dv})};
    for (const Tensor* t : {&r.o.t, &r.sf.t, &r.grad.t, &r.ds0.t}) test::poison(*t);
    return r;
  };
  auto values = [&](const Out& r) {
    std::vector<std::vector<double>> v = {to_doubles(r.o), to_doubles(r.sf)};
    for (const Tensor& x : {p.q(r.grad), p.k(r.grad), p.v(r.grad)}) v.push_back(test::view_values(x));
    v.push_back(to_doubles(r.ds0));
    return v;
  };
  const char* names[] = {"o", "s_final", "dq", "dk", "dv", "ds0"};
  struct FormRun {
    const char* name;
    LightningForm form;
    int64_t block;
  };
  for (const FormRun& f : {FormRun{"block 8", LightningForm::Block, 8}, FormRun{"block 16", LightningForm::Block, 16},
                           FormRun{"recurrent", LightningForm::Recurrent, 8},
                           FormRun{"quadratic", LightningForm::Quadratic, 8}}) {
    SCOPED_TRACE(f.name);
    Out packed = fresh(), alone = fresh();
    LightningOpts opts = block_of(f.block);
    opts.docs = {bounds, bounds + B * T};
    lightning_fwd(Ctx{}, p.q(p.in), p.k(p.in), p.v(p.in), p.decay, packed.o, p.s0, packed.sf, opts, f.form);
    lightning_bwd(Ctx{}, p.q(p.in), p.k(p.in), p.v(p.in), p.decay, p.u, p.s0, p.dsf, p.q(packed.grad),
                  p.k(packed.grad), p.v(packed.grad), packed.ds0, opts, f.form);
    const LightningOpts plain = block_of(f.block);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t>& row = lengths[static_cast<size_t>(b)];
      int64_t s = 0;
      for (size_t d = 0; d < row.size(); ++d) {
        const int64_t n = row[d];
        const bool first = d == 0, last = d + 1 == row.size();
        auto seg = [&](const Tensor& x) { return x.narrow(0, b, 1).narrow(1, s, n); };
        auto state = [&](const Tensor& x, bool use) { return use ? x.narrow(0, b, 1) : Tensor(); };
        lightning_fwd(Ctx{}, seg(p.q(p.in)), seg(p.k(p.in)), seg(p.v(p.in)), p.decay, seg(alone.o),
                      state(p.s0, first), state(alone.sf, last), plain, f.form);
        lightning_bwd(Ctx{}, seg(p.q(p.in)), seg(p.k(p.in)), seg(p.v(p.in)), p.decay, seg(p.u), state(p.s0, first),
                      state(p.dsf, last), seg(p.q(alone.grad)), seg(p.k(alone.grad)), seg(p.v(alone.grad)),
                      state(alone.ds0, first), plain, f.form);
        s += n;
      }
    }
    const auto got = values(packed), want = values(alone);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(test::all_finite(got[i])) << names[i];
      EXPECT_LT(test::rel_error(got[i], want[i]), tol) << names[i];
    }
  }
}

TEST(LightningCpu, DocumentsEqualEachDocumentAlone) {
  {
    SCOPED_TRACE("double");
    check_documents_alone(DType::F64, 1e-12);
  }
  SCOPED_TRACE("float");
  check_documents_alone(DType::F32, 2e-6);
}

// Document bounds need both arrays (the block form reads the ends).
TEST(LightningCpu, DocumentsNeedBothBounds) {
  Problem p(1, 5, 1, 4, 4, 1.0);
  OwnedTensor o(DType::F64, Device::CPU, {1, 5, 1, 4});
  const int32_t start[5] = {0, 0, 2, 2, 2};
  LightningOpts opts;
  opts.docs.start = start;
  EXPECT_THROW(lightning_fwd(Ctx{}, p.q(p.in), p.k(p.in), p.v(p.in), p.decay, o, Tensor(), Tensor(), opts),
               Error);
}

// The forward's states kept for the backward are a GPU buffer: the CPU refuses one.
TEST(LightningCpu, SavedStatesAreForTheGpuOnly) {
  Problem p(1, 5, 1, 4, 4, 1.0);
  OwnedTensor o(DType::F64, Device::CPU, {1, 5, 1, 4});
  OwnedTensor saved(DType::F64, Device::CPU, {64});
  EXPECT_THROW(lightning_fwd(Ctx{}, p.q(p.in), p.k(p.in), p.v(p.in), p.decay, o, Tensor(), Tensor(), LightningOpts{},
                             LightningForm::Block, saved),
               Error);
}

}  // namespace
}  // namespace linac::test_lightning
