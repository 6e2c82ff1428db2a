// GLA CUDA vs the CPU chunkwise reference (double) on the same rounded inputs, f32 and bf16,
// forward and backward (dq, dk, dv, dg, initial-state gradient, final state), with q/k/v and
// dq/dk/dv as strided views of fused buffers; both state-scan tilings, partial Dk/Dv slices,
// ragged chunks, strong gates on a long sequence, batch groups under a small workspace, saved
// intermediates, bitwise determinism, and the decode step.
#include <array>
#include <cmath>
#include <vector>

#include "gla/gla.h"
#include "test_util.h"

namespace linac::test_gla_gpu {
namespace {

struct Case {
  int64_t B, T, H, Dk, Dv;
  bool states;   // with s0 and a final-state gradient
  double lo_g;   // gates uniform in [lo_g, 0]
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " Dk=" +
         std::to_string(c.Dk) + " Dv=" + std::to_string(c.Dv) + (c.states ? " states" : "") +
         " g>=" + std::to_string(c.lo_g);
}

// Cases: tiny dims, partial slices (Dk 80, Dv 48), ragged chunks, 64x64 state tiles (B*H*tiles >=
// 2 * SMs for the last one), long sequences, and gates down to -8 per token, whose 16-token
// sub-chunks decay by about kGlaFactorSpan, so diagonal blocks take both the factorised and the
// exact form.
const Case kCases[] = {{2, 1, 2, 16, 32, true, -3},    {2, 77, 3, 80, 48, true, -0.5},
                       {1, 200, 2, 64, 64, false, -3}, {2, 130, 2, 128, 256, true, -0.2},
                       {1, 1000, 1, 32, 96, true, -1}, {9, 130, 4, 128, 256, false, -0.1},
                       {2, 150, 2, 128, 64, true, -8}};

struct Inputs {
  Case c;
  int64_t W;
  OwnedTensor qkv, g, dout, s0, dsf;  // host, f64
  explicit Inputs(const Case& cs, uint64_t seed = 1)
      : c(cs), W((cs.H * (2 * cs.Dk + cs.Dv) + 7) / 8 * 8 + 8),
        qkv(test::random_tensor({cs.B, cs.T, W}, DType::F64, seed)),
        g(test::random_tensor({cs.B, cs.T, cs.H, cs.Dk}, DType::F64, seed + 1, cs.lo_g, 0)),
        dout(test::random_tensor({cs.B, cs.T, cs.H, cs.Dv}, DType::F64, seed + 2)),
        s0(test::random_tensor({cs.B, cs.H, cs.Dk, cs.Dv}, DType::F64, seed + 3)),
        dsf(test::random_tensor({cs.B, cs.H, cs.Dk, cs.Dv}, DType::F64, seed + 4)) {}
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, c.Dk); }
  Tensor k(const Tensor& b) const { return test::bthd(b, c.H * c.Dk, c.H, c.Dk); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * c.Dk, c.H, c.Dv); }
};

struct Result {
  OwnedTensor o, sf, dqkv, dg, ds0;
};

int reverse_scans = 0;  // calls of GlaOpts::after_reverse_scan

GlaOpts opts() {
  GlaOpts o;
  o.scale = 0.3;
  o.after_reverse_scan = [] { ++reverse_scans; };
  return o;
}

// Runs forward + backward on `dev` with activations of dtype `act` (states/gates f32 on the GPU).
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& g, const Tensor& dout, const Tensor& s0,
           const Tensor& dsf, DType act, DType state_dt, const Tensor& saved = Tensor()) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  Result r{OwnedTensor(act, dev, {c.B, c.T, c.H, c.Dv}), OwnedTensor(state_dt, dev, {c.B, c.H, c.Dk, c.Dv}),
           OwnedTensor(act, dev, {c.B, c.T, in.W}), OwnedTensor(state_dt, dev, {c.B, c.T, c.H, c.Dk}),
           OwnedTensor(state_dt, dev, {c.B, c.H, c.Dk, c.Dv})};
  for (const Tensor* t : {&r.o.t, &r.sf.t, &r.dqkv.t, &r.dg.t, &r.ds0.t}) test::poison(*t);
  const Tensor s0v = c.states ? s0 : Tensor(), dsfv = c.states ? dsf : Tensor();
  gla_fwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), g, r.o, s0v, r.sf, opts(), GlaForm::Chunk, saved);
  // With saved intermediates the backward does not read g: it gets none, as in the GLA mixer.
  gla_bwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), saved.defined() ? Tensor() : g, dout, s0v, dsfv, in.q(r.dqkv),
          in.k(r.dqkv), in.v(r.dqkv), r.dg, r.ds0, opts(), GlaForm::Chunk, saved);
  ctx_synchronize(ctx);
  return r;
}

