// Lightning Attention CUDA vs the CPU block reference (double) on the same rounded inputs, f32
// and bf16, forward (o, final state) and backward (dq, dk, dv, initial-state gradient), with
// q/k/v and dq/dk/dv as strided views of fused buffers; Dk != Dv (256/128, 80/48), ragged last
// blocks, decays from none to strong, both scans (the two-launch one for few state tiles, the
// one-kernel walk for many), a long no-decay / strong-decay run, batch groups under a small
// workspace, bitwise determinism, the SiLU feature map's derivative in the backward, and the
// decode step.
#include <cmath>

#include "activation/activation.h"
#include "lightning/lightning.h"
#include "test_util.h"

namespace linac::test_lightning_gpu {
namespace {

struct Case {
  int64_t B, T, H, Dk, Dv;
  bool states;  // with s0 and a final-state gradient
  double smax;  // decay rates spread over [0, smax] across the heads
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " Dk=" +
         std::to_string(c.Dk) + " Dv=" + std::to_string(c.Dv) + (c.states ? " states" : "") +
         " smax=" + std::to_string(c.smax);
}

const Case kCases[] = {{2, 1, 2, 16, 32, true, 3.0},     {2, 77, 3, 80, 48, true, 0.5},
                       {1, 200, 2, 64, 64, false, 3.0},  {2, 130, 2, 256, 128, true, 0.2},
                       {1, 1000, 1, 32, 96, true, 0.0},  {3, 300, 4, 64, 64, true, 1.0},
                       {1, 129, 3, 128, 128, true, 0.05},
                       // Enough 64x64 state tiles for the one-kernel scan (kWalkMinTiles): 4 x 16 x 4
                       // and 3 x 48 x 2 (Dk 80: a 16-row tile; T 77: a ragged last block).
                       {4, 130, 16, 128, 128, true, 0.5},     {3, 77, 48, 80, 48, true, 2.0}};

OwnedTensor decays(int64_t H, double smax) {
  OwnedTensor s(DType::F64, Device::CPU, {H});
  for (int64_t h = 0; h < H; ++h) s->data<double>()[h] = H == 1 ? smax : smax * static_cast<double>(h) / (H - 1);
  return s;
}

struct Inputs {
  Case c;
  int64_t W;
  OwnedTensor qkv, dout, s0, dsf, decay;  // host, f64
  explicit Inputs(const Case& cs, uint64_t seed = 1)
      : c(cs), W((cs.H * (2 * cs.Dk + cs.Dv) + 7) / 8 * 8 + 8),
        qkv(test::random_tensor({cs.B, cs.T, W}, DType::F64, seed)),
        dout(test::random_tensor({cs.B, cs.T, cs.H, cs.Dv}, DType::F64, seed + 2)),
        s0(test::random_tensor({cs.B, cs.H, cs.Dk, cs.Dv}, DType::F64, seed + 3)),
        dsf(test::random_tensor({cs.B, cs.H, cs.Dk, cs.Dv}, DType::F64, seed + 4)), decay(decays(cs.H, cs.smax)) {}
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, c.Dk); }
  Tensor k(const Tensor& b) const { return test::bthd(b, c.H * c.Dk, c.H, c.Dk); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * c.Dk, c.H, c.Dv); }
};

struct Result {
  OwnedTensor o, sf, dqkv, ds0;
};

// Runs forward + backward on ctx's device with activations of dtype `act` (decay/states f32 on the GPU).
// `saved`: the forward's block states kept for the backward (lightning.h).
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& decay, const Tensor& dout,
           const Tensor& s0, const Tensor& dsf, DType act, DType state_dt, const Tensor& saved = Tensor()) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  Result r{OwnedTensor(act, dev, {c.B, c.T, c.H, c.Dv}), OwnedTensor(state_dt, dev, {c.B, c.H, c.Dk, c.Dv}),
           OwnedTensor(act, dev, {c.B, c.T, in.W}), OwnedTensor(state_dt, dev, {c.B, c.H, c.Dk, c.Dv})};
  for (const Tensor* t : {&r.o.t, &r.sf.t, &r.dqkv.t, &r.ds0.t}) test::poison(*t);
  const Tensor s0v = c.states ? s0 : Tensor(), dsfv = c.states ? dsf : Tensor();
  const LightningOpts opts;
  lightning_fwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), decay, r.o, s0v, r.sf, opts, LightningForm::Block, saved);
  lightning_bwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), decay, dout, s0v, dsfv, in.q(r.dqkv), in.k(r.dqkv),
                in.v(r.dqkv), r.ds0, opts, LightningForm::Block, saved);
  ctx_synchronize(ctx);
  return r;
}

