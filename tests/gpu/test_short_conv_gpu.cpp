// Short gated convolution, CUDA vs the CPU reference (double) on the same rounded inputs, f32 and
// bf16: forward, backward (da, dg, and dh/dba/dbg accumulated onto nonzero values), a and g as
// strided views of a fused buffer, several token tiles per sequence, both activations, without
// biases; bitwise determinism of the backward; the backward without dg; the decode step against
// the forward.
#include <cmath>

#include "short_conv/short_conv.h"
#include "test_util.h"

namespace linac::test_short_conv_gpu {
namespace {

struct Case {
  int64_t B, T, C, W;
  bool silu, biases;
  int64_t pad = 5;  // columns after a | g in the fused buffer: 5 leaves rows unaligned (one channel per thread)
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) +
         " W=" + std::to_string(c.W) + (c.silu ? " silu" : " identity") + (c.biases ? "" : " no biases") +
         " pad=" + std::to_string(c.pad);
}

// T = 1, short sequences, tiles with ragged ends (kShortConvTileTokens = 128), C past one CTA's
// channels and not a multiple of them; unaligned rows (one channel per thread) and, with a pad that
// keeps every row 4-aligned and C % 4 == 0, four channels per thread.
const Case kCases[] = {
    {2, 1, 7, 3, true, true},         {3, 37, 130, 3, true, true},    {2, 200, 300, 4, false, true},
    {1, 129, 257, 8, true, false},    {4, 64, 96, 1, true, true},     {2, 300, 2048, 3, true, true},
    {2, 1, 8, 3, true, true, 4},      {3, 37, 132, 3, true, true, 4}, {2, 300, 300, 4, false, true, 8},
    {1, 129, 256, 8, true, false, 0}, {4, 64, 96, 1, true, true, 4},  {2, 300, 2048, 3, true, true, 0}};

// A [B, T, C] view of columns [col0, col0 + C) of a contiguous [B, T, P] buffer.
Tensor btc(const Tensor& buf, int64_t col0, int64_t C) {
  const int64_t B = buf.size(0), T = buf.size(1), P = buf.size(2);
  Tensor t(static_cast<char*>(buf.ptr) + col0 * static_cast<int64_t>(dtype_size(buf.dtype)), buf.dtype, buf.device,
           {B, T, C});
  t.strides = {T * P, P, 1};
  return t;
}

// Columns [col0, col0 + n) of every row of a [B, T, P] buffer.
std::vector<double> part(const Tensor& buf, int64_t col0, int64_t n) {
  const std::vector<double> all = to_doubles(buf);
  const int64_t P = buf.size(2);
  std::vector<double> out;
  for (int64_t row = 0; row < buf.size(0) * buf.size(1); ++row)
    out.insert(out.end(), all.begin() + row * P + col0, all.begin() + row * P + col0 + n);
  return out;
}

// Host inputs in f64: the fused a | g | pad buffer, dz, parameters and the initial parameter gradients.
struct Inputs {
  Case c;
  int64_t P;
  OwnedTensor proj, dz, h, ba, bg, dh0, dba0, dbg0;
  explicit Inputs(const Case& cs)
      : c(cs),
        P(2 * cs.C + cs.pad),
        proj(test::random_tensor({cs.B, cs.T, P}, DType::F64, 1, -2, 2)),
        dz(test::random_tensor({cs.B, cs.T, cs.C}, DType::F64, 2)),
        h(test::random_tensor({cs.C, cs.W}, DType::F64, 3)),
        ba(test::random_tensor({cs.C}, DType::F64, 4)),
        bg(test::random_tensor({cs.C}, DType::F64, 5)),
        dh0(test::random_tensor({cs.C, cs.W}, DType::F64, 6)),
        dba0(test::random_tensor({cs.C}, DType::F64, 7)),
        dbg0(test::random_tensor({cs.C}, DType::F64, 8)) {}
};

struct Result {
  OwnedTensor z, dproj, dh, dba, dbg;
};

// Forward + backward on ctx's device: activations `act`, parameters and their gradients `param`.
Result run(const Ctx& ctx, const Inputs& in, const Tensor& proj, const Tensor& dz, DType act, DType param) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  OwnedTensor h = to(in.h, dev, param), ba = to(in.ba, dev, param), bg = to(in.bg, dev, param);
  Result r{OwnedTensor(act, dev, {c.B, c.T, c.C}), OwnedTensor(act, dev, {c.B, c.T, in.P}), to(in.dh0, dev, param),
           to(in.dba0, dev, param), to(in.dbg0, dev, param)};
  test::poison(r.z);
  test::poison(r.dproj);
  const Tensor bav = c.biases ? ba.t : Tensor(), bgv = c.biases ? bg.t : Tensor();
  short_conv_fwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, bav, bgv, r.z, {c.silu});
  short_conv_bwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, bav, bgv, dz, btc(r.dproj, 0, c.C),
                 btc(r.dproj, c.C, c.C), r.dh, c.biases ? r.dba.t : Tensor(), c.biases ? r.dbg.t : Tensor(), {c.silu});
  ctx_synchronize(ctx);
  return r;
}

