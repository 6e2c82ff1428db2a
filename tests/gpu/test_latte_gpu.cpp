// Latte CUDA vs the CPU chunked reference (double) on the same rounded inputs, f32 and bf16:
// forward (y, lse, mu_final) and backward (da, db, dv, dlocal) with a, b, v, local and their
// gradients as strided views of fused buffers; plain and Macchiato, L = 1/16/64, Dv = 64/96/128,
// ragged last chunks, logits up to +-1000; bitwise determinism, batch groups under a small
// workspace, the forward's chunk states kept for the backward, and the decode step (plain and
// Macchiato).
#include <cstring>

#include "latte/latte.h"
#include "latte_layout.h"
#include "test_util.h"

namespace linac::test_latte_gpu {
namespace {

struct Case {
  int64_t B, T, H, L, Dv;
  bool mac;
  double b_scale;    // b uniform in [-b_scale, b_scale]
  int64_t pad = 3;   // columns after the fused inputs: 3 leaves rows misaligned (element loads),
                     // 0 in the aligned cases below keeps every row 16-byte aligned (vector loads)
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " L=" +
         std::to_string(c.L) + " Dv=" + std::to_string(c.Dv) + (c.mac ? " Macchiato" : " plain") +
         " b_scale=" + std::to_string(c.b_scale) + " pad=" + std::to_string(c.pad);
}

const Case kCases[] = {{2, 1, 2, 1, 64, false, 3.0},    {2, 77, 3, 16, 96, true, 3.0},
                       {1, 200, 2, 64, 128, false, 5.0}, {2, 130, 2, 16, 64, true, 3.0},
                       {1, 129, 3, 64, 96, true, 3.0},   {3, 300, 4, 16, 128, false, 3.0},
                       {1, 150, 2, 1, 96, true, 2.0},    {2, 190, 2, 32, 128, false, 3.0, 0},
                       {1, 140, 4, 16, 64, true, 3.0, 0}};

struct Inputs : test::LatteLayout {
  Case c;
  OwnedTensor in, dy;  // host f64; in: [B, T, W] in the layout's columns
  explicit Inputs(const Case& cs, uint64_t seed = 1)
      : LatteLayout(cs.H, cs.L, cs.Dv, cs.mac, cs.pad),
        c(cs),
        in(test::random_tensor({cs.B, cs.T, W}, DType::F64, seed)),
        dy(test::random_tensor({cs.B, cs.T, cs.H, cs.Dv}, DType::F64, seed + 1)) {
    const Tensor bv = b(in);
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t e = 0; e < c.H * c.L; ++e) bv.data<double>()[r * W + e] *= c.b_scale;
  }
};

struct Result {
  OwnedTensor y, lse, mu, grad;  // grad: same layout as the inputs' buffer
};

// Forward + backward on ctx's device; activations of `in`'s dtype, lse / mu_final `state_dt`;
// saved: LatteOpts::saved_states.
Result run(const Ctx& ctx, const Inputs& I, const Tensor& in, const Tensor& dy, DType state_dt,
           const Tensor& saved = Tensor()) {
  const Case& c = I.c;
  const Device dev = ctx.device;
  Result r{OwnedTensor(in.dtype, dev, {c.B, c.T, c.H, c.Dv}), OwnedTensor(state_dt, dev, {c.B, c.T, c.H, c.L}),
           OwnedTensor(state_dt, dev, {c.B, c.H, c.L, c.Dv}), OwnedTensor(in.dtype, dev, {c.B, c.T, I.W})};
  for (const Tensor* t : {&r.y.t, &r.lse.t, &r.mu.t, &r.grad.t}) test::poison(*t);
  LatteOpts opts;
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
  EXPECT_LT(test::rel_error(test::view_values(I.a(g.grad)), test::view_values(I.a(c.grad))), tol) << "da";
  EXPECT_LT(test::rel_error(test::view_values(I.b(g.grad)), test::view_values(I.b(c.grad))), tol) << "db";
  EXPECT_LT(test::rel_error(test::view_values(I.v(g.grad)), test::view_values(I.v(c.grad))), tol) << "dv";
  if (I.c.mac)
    EXPECT_LT(test::rel_error(test::view_values(I.local(g.grad)), test::view_values(I.local(c.grad))), tol)
        << "dlocal";
}

void parity(DType act, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs I(c);
    OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
    Result g = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
    OwnedTensor in_c = to(in_g, Device::CPU, DType::F64), dy_c = to(dy_g, Device::CPU, DType::F64);
    Result r = run(Ctx{}, I, in_c, dy_c, DType::F64);
    expect_parity(I, g, r, tol);
  }
}