struct Device_ {
  OwnedTensor qkv, dout, decay, s0, dsf;
};
Device_ upload(const Inputs& in, DType act) {
  return {to(in.qkv, Device::CUDA, act), to(in.dout, Device::CUDA, act), to(in.decay, Device::CUDA, DType::F32),
          to(in.s0, Device::CUDA, DType::F32), to(in.dsf, Device::CUDA, DType::F32)};
}

// GPU result and the CPU reference on the GPU's rounded inputs.
std::pair<Result, Result> both(const Ctx& ctx, const Inputs& in, DType act) {
  Device_ d = upload(in, act);
  Result gr = run(ctx, in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32);
  OwnedTensor qkv_r = to(d.qkv, Device::CPU, DType::F64), dout_r = to(d.dout, Device::CPU, DType::F64);
  OwnedTensor decay_r = to(d.decay, Device::CPU, DType::F64);
  Result cr = run(Ctx{}, in, qkv_r, decay_r, dout_r, in.s0, in.dsf, DType::F64, DType::F64);
  return {std::move(gr), std::move(cr)};
}

void expect_parity(const Inputs& in, const Result& gr, const Result& cr, double tol) {
  const Case& c = in.c;
  EXPECT_LT(test::rel_error(gr.o, cr.o), tol) << "o";
  EXPECT_LT(test::rel_error(gr.sf, cr.sf), tol) << "final state";
  const int64_t HK = c.H * c.Dk, HV = c.H * c.Dv;
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, HK), test::columns(cr.dqkv, 0, HK)), tol) << "dq";
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, HK, HK), test::columns(cr.dqkv, HK, HK)), tol) << "dk";
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 2 * HK, HV), test::columns(cr.dqkv, 2 * HK, HV)), tol) << "dv";
  EXPECT_LT(test::rel_error(gr.ds0, cr.ds0), tol) << "ds0";
}

TEST(LightningGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs in(c);
    auto [gr, cr] = both(gctx.ctx(), in, DType::F32);
    expect_parity(in, gr, cr, 1e-5);
  }
}

TEST(LightningGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs in(c);
    auto [gr, cr] = both(gctx.ctx(), in, DType::BF16);
    expect_parity(in, gr, cr, 1e-2);
  }
}

// 4096 tokens with no decay (the state grows like T) and with strong decay (lambda^64 ~ 1e-84):
// finite everywhere and still at bf16 parity.
TEST(LightningGpu, LongSequenceNoAndStrongDecay) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (double s : {0.0, 3.0}) {
    SCOPED_TRACE(s);
    Inputs in(Case{1, 4096, 1, 64, 64, true, s}, 7);
    auto [gr, cr] = both(gctx.ctx(), in, DType::BF16);
    ASSERT_TRUE(test::all_finite(to_doubles(gr.o)));
    ASSERT_TRUE(test::all_finite(test::columns(gr.dqkv, 0, 3 * 64)));
    expect_parity(in, gr, cr, 1e-2);
  }
}

// Bitwise reruns, and a workspace that holds only two sequences (so the batch runs in groups)
// gives the same bits as one group; so do the forward's states kept for the backward (which then
// skips its forward scan), with one group and with groups; a short saved buffer is refused.
TEST(LightningGpu, DeterministicAndGrouped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  // Two-launch scan and one-kernel walk (5 x 32 x 2 state tiles).
  for (const Case& c : {Case{5, 300, 2, 64, 128, true, 1.0}, Case{5, 300, 32, 64, 128, true, 1.0}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
      Inputs in(c, 11);
      Device_ d = upload(in, act);
      Result r1 = run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32);
      Result r2 = run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32);
      Ctx small = gctx.ctx();
      small.workspace_bytes = 2 * lightning_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act) + 1000;
      Result r3 = run(small, in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32);
      const size_t saved_bytes = lightning_saved_bytes(c.B, c.T, c.H, c.Dk, c.Dv, act);
      OwnedTensor saved(DType::F32, Device::CUDA, {static_cast<int64_t>(saved_bytes / 4)});
      test::poison(saved);
      Result r4 = run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32, saved);
      test::poison(saved);
      Result r5 = run(small, in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32, saved);
      for (const Result* r : {&r2, &r3, &r4, &r5}) {
        EXPECT_TRUE(test::same_bits(r1.o, r->o));
        EXPECT_TRUE(test::same_bits(r1.sf, r->sf));
        EXPECT_TRUE(test::same_bits(r1.dqkv, r->dqkv));
        EXPECT_TRUE(test::same_bits(r1.ds0, r->ds0));
      }
      small.workspace_bytes = lightning_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act) / 2;
      EXPECT_THROW(run(small, in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32), UserError);
      Tensor short_saved = saved->slice0(0, saved->numel() - 64);
      EXPECT_ANY_THROW(run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, act, DType::F32, short_saved));
    }
  }
}

