// Taylor attention CUDA vs the CPU chunked reference (double) on the same rounded inputs, f32 and
// bf16: forward (o, den, final state) and backward (dq, dk, dv), with q/k/v and dq/dk/dv as
// strided views of fused buffers; Dv 16/32/48/64/112/128, ragged chunks, one token, a long
// sequence; bitwise determinism of reruns and of pair groups under a small workspace; the
// decode step. The bf16 checks run through each kernel family this GPU has (on a Hopper GPU the
// fused kernels' wgmma walks, then their mma.sync ones, then the launches: taylor_attn_families.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/gpu.h"
#include "taylor_attn/taylor_attn.h"
#include "taylor_attn_families.h"
#include "test_util.h"

namespace linac::test_taylor_attn_gpu {
namespace {

constexpr int64_t kF = 16;

struct Case {
  int64_t B, T, H, Dv;
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " Dv=" + std::to_string(c.Dv);
}

const Case kCases[] = {{2, 1, 2, 64}, {2, 77, 3, 48}, {1, 200, 2, 112}, {3, 130, 2, 64}, {1, 1000, 1, 128},
                       {2, 64, 2, 16}, {2, 100, 2, 32}};

struct Inputs {
  Case c;
  int64_t W;
  OwnedTensor qkv, dout;  // host, f64
  explicit Inputs(const Case& cs, uint64_t seed = 1)
      : c(cs), W((cs.H * (2 * kF + cs.Dv) + 7) / 8 * 8 + 8),
        qkv(test::random_tensor({cs.B, cs.T, W}, DType::F64, seed, -1.5, 1.5)),
        dout(test::random_tensor({cs.B, cs.T, cs.H, cs.Dv}, DType::F64, seed + 2)) {}
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, kF); }
  Tensor k(const Tensor& b) const { return test::bthd(b, c.H * kF, c.H, kF); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * kF, c.H, c.Dv); }
};

struct Result {
  OwnedTensor o, den, sf, dqkv;
};

// Forward + backward on ctx's device with activations of dtype `act` (den and state in `stat`);
// without final_state the forward is asked for no final state (sf stays poisoned).
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& dout, DType act, DType stat,
           bool final_state = true, const Tensor& saved_carries = Tensor()) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  Result r{OwnedTensor(act, dev, {c.B, c.T, c.H, c.Dv}), OwnedTensor(stat, dev, {c.B, c.H, c.T}),
           OwnedTensor(stat, dev, {c.B, c.H, taylor_attn_state_rows(kF), c.Dv + 1}),
           OwnedTensor(act, dev, {c.B, c.T, in.W})};
  for (const Tensor* t : {&r.o.t, &r.den.t, &r.sf.t, &r.dqkv.t}) test::poison(*t);
  TaylorAttnOpts opts;
  opts.saved_carries = saved_carries;
  taylor_attn_fwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), r.o, r.den, final_state ? r.sf.t : Tensor{}, opts);
  taylor_attn_bwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), r.o, r.den, dout, in.q(r.dqkv), in.k(r.dqkv), in.v(r.dqkv),
                  opts);
  ctx_synchronize(ctx);
  return r;
}

struct Tols {
  double o, grad;
};

void run_parity(DType act, const Tols& tol) {
  GpuContext gctx;
  for (const char* family : test::taylor_families(act))
    for (const Case& c : kCases) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      SCOPED_TRACE(name(c) + " LINAC_TAYLOR_KERNELS=" + family);
      Inputs in(c);
      OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
      Result gr = run(gctx.ctx(), in, qkv_g, dout_g, act, DType::F32);
      // The reference sees the GPU's rounded inputs.
      OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
      Result cr = run(Ctx{}, in, qkv_r, dout_r, DType::F64, DType::F64);

      EXPECT_LT(test::rel_error(gr.o, cr.o), tol.o) << "o";
      EXPECT_LT(test::rel_error(gr.den, cr.den), tol.o) << "den";
      EXPECT_LT(test::rel_error(gr.sf, cr.sf), tol.o) << "final state";
      const int64_t HK = c.H * kF, HV = c.H * c.Dv;
      if (c.T == 1) {  // o = v whatever q and k are: dq = dk = 0 up to rounding
        EXPECT_LT(test::max_abs_diff(test::columns(gr.dqkv, 0, 2 * HK), test::columns(cr.dqkv, 0, 2 * HK)), tol.grad)
            << "dq, dk";
      } else {
        EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, HK), test::columns(cr.dqkv, 0, HK)), tol.grad) << "dq";
        EXPECT_LT(test::rel_error(test::columns(gr.dqkv, HK, HK), test::columns(cr.dqkv, HK, HK)), tol.grad) << "dk";
      }
      EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 2 * HK, HV), test::columns(cr.dqkv, 2 * HK, HV)), tol.grad)
          << "dv";
    }
}

TEST(TaylorAttnGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, {1e-5, 1e-5});
}

TEST(TaylorAttnGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, {1e-2, 2e-2});
}

// A long sequence (the state grows linearly in T; docs/based.md §10.1): still at parity, every value finite.
TEST(TaylorAttnGpu, LongSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c{1, 4100, 2, 64};
  Inputs in(c, 7);
  for (DType act : {DType::BF16, DType::F32})
    for (const char* family : test::taylor_families(act)) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      SCOPED_TRACE(std::string(dtype_name(act)) + " LINAC_TAYLOR_KERNELS=" + family);
      OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
      Result gr = run(gctx.ctx(), in, qkv_g, dout_g, act, DType::F32);
      const int64_t n = c.H * (2 * kF + c.Dv);  // the q|k|v columns (the pad stays poisoned)
      ASSERT_TRUE(test::all_finite(test::columns(gr.dqkv, 0, n)));
      OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
      Result cr = run(Ctx{}, in, qkv_r, dout_r, DType::F64, DType::F64);
      const bool bf = act == DType::BF16;
      EXPECT_LT(test::rel_error(gr.o, cr.o), bf ? 1e-2 : 1e-5);
      EXPECT_LT(test::rel_error(gr.sf, cr.sf), bf ? 1e-2 : 1e-5);
      EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, n), test::columns(cr.dqkv, 0, n)), bf ? 2e-2 : 1e-5);
    }
}

