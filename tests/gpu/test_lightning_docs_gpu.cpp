// Lightning Attention and LRPE with document bounds (lightning.h, lrpe.h) on the GPU against the
// CPU references on the same rounded inputs, f32 and bf16. Lightning: forward (o, the last
// document's final state) and backward (dq, dk, dv, ds0), with s0 and ds_final given, against the
// CPU recurrence (which restarts token by token, independently of the block masks), over packed
// rows with documents of one token, shorter than a block, starting exactly at the block
// boundaries 64 and 128, spanning blocks, and a row that is one document; Dk/Dv of the LRPE layer
// (128/64), ragged 64-wide head-dim slices (80/48), both scans (few state tiles: the two-launch
// scan; many: the one-kernel walk), and a batch run in groups of one sequence
// (each group reads its own rows of the bounds), bit for bit equal to one group. LRPE: y, dx and
// dtheta with positions restarting at every document.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "document_checks.h"
#include "lightning/lightning.h"
#include "lrpe/lrpe.h"
#include "test_util.h"

namespace linac::test_lightning_docs_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}};

struct Case {
  std::vector<std::vector<int64_t>> lengths;
  int64_t H, Dk, Dv;
  double smax;  // decay rates spread over [0, smax] across the heads
};

// The last case has enough 64x64 state tiles (4 x 48 x 2) for the one-kernel scan (kWalkMinTiles).
const Case kCases[] = {{kLayouts, 2, 128, 64, 1.0},
                       {kLayouts, 3, 80, 48, 3.0},
                       {{{13, 51, 13}, {64, 13}, {1, 1, 75}}, 2, 64, 64, 0.05},
                       {kLayouts, 48, 80, 48, 2.0}};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.lengths.size()) + " H=" + std::to_string(c.H) + " Dk=" + std::to_string(c.Dk) +
         " Dv=" + std::to_string(c.Dv) + " smax=" + std::to_string(c.smax);
}

// Host f64 inputs; q|k|v side by side in one [B, T, W] buffer (strided views, as the model passes them).
struct Inputs {
  Case c;
  int64_t B, T, W;
  test::PackedWindow window;
  OwnedTensor qkv, dout, s0, dsf, decay;
  explicit Inputs(const Case& cs)
      : c(cs), B(static_cast<int64_t>(cs.lengths.size())), window(test::packed_window(cs.lengths, 16, 9)) {
    T = window.T;
    W = (c.H * (2 * c.Dk + c.Dv) + 7) / 8 * 8 + 8;
    qkv = test::random_tensor({B, T, W}, DType::F64, 1);
    dout = test::random_tensor({B, T, c.H, c.Dv}, DType::F64, 2);
    s0 = test::random_tensor({B, c.H, c.Dk, c.Dv}, DType::F64, 3);
    dsf = test::random_tensor({B, c.H, c.Dk, c.Dv}, DType::F64, 4);
    decay = OwnedTensor(DType::F64, Device::CPU, {c.H});
    for (int64_t h = 0; h < c.H; ++h) decay->data<double>()[h] = c.smax * static_cast<double>(h) / (c.H - 1);
  }
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, c.Dk); }
  Tensor k(const Tensor& b) const { return test::bthd(b, c.H * c.Dk, c.H, c.Dk); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * c.Dk, c.H, c.Dv); }
};

struct Result {
  OwnedTensor o, sf, dqkv, ds0;
};

// One forward + backward on ctx's device: activations `act`, states `state_dt`, bounds `docs`
// ([2, B, T] int32 on that device).
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& decay, const Tensor& dout,
           const Tensor& s0, const Tensor& dsf, const Tensor& docs, DType act, DType state_dt, LightningForm form) {
  const Case& c = in.c;
  Result r{OwnedTensor(act, ctx.device, {in.B, in.T, c.H, c.Dv}),
           OwnedTensor(state_dt, ctx.device, {in.B, c.H, c.Dk, c.Dv}), OwnedTensor(act, ctx.device, {in.B, in.T, in.W}),
           OwnedTensor(state_dt, ctx.device, {in.B, c.H, c.Dk, c.Dv})};
  for (const Tensor* t : {&r.o.t, &r.sf.t, &r.dqkv.t, &r.ds0.t}) test::poison(*t);
  LightningOpts opts;
  opts.docs = {docs.data<int32_t>(), docs.data<int32_t>() + in.B * in.T};
  lightning_fwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), decay, r.o, s0, r.sf, opts, form);
  lightning_bwd(ctx, in.q(qkv), in.k(qkv), in.v(qkv), decay, dout, s0, dsf, in.q(r.dqkv), in.k(r.dqkv), in.v(r.dqkv),
                r.ds0, opts, form);
  ctx_synchronize(ctx);
  return r;
}

struct Uploaded {
  OwnedTensor qkv, dout, decay, s0, dsf, docs;
};
Uploaded upload(const Inputs& in, DType act) {
  return {to(in.qkv, Device::CUDA, act),          to(in.dout, Device::CUDA, act),
          to(in.decay, Device::CUDA, DType::F32), to(in.s0, Device::CUDA, DType::F32),
          to(in.dsf, Device::CUDA, DType::F32),   to(in.window.docs, Device::CUDA, DType::I32)};
}