// The SiLU feature map's derivative in the dq and dk passes (LightningOpts::q_pre, k_pre) gives the
// bits of lightning_bwd followed by silu_bwd, with both scans (few and many state tiles), a ragged
// last block and Dk != Dv, in bf16 and f32; dv and ds0 are unchanged.
TEST(LightningGpu, SiluFeatureGradEqualsSiluBwd) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (const Case& c : {Case{2, 77, 3, 80, 48, true, 0.5}, Case{4, 130, 16, 128, 128, true, 0.5}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
      Inputs in(c, 21);
      Device_ d = upload(in, act);  // d.qkv: [q_pre | k_pre | v]
      const int64_t HK = c.H * c.Dk;
      auto qk_cols = [&](const Tensor& t) { return t.view({c.B * c.T, in.W}).narrow(1, 0, 2 * HK); };
      OwnedTensor qkv(act, Device::CUDA, {c.B, c.T, in.W});  // [SiLU(q_pre) | SiLU(k_pre) | v]
      copy_tensor(ctx, qkv, d.qkv);
      silu_fwd(ctx, qk_cols(d.qkv), qk_cols(qkv));
      auto backward = [&](bool fused) {
        OwnedTensor g(act, Device::CUDA, {c.B, c.T, in.W}), ds0(DType::F32, Device::CUDA, {c.B, c.H, c.Dk, c.Dv});
        test::poison(g);
        test::poison(ds0);
        LightningOpts opts;
        if (fused) {
          opts.q_pre = in.q(d.qkv);
          opts.k_pre = in.k(d.qkv);
        }
        lightning_bwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), d.decay, d.dout, d.s0, d.dsf, in.q(g), in.k(g), in.v(g),
                      ds0, opts);
        if (!fused) {
          OwnedTensor raw = to(g, Device::CUDA, act);
          silu_bwd(ctx, qk_cols(d.qkv), qk_cols(raw), qk_cols(g));
        }
        ctx_synchronize(ctx);
        return std::pair{std::move(g), std::move(ds0)};
      };
      const auto [fused, fused_ds0] = backward(true);
      const auto [ref, ref_ds0] = backward(false);
      const int64_t n = 2 * HK + c.H * c.Dv;  // q, k, v (not the pad columns, left poisoned)
      EXPECT_EQ(test::columns(fused, 0, n), test::columns(ref, 0, n));
      EXPECT_TRUE(test::same_bits(fused_ds0, ref_ds0));
    }
  }
}

// The decode step on the GPU reproduces the CPU step (state f32), token after token.
TEST(LightningGpu, DecodeStep) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t B = 3, H = 2, Dk = 32, Dv = 160, T = 9;
  OwnedTensor decay_g = to(decays(H, 2.0), Device::CUDA, DType::F32);
  OwnedTensor decay_c = to(decay_g, Device::CPU, DType::F64);
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    OwnedTensor state_g = to(test::random_tensor({B, H, Dk, Dv}, DType::F64, 3), Device::CUDA, DType::F32);
    OwnedTensor state_c = to(state_g, Device::CPU, DType::F64);
    for (int64_t t = 0; t < T; ++t) {
      OwnedTensor q = to(test::random_tensor({B, H, Dk}, DType::F64, 10 + t), Device::CUDA, act);
      OwnedTensor k = to(test::random_tensor({B, H, Dk}, DType::F64, 20 + t), Device::CUDA, act);
      OwnedTensor v = to(test::random_tensor({B, H, Dv}, DType::F64, 30 + t), Device::CUDA, act);
      OwnedTensor o(act, Device::CUDA, {B, H, Dv}), oc(DType::F64, Device::CPU, {B, H, Dv});
      test::poison(o);
      lightning_step(gctx.ctx(), q, k, v, decay_g, state_g, o);
      lightning_step(Ctx{}, to(q, Device::CPU, DType::F64), to(k, Device::CPU, DType::F64),
                     to(v, Device::CPU, DType::F64), decay_c, state_c, oc);
      gpu_synchronize();
      EXPECT_LT(test::rel_error(o, oc), act == DType::F32 ? 1e-6 : 1e-2);
    }
    EXPECT_LT(test::rel_error(state_g, state_c), 1e-6);
  }
}

}  // namespace
}  // namespace linac::test_lightning_gpu