// Bitwise reruns, and a workspace that holds only three pairs (so the pairs run in groups) gives
// the same bits as one group; less than one pair's worth is a UserError. T = 2100 spans two scan
// segments, so the chunk kernels add carries; a forward asked for no final state (which then skips
// the last segment's total) gives the same bits, and so does a backward that takes the forward's
// saved carries (grouped, so each group finds its pairs' carries), poisoned before the forward.
// The third case is sized so that the forward's segment totals of one group run one CTA per
// segment while the small groups' (and the forward's without a final state) split each segment
// over two CTAs: the two shapes of the totals kernel must give the same bits.
TEST(TaylorAttnGpu, DeterministicAndGrouped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t sms = gpu_sm_count(), wide = std::max<int64_t>(1, sms / 4);
  // T = 2100: two segments; the forward with its final state sums both, of H * B pairs.
  EXPECT_FALSE(taylor_attn_totals_in_halves(2 * 2 * wide, sms));
  EXPECT_TRUE(taylor_attn_totals_in_halves(2 * 3, sms));
  for (const Case c : {Case{5, 300, 2, 64}, Case{2, 2100, 2, 64}, Case{wide, 2100, 2, 64}}) {
    for (DType act : {DType::BF16, DType::F32})
      for (const char* family : test::taylor_families(act)) {
        const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
        SCOPED_TRACE(std::string(dtype_name(act)) + " T=" + std::to_string(c.T) + " LINAC_TAYLOR_KERNELS=" + family);
        Inputs in(c, 11);
        OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
        Result r1 = run(gctx.ctx(), in, qkv_g, dout_g, act, DType::F32);
        Result r2 = run(gctx.ctx(), in, qkv_g, dout_g, act, DType::F32);
        Ctx small = gctx.ctx();
        small.workspace_bytes = test::taylor_family_workspace(family, c.T, 3, kF, c.Dv, act);
        Result r3 = run(small, in, qkv_g, dout_g, act, DType::F32);
        Result r4 = run(gctx.ctx(), in, qkv_g, dout_g, act, DType::F32, false);
        const size_t carries = taylor_attn_saved_carries_bytes(c.B, c.T, c.H, kF, c.Dv, act);
        EXPECT_EQ(carries > 0, act == DType::BF16 && c.T > 2048);
        OwnedTensor saved(DType::F32, Device::CUDA, {std::max<int64_t>(1, carries / sizeof(float))});
        test::poison(saved);
        Result r5 = run(small, in, qkv_g, dout_g, act, DType::F32, true, saved);
        for (const Result* r : {&r2, &r3, &r4, &r5}) {
          EXPECT_TRUE(test::same_bits(r1.o, r->o));
          EXPECT_TRUE(test::same_bits(r1.den, r->den));
          if (r != &r4) EXPECT_TRUE(test::same_bits(r1.sf, r->sf));
          EXPECT_TRUE(test::same_bits(r1.dqkv, r->dqkv));
        }
        small.workspace_bytes = test::taylor_family_workspace(family, c.T, 1, kF, c.Dv, act) / 2;
        EXPECT_THROW(run(small, in, qkv_g, dout_g, act, DType::F32), UserError);
      }
  }
}

// The decode step on the GPU reproduces the CPU step (state f32), token after token, starting
// from a prefill's final state.
TEST(TaylorAttnGpu, DecodeStep) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (int64_t F : {int64_t{16}, int64_t{8}})
    for (DType act : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " F=" + std::to_string(F));
      const int64_t B = 3, H = 2, Dv = 112, T = 9, R = taylor_attn_state_rows(F);
      OwnedTensor st_c = test::random_tensor({B, H, R, Dv + 1}, DType::F64, 3, 0, 2);
      OwnedTensor st_g = to(st_c, Device::CUDA, DType::F32);
      for (int64_t t = 0; t < T; ++t) {
        OwnedTensor q = test::random_tensor({B, H, F}, DType::F64, 10 + t), k = test::random_tensor({B, H, F}, DType::F64, 30 + t);
        OwnedTensor v = test::random_tensor({B, H, Dv}, DType::F64, 50 + t);
        OwnedTensor qg = to(q, Device::CUDA, act), kg = to(k, Device::CUDA, act), vg = to(v, Device::CUDA, act);
        OwnedTensor og(act, Device::CUDA, {B, H, Dv}), oc(DType::F64, Device::CPU, {B, H, Dv});
        test::poison(og);
        taylor_attn_step(gctx.ctx(), qg, kg, vg, st_g, og);
        OwnedTensor qr = to(qg, Device::CPU, DType::F64), kr = to(kg, Device::CPU, DType::F64), vr = to(vg, Device::CPU, DType::F64);
        taylor_attn_step(Ctx{}, qr, kr, vr, st_c, oc);
        ctx_synchronize(gctx.ctx());
        EXPECT_LT(test::rel_error(og, oc), act == DType::F32 ? 1e-6 : 1e-2) << "token " << t;
      }
      EXPECT_LT(test::rel_error(st_g, st_c), 1e-6);
    }
}

}  // namespace
}  // namespace linac::test_taylor_attn_gpu