void expect_parity(const Inputs& in, const Result& gr, const Result& cr, double tol) {
  const int64_t HK = in.c.H * in.c.Dk, HV = in.c.H * in.c.Dv;
  EXPECT_LT(test::rel_error(gr.o, cr.o), tol) << "o";
  EXPECT_LT(test::rel_error(gr.sf, cr.sf), tol) << "final state";
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 0, HK), test::columns(cr.dqkv, 0, HK)), tol) << "dq";
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, HK, HK), test::columns(cr.dqkv, HK, HK)), tol) << "dk";
  EXPECT_LT(test::rel_error(test::columns(gr.dqkv, 2 * HK, HV), test::columns(cr.dqkv, 2 * HK, HV)), tol) << "dv";
  EXPECT_LT(test::rel_error(gr.ds0, cr.ds0), tol) << "ds0";
}

void check_parity(DType act, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Inputs in(c);
    const Uploaded d = upload(in, act);
    const Result gr =
        run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, d.docs, act, DType::F32, LightningForm::Block);
    const OwnedTensor qkv = to(d.qkv, Device::CPU, DType::F64), dout = to(d.dout, Device::CPU, DType::F64);
    const OwnedTensor decay = to(d.decay, Device::CPU, DType::F64);
    const Result cr = run(Ctx{}, in, qkv, decay, dout, in.s0, in.dsf, in.window.docs, DType::F64, DType::F64,
                          LightningForm::Recurrent);
    expect_parity(in, gr, cr, tol);
  }
}

TEST(LightningDocsGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  check_parity(DType::F32, 1e-5);
}

TEST(LightningDocsGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  check_parity(DType::BF16, 1e-2);
}

// A workspace of one sequence runs the batch one row at a time: each group must read its own
// rows of the bounds.
TEST(LightningDocsGpu, GroupsReadTheirOwnBounds) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case& c = kCases[0];
  const Inputs in(c);
  const Uploaded d = upload(in, DType::BF16);
  const Result whole =
      run(gctx.ctx(), in, d.qkv, d.decay, d.dout, d.s0, d.dsf, d.docs, DType::BF16, DType::F32, LightningForm::Block);
  Ctx small = gctx.ctx();
  small.workspace_bytes = lightning_workspace_bytes_per_seq(in.T, c.H, c.Dk, c.Dv, DType::BF16) + 1000;
  const Result grouped =
      run(small, in, d.qkv, d.decay, d.dout, d.s0, d.dsf, d.docs, DType::BF16, DType::F32, LightningForm::Block);
  EXPECT_TRUE(test::same_bits(whole.o, grouped.o));
  EXPECT_TRUE(test::same_bits(whole.sf, grouped.sf));
  EXPECT_TRUE(test::same_bits(whole.dqkv, grouped.dqkv));
  EXPECT_TRUE(test::same_bits(whole.ds0, grouped.ds0));
}

// LRPE positions restart at every document: x and dx slices of a fused [B, T, 2, H, D] buffer, dy
// of a fused [B, T, 2, H, 2D] one, against the f32 reference (whose angles round as the GPU's,
// lrpe.h) with the same bounds; pos0 shifts every document's positions alike.
TEST(LightningDocsGpu, LrpeParity) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const test::PackedWindow w = test::packed_window(kLayouts, 16, 5);
  const int64_t B = w.B, T = w.T, H = 2, D = 64;
  const OwnedTensor docs_g = to(w.docs, Device::CUDA, DType::I32);
  const DocBounds gb{docs_g->data<int32_t>(), docs_g->data<int32_t>() + B * T};
  const DocBounds cb{w.docs->data<int32_t>(), w.docs->data<int32_t>() + B * T};
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t pos0 : {0, 3}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " pos0 " + std::to_string(pos0));
      const double tol = dt == DType::BF16 ? 1e-2 : 1e-5;
      OwnedTensor xg = to(test::random_tensor({B, T, 2, H, D}, DType::F64, 1, -2, 2), Device::CUDA, dt);
      OwnedTensor thg = to(test::random_tensor({H, D}, DType::F64, 2, 1e-4, 1.0), Device::CUDA, DType::F32);
      OwnedTensor dyg = to(test::random_tensor({B, T, 2, H, 2 * D}, DType::F64, 3), Device::CUDA, dt);
      OwnedTensor dthg(DType::F32, Device::CUDA, {H, D});
      zero_tensor(dthg);
      OwnedTensor yg(dt, Device::CUDA, {B, T, H, 2 * D}), dxg(dt, Device::CUDA, {B, T, H, D});
      test::poison(yg);
      test::poison(dxg);
      OwnedTensor xr = to(xg, Device::CPU, DType::F32), thr = to(thg, Device::CPU, DType::F32);
      OwnedTensor dyr = to(dyg, Device::CPU, DType::F32), dthr(DType::F32, Device::CPU, {H, D});
      zero_tensor(dthr);
      lrpe_fwd(gctx.ctx(), xg->select(2, 1), thg, yg, pos0, gb);
      lrpe_bwd(gctx.ctx(), xg->select(2, 1), thg, dyg->select(2, 0), dxg, dthg, pos0, gb);
      gctx.synchronize();
      OwnedTensor yr(DType::F32, Device::CPU, {B, T, H, 2 * D}), dxr(DType::F32, Device::CPU, {B, T, H, D});
      lrpe_fwd(Ctx{}, xr->select(2, 1), thr, yr, pos0, cb);
      lrpe_bwd(Ctx{}, xr->select(2, 1), thr, dyr->select(2, 0), dxr, dthr, pos0, cb);
      EXPECT_LT(test::rel_error(yg, yr), tol) << "y";
      EXPECT_LT(test::rel_error(dxg, dxr), tol) << "dx";
      EXPECT_LT(test::rel_error(dthg, dthr), 1e-5) << "dtheta";
    }
}

}  // namespace
}  // namespace linac::test_lightning_docs_gpu