void run_parity(DType act, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs in(c);
    OwnedTensor proj_g = to(in.proj, Device::CUDA, act), dz_g = to(in.dz, Device::CUDA, act);
    Result gr = run(gctx.ctx(), in, proj_g, dz_g, act, DType::F32);
    // The reference sees the GPU's rounded inputs (parameters are f32 on the GPU).
    OwnedTensor proj_r = to(proj_g, Device::CPU, DType::F64), dz_r = to(dz_g, Device::CPU, DType::F64);
    Inputs in_r(c);
    for (auto* p : {&in_r.h, &in_r.ba, &in_r.bg, &in_r.dh0, &in_r.dba0, &in_r.dbg0}) {
      OwnedTensor rounded = to(*p, Device::CPU, DType::F32);
      convert_host(p->t, rounded.t);
    }
    Result cr = run(Ctx{}, in_r, proj_r, dz_r, DType::F64, DType::F64);

    EXPECT_LT(test::rel_error(gr.z, cr.z), tol) << "z";
    EXPECT_LT(test::rel_error(part(gr.dproj, 0, c.C), part(cr.dproj, 0, c.C)), tol) << "da";
    EXPECT_LT(test::rel_error(part(gr.dproj, c.C, c.C), part(cr.dproj, c.C, c.C)), tol) << "dg";
    // Only the accumulated part: the initial values would hide an error in a small increment.
    auto added = [](const Tensor& x, const Tensor& x0) {
      std::vector<double> v = to_doubles(x);
      const std::vector<double> v0 = to_doubles(x0);
      for (size_t i = 0; i < v.size(); ++i) v[i] -= v0[i];
      return v;
    };
    EXPECT_LT(test::rel_error(added(gr.dh, in_r.dh0), added(cr.dh, in_r.dh0)), tol) << "dh";
    if (c.biases) {
      EXPECT_LT(test::rel_error(added(gr.dba, in_r.dba0), added(cr.dba, in_r.dba0)), tol) << "dba";
      EXPECT_LT(test::rel_error(added(gr.dbg, in_r.dbg0), added(cr.dbg, in_r.dbg0)), tol) << "dbg";
    } else {
      EXPECT_EQ(to_doubles(gr.dba), to_doubles(in_r.dba0)) << "dba touched without a bias";
    }
  }
}

TEST(ShortConvGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 2e-5);
}

TEST(ShortConvGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2);
}

TEST(ShortConvGpu, BackwardIsDeterministic) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (const int64_t pad : {5, 0}) {
    SCOPED_TRACE("pad=" + std::to_string(pad));
    const Case c{3, 1000, 640, 3, true, true, pad};
    Inputs in(c);
    OwnedTensor proj = to(in.proj, Device::CUDA, DType::BF16), dz = to(in.dz, Device::CUDA, DType::BF16);
    Result r1 = run(gctx.ctx(), in, proj, dz, DType::BF16, DType::F32);
    Result r2 = run(gctx.ctx(), in, proj, dz, DType::BF16, DType::F32);
    EXPECT_EQ(part(r1.dproj, 0, 2 * c.C), part(r2.dproj, 0, 2 * c.C));  // the pad columns stay NaN
    EXPECT_EQ(to_doubles(r1.dh), to_doubles(r2.dh));
    EXPECT_EQ(to_doubles(r1.dba), to_doubles(r2.dba));
    EXPECT_EQ(to_doubles(r1.dbg), to_doubles(r2.dbg));
  }
}