TEST(LatteGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  parity(DType::F32, 1e-5);
}

TEST(LatteGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  parity(DType::BF16, 1e-2);
}

// b uniform in [-1000, 1000] (a naive exp overflows; within a chunk lse jumps by hundreds): finite
// and at parity. f32 lse near 1000 is exact to ~6e-5, which bounds the f32 agreement.
TEST(LatteGpu, LargeLogits) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::F32, DType::BF16})
    for (bool mac : {false, true}) {
      const Case c{2, 333, 2, 16, 96, mac, 1000.0};
      SCOPED_TRACE(name(c) + " " + dtype_name(act));
      Inputs I(c, 5);
      OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
      Result g = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
      ASSERT_TRUE(test::all_finite(to_doubles(g.y)));
      for (const Tensor& x : {I.a(g.grad.t), I.b(g.grad.t), I.v(g.grad.t), I.local(g.grad.t)})
        if (x.defined()) ASSERT_TRUE(test::all_finite(test::view_values(x)));  // the pad columns stay NaN
      OwnedTensor in_c = to(in_g, Device::CPU, DType::F64), dy_c = to(dy_g, Device::CPU, DType::F64);
      Result r = run(Ctx{}, I, in_c, dy_c, DType::F64);
      expect_parity(I, g, r, act == DType::F32 ? 5e-4 : 1e-2);
    }
}

// Bitwise reruns, and a workspace that holds only two sequences (so the batch runs in groups)
// gives the same bits as one group; a workspace too small for one sequence is a user error.
TEST(LatteGpu, DeterministicAndGrouped) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(act));
    const Case c{5, 300, 2, 16, 96, true, 3.0};
    Inputs I(c, 11);
    OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
    Result r1 = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
    Result r2 = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
    Ctx small = gctx.ctx();
    small.workspace_bytes = 2 * latte_workspace_bytes_per_seq(c.T, c.H, c.L, c.Dv, act) + 1000;
    Result r3 = run(small, I, in_g, dy_g, DType::F32);
    for (const Result* r : {&r2, &r3}) {
      EXPECT_TRUE(test::same_bits(r1.y, r->y));
      EXPECT_TRUE(test::same_bits(r1.lse, r->lse));
      EXPECT_TRUE(test::same_bits(r1.mu, r->mu));
      EXPECT_TRUE(test::same_bits(r1.grad, r->grad));
    }
    small.workspace_bytes = latte_workspace_bytes_per_seq(c.T, c.H, c.L, c.Dv, act) / 2;
    EXPECT_THROW(run(small, I, in_g, dy_g, DType::F32), UserError);
  }
}