struct Tols {
  double o, dqkv, dg;
};

void run_parity(DType act, const Tols& tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs in(c);
    OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
    OwnedTensor g_g = to(in.g, Device::CUDA, DType::F32), s0_g = to(in.s0, Device::CUDA, DType::F32);
    OwnedTensor dsf_g = to(in.dsf, Device::CUDA, DType::F32);
    Result gr = run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32);
    // The reference sees the GPU's rounded inputs.
    OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
    OwnedTensor g_r = to(g_g, Device::CPU, DType::F64);
    Result cr = run(Ctx{}, in, qkv_r, g_r, dout_r, in.s0, in.dsf, DType::F64, DType::F64);

    EXPECT_LT(test::rel_error(gr.o, cr.o), tol.o) << "o";
    EXPECT_LT(test::rel_error(gr.sf, cr.sf), tol.o) << "final state";
    const int64_t HK = c.H * c.Dk, HV = c.H * c.Dv;
    EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, HK), test::columns(cr.dqkv, 0, HK)), tol.dqkv) << "dq";
    EXPECT_LT(test::rel_error(test::columns(gr.dqkv, HK, HK), test::columns(cr.dqkv, HK, HK)), tol.dqkv) << "dk";
    EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 2 * HK, HV), test::columns(cr.dqkv, 2 * HK, HV)), tol.dqkv)
        << "dv";
    EXPECT_LT(test::rel_error(gr.dg, cr.dg), tol.dg) << "dg";
    EXPECT_LT(test::rel_error(gr.ds0, cr.ds0), tol.dqkv) << "ds0";
  }
}

TEST(GlaGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, {1e-5, 1e-5, 1e-5});
}

TEST(GlaGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, {5e-3, 1e-2, 2e-2});
}

// Unclamped strong gates (logsigmoid(z)/16 for z in [-60, 5], down to -3.75 per step) on a long
// sequence: finite everywhere and still at bf16 parity.
TEST(GlaGpu, StrongGatesLongSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c{1, 4096, 2, 64, 64, true, 0};
  Inputs in(c, 7);
  const auto z = test::random_values(static_cast<size_t>(in.g->numel()), 8, -60, 5);
  for (size_t i = 0; i < z.size(); ++i)
    in.g->data<double>()[i] = (std::min(z[i], 0.0) - std::log1p(std::exp(-std::fabs(z[i])))) / 16;
  OwnedTensor qkv_g = to(in.qkv, Device::CUDA, DType::BF16), dout_g = to(in.dout, Device::CUDA, DType::BF16);
  OwnedTensor g_g = to(in.g, Device::CUDA, DType::F32), s0_g = to(in.s0, Device::CUDA, DType::F32);
  OwnedTensor dsf_g = to(in.dsf, Device::CUDA, DType::F32);
  Result gr = run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, DType::BF16, DType::F32);
  for (const Tensor* t : {&gr.o.t, &gr.dg.t, &gr.ds0.t}) ASSERT_TRUE(test::all_finite(to_doubles(*t)));
  ASSERT_TRUE(test::all_finite(test::columns(gr.dqkv, 0, c.H * (2 * c.Dk + c.Dv))));
  OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
  OwnedTensor g_r = to(g_g, Device::CPU, DType::F64);
  Result cr = run(Ctx{}, in, qkv_r, g_r, dout_r, in.s0, in.dsf, DType::F64, DType::F64);
  EXPECT_LT(test::rel_error(gr.o, cr.o), 5e-3);
  const int64_t n = c.H * (2 * c.Dk + c.Dv);  // the q|k|v columns (the pad stays poisoned)
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, n), test::columns(cr.dqkv, 0, n)), 1e-2);
  EXPECT_LT(test::rel_error(gr.dg, cr.dg), 2e-2);
}