// Without dg (Latte's constant gate) the backward writes da, dh, dba and dbg bit for bit as with it
// and leaves dg's memory alone, with one (pad 5) and four (pad 0) channels per thread.
TEST(ShortConvGpu, GateGradientIsOptional) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (const int64_t pad : {5, 0}) {
    SCOPED_TRACE("pad=" + std::to_string(pad));
    const Case c{2, 300, 256, 3, false, true, pad};
    Inputs in(c);
    OwnedTensor proj = to(in.proj, Device::CUDA, DType::BF16), dz = to(in.dz, Device::CUDA, DType::BF16);
    OwnedTensor h = to(in.h, Device::CUDA, DType::F32), ba = to(in.ba, Device::CUDA, DType::F32),
                bg = to(in.bg, Device::CUDA, DType::F32);
    auto backward = [&](bool want_dg) {
      Result r{OwnedTensor(DType::BF16, Device::CUDA, {c.B, c.T, c.C}),
               OwnedTensor(DType::BF16, Device::CUDA, {c.B, c.T, in.P}), to(in.dh0, Device::CUDA, DType::F32),
               to(in.dba0, Device::CUDA, DType::F32), to(in.dbg0, Device::CUDA, DType::F32)};
      test::poison(r.dproj);
      short_conv_bwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, ba, bg, dz, btc(r.dproj, 0, c.C),
                     want_dg ? btc(r.dproj, c.C, c.C) : Tensor(), r.dh, r.dba, r.dbg, {c.silu});
      ctx_synchronize(ctx);
      return r;
    };
    const Result with = backward(true), without = backward(false);
    EXPECT_EQ(part(without.dproj, 0, c.C), part(with.dproj, 0, c.C));
    EXPECT_EQ(to_doubles(without.dh), to_doubles(with.dh));
    EXPECT_EQ(to_doubles(without.dba), to_doubles(with.dba));
    EXPECT_EQ(to_doubles(without.dbg), to_doubles(with.dbg));
    for (const double v : part(without.dproj, c.C, c.C)) ASSERT_TRUE(std::isnan(v)) << "dg written";
    for (const double v : part(with.dproj, c.C, c.C)) ASSERT_FALSE(std::isnan(v));
  }
}

// Token-by-token decode on the GPU (f32 state) against the GPU forward on the same inputs.
void check_steps(DType act, double tol) {
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (int64_t W : {1, 3, 8}) {
    SCOPED_TRACE("W=" + std::to_string(W));
    const Case c{3, 13, 200, W, true, true, 0};
    Inputs in(c);
    OwnedTensor proj = to(in.proj, Device::CUDA, act);
    OwnedTensor h = to(in.h, Device::CUDA, DType::F32), ba = to(in.ba, Device::CUDA, DType::F32),
                bg = to(in.bg, Device::CUDA, DType::F32);
    OwnedTensor z(act, Device::CUDA, {c.B, c.T, c.C}), zs(act, Device::CUDA, {c.B, c.T, c.C});
    test::poison(zs);
    short_conv_fwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, ba, bg, z, {true});
    OwnedTensor state(DType::F32, Device::CUDA, {c.B, W - 1, c.C});
    if (W > 1) zero_tensor(state);
    for (int64_t t = 0; t < c.T; ++t)
      short_conv_step(ctx, btc(proj, 0, c.C).select(1, t), btc(proj, c.C, c.C).select(1, t), h, ba, bg, state,
                      zs->select(1, t), {true});
    ctx_synchronize(ctx);
    EXPECT_LT(test::rel_error(zs, z), tol);
  }
}

TEST(ShortConvGpu, StepsMatchForwardF32) {
  LINAC_SKIP_WITHOUT_GPU();
  check_steps(DType::F32, 1e-6);
}

TEST(ShortConvGpu, StepsMatchForwardBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  check_steps(DType::BF16, 1e-2);
}

}  // namespace
}  // namespace linac::test_short_conv_gpu