// With the forward's chunk states kept for the backward (LatteOpts::saved_states: the backward
// skips the chunk terms and the state scan) every output and gradient has the bits it has
// without, in one group and in groups of two sequences (each group's slice of the buffer); a
// buffer too small is refused.
TEST(LatteGpu, SavedStatesChangeNoBit) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::BF16, DType::F32})
    for (bool mac : {true, false}) {
      const Case c{5, 300, 2, 16, 96, mac, 3.0};
      SCOPED_TRACE(name(c) + " " + dtype_name(act));
      Inputs I(c, 13);
      OwnedTensor in_g = to(I.in, Device::CUDA, act), dy_g = to(I.dy, Device::CUDA, act);
      const auto n = static_cast<int64_t>(latte_saved_state_bytes(c.B, c.T, c.H, c.L, c.Dv) / 4);
      OwnedTensor states(DType::F32, Device::CUDA, {n}), short_states(DType::F32, Device::CUDA, {n - 1});
      test::poison(states);
      Ctx small = gctx.ctx();
      small.workspace_bytes = 2 * latte_workspace_bytes_per_seq(c.T, c.H, c.L, c.Dv, act) + 1000;
      const Result base = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
      const Ctx* const ctxs[] = {&gctx.ctx(), &small};
      for (const Ctx* ctx : ctxs) {
        const Result r = run(*ctx, I, in_g, dy_g, DType::F32, states);
        EXPECT_TRUE(test::same_bits(base.y, r.y));
        EXPECT_TRUE(test::same_bits(base.lse, r.lse));
        EXPECT_TRUE(test::same_bits(base.mu, r.mu));
        EXPECT_TRUE(test::same_bits(base.grad, r.grad));
      }
      EXPECT_ANY_THROW(run(gctx.ctx(), I, in_g, dy_g, DType::F32, short_states));
    }
}

// GPU decode steps from a reset state reproduce the CPU steps token after token, and end at the
// GPU forward's (last lse row, mu_final).
TEST(LatteGpu, DecodeStep) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (bool mac : {false, true})
    for (DType act : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(mac ? "Macchiato " : "plain ") + dtype_name(act));
      const Case c{3, 70, 2, 16, 96, mac, 4.0};
      Inputs I(c, 21);
      OwnedTensor in_g = to(I.in, Device::CUDA, act), in_c = to(in_g, Device::CPU, DType::F64);
      OwnedTensor lse_g(DType::F32, Device::CUDA, {c.B, c.H, c.L}), mu_g(DType::F32, Device::CUDA, {c.B, c.H, c.L, c.Dv});
      OwnedTensor lse_c(DType::F64, Device::CPU, {c.B, c.H, c.L}), mu_c(DType::F64, Device::CPU, {c.B, c.H, c.L, c.Dv});
      test::poison(lse_g);
      test::poison(mu_g);
      latte_state_reset(gctx.ctx(), lse_g, mu_g);
      latte_state_reset(Ctx{}, lse_c, mu_c);
      OwnedTensor y_g(act, Device::CUDA, {c.B, c.H, c.Dv}), y_c(DType::F64, Device::CPU, {c.B, c.H, c.Dv});
      auto at = [&](const Tensor& x, int64_t t) {
        if (!x.defined()) return Tensor();
        Tensor r(static_cast<char*>(x.ptr) + t * x.strides[1] * static_cast<int64_t>(dtype_size(x.dtype)), x.dtype,
                 x.device, {x.size(0), x.size(2), x.size(3)});
        r.strides = {x.strides[0], x.strides[2], 1};
        return r;
      };
      for (int64_t t = 0; t < c.T; ++t) {
        test::poison(y_g);
        latte_step(gctx.ctx(), at(I.a(in_g), t), at(I.b(in_g), t), at(I.v(in_g), t), at(I.local(in_g), t), lse_g, mu_g,
                   y_g);
        latte_step(Ctx{}, at(I.a(in_c), t), at(I.b(in_c), t), at(I.v(in_c), t), at(I.local(in_c), t), lse_c, mu_c, y_c);
        gpu_synchronize();
        EXPECT_LT(test::rel_error(y_g, y_c), act == DType::F32 ? 1e-5 : 1e-2);
      }
      EXPECT_LT(test::rel_error(lse_g, lse_c), 1e-6);
      EXPECT_LT(test::rel_error(mu_g, mu_c), 1e-5);
      OwnedTensor dy_g = to(I.dy, Device::CUDA, act);
      Result f = run(gctx.ctx(), I, in_g, dy_g, DType::F32);
      EXPECT_LT(test::rel_error(mu_g, f.mu), 1e-5);
      EXPECT_LT(test::rel_error(test::view_values(lse_g), test::view_values(at(f.lse, c.T - 1))), 1e-6);
    }
}

}  // namespace
}  // namespace linac::test_latte_gpu