// Bitwise reruns; a workspace that holds only two sequences (so the batch runs in groups) gives
// the same bits as one group; so do saved intermediates (the backward skips the recomputation),
// with one group and with groups; too small a workspace or saved buffer is refused. The backward
// calls after_reverse_scan once, however many groups it runs.
TEST(GlaGpu, DeterministicAndGrouped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(act));
    const Case c{5, 300, 2, 64, 128, true, -1};
    Inputs in(c, 11);
    OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
    OwnedTensor g_g = to(in.g, Device::CUDA, DType::F32), s0_g = to(in.s0, Device::CUDA, DType::F32);
    OwnedTensor dsf_g = to(in.dsf, Device::CUDA, DType::F32);
    reverse_scans = 0;
    Result r1 = run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32);
    EXPECT_EQ(reverse_scans, 1);
    Result r2 = run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32);
    Ctx small = gctx.ctx();
    small.workspace_bytes = 2 * gla_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act) + 1000;
    reverse_scans = 0;
    Result r3 = run(small, in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32);
    EXPECT_EQ(reverse_scans, 1) << "batch groups";
    const size_t saved_bytes = gla_saved_bytes(c.B, c.T, c.H, c.Dk, c.Dv, act);
    OwnedTensor saved(DType::F32, Device::CUDA, {static_cast<int64_t>(saved_bytes / 4)});
    test::poison(saved);
    Result r4 = run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32, saved);
    Ctx small_saved = gctx.ctx();
    small_saved.workspace_bytes = 2 * gla_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act, true) + 1000;
    test::poison(saved);
    reverse_scans = 0;
    Result r5 = run(small_saved, in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32, saved);
    EXPECT_EQ(reverse_scans, 1) << "saved intermediates, batch groups";
    for (const Result* r : {&r2, &r3, &r4, &r5}) {
      EXPECT_TRUE(test::same_bits(r1.o, r->o));
      EXPECT_TRUE(test::same_bits(r1.sf, r->sf));
      EXPECT_TRUE(test::same_bits(r1.dqkv, r->dqkv));
      EXPECT_TRUE(test::same_bits(r1.dg, r->dg));
      EXPECT_TRUE(test::same_bits(r1.ds0, r->ds0));
    }
    small.workspace_bytes = gla_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act) / 2;
    EXPECT_THROW(run(small, in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32), UserError);
    small_saved.workspace_bytes = gla_workspace_bytes_per_seq(c.T, c.H, c.Dk, c.Dv, act, true) / 2;
    EXPECT_THROW(run(small_saved, in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32, saved), UserError);
    Tensor short_saved = saved->slice0(0, saved->numel() - 64);
    EXPECT_ANY_THROW(run(gctx.ctx(), in, qkv_g, g_g, dout_g, s0_g, dsf_g, act, DType::F32, short_saved));
  }
}

// The decode step on the GPU reproduces the CPU step (state f32), token after token; Dk not a
// multiple of the kernel's 8 row-walking warps and Dv not one of its 32-column blocks, too.
TEST(GlaGpu, DecodeStep) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t T = 9;
  for (const auto& [B, H, Dk, Dv] : std::vector<std::array<int64_t, 4>>{{3, 2, 32, 160}, {2, 3, 20, 70}})
    for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act) + std::string(" Dk=") + std::to_string(Dk) + " Dv=" + std::to_string(Dv));
    OwnedTensor state_g = to(test::random_tensor({B, H, Dk, Dv}, DType::F64, 3), Device::CUDA, DType::F32);
    OwnedTensor state_c = to(state_g, Device::CPU, DType::F64);
    for (int64_t t = 0; t < T; ++t) {
      OwnedTensor q = to(test::random_tensor({B, H, Dk}, DType::F64, 10 + t), Device::CUDA, act);
      OwnedTensor k = to(test::random_tensor({B, H, Dk}, DType::F64, 20 + t), Device::CUDA, act);
      OwnedTensor v = to(test::random_tensor({B, H, Dv}, DType::F64, 30 + t), Device::CUDA, act);
      OwnedTensor g = to(test::random_tensor({B, H, Dk}, DType::F64, 40 + t, -2, 0), Device::CUDA, DType::F32);
      OwnedTensor o(act, Device::CUDA, {B, H, Dv}), oc(DType::F64, Device::CPU, {B, H, Dv});
      test::poison(o);
      gla_step(gctx.ctx(), q, k, v, g, state_g, o, 0.5);
      gla_step(Ctx{}, to(q, Device::CPU, DType::F64), to(k, Device::CPU, DType::F64), to(v, Device::CPU, DType::F64),
               to(g, Device::CPU, DType::F64), state_c, oc, 0.5);
      gpu_synchronize();
      EXPECT_LT(test::rel_error(o, oc), act == DType::F32 ? 1e-6 : 1e-2);
    }
    EXPECT_LT(test::rel_error(state_g, state_c), 1e-6);
  }
}

}  // namespace
}  // namespace linac::test_gla_gpu
