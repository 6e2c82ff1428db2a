// Short gated convolution with document bounds, CUDA vs the CPU reference (double, with the same
// bounds) on the same rounded inputs, f32 and bf16: forward, backward (da, dg, and dh/dba/dbg
// accumulated onto nonzero values), a and g as strided views of a fused buffer. Documents of one
// token and shorter than the filter, starting exactly on the 128-token tile boundaries (and at 64)
// and just after them (a tile's history then belongs to another document), crossing tiles, a row
// that is one document; widths 1, 2, 3, 4, 8; C past one CTA's channels, with rows that take four
// channels per thread (C % 4 == 0) and rows that take one. The bounds must change the result.
#include "short_conv/short_conv.h"
#include "test_util.h"

namespace linac::test_short_conv_docs_gpu {
namespace {

struct Case {
  int64_t C, W;
  bool silu, biases;
  std::vector<std::vector<int64_t>> layouts;  // documents per row
};

const std::vector<std::vector<int64_t>> kTiles = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}, {64, 1, 2, 61, 72}};

const Case kCases[] = {{300, 3, true, true, kTiles},
                       {130, 4, false, true, kTiles},
                       {257, 8, true, false, kTiles},
                       {96, 2, true, true, kTiles},
                       {64, 1, true, true, kTiles},
                       {2048, 3, true, true, {{1, 2, 3, 57, 1, 1, 235}, {300}}}};

std::string name(const Case& c) {
  return "C=" + std::to_string(c.C) + " W=" + std::to_string(c.W) + (c.silu ? " silu" : " identity") +
         (c.biases ? "" : " no biases") + " B=" + std::to_string(c.layouts.size());
}

// A [B, T, C] view of columns [col0, col0 + C) of a contiguous [B, T, P] buffer.
Tensor btc(const Tensor& buf, int64_t col0, int64_t C) { return test::bthd(buf, col0, 1, C).select(2, 0); }

struct Result {
  OwnedTensor z, dproj, dh, dba, dbg;
};

// Forward + backward on ctx's device with the host inputs' parameters (param dtype) and bounds.
Result run(const Ctx& ctx, const Case& c, const Tensor& proj, const Tensor& dz, const std::vector<OwnedTensor>& prm,
           DType act, DType param, const DocBounds& docs) {
  const Device dev = ctx.device;
  const int64_t B = proj.size(0), T = proj.size(1), P = proj.size(2);
  OwnedTensor h = to(prm[0], dev, param), ba = to(prm[1], dev, param), bg = to(prm[2], dev, param);
  Result r{OwnedTensor(act, dev, {B, T, c.C}), OwnedTensor(act, dev, {B, T, P}), to(prm[3], dev, param),
           to(prm[4], dev, param), to(prm[5], dev, param)};
  test::poison(r.z);
  test::poison(r.dproj);
  const Tensor bav = c.biases ? ba.t : Tensor(), bgv = c.biases ? bg.t : Tensor();
  const ShortConvOpts opts{c.silu, docs};
  short_conv_fwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, bav, bgv, r.z, opts);
  short_conv_bwd(ctx, btc(proj, 0, c.C), btc(proj, c.C, c.C), h, bav, bgv, dz, btc(r.dproj, 0, c.C),
                 btc(r.dproj, c.C, c.C), r.dh, c.biases ? r.dba.t : Tensor(), c.biases ? r.dbg.t : Tensor(), opts);
  ctx_synchronize(ctx);
  return r;
}

std::vector<double> added(const Tensor& x, const Tensor& x0) {
  std::vector<double> v = to_doubles(x);
  const std::vector<double> v0 = to_doubles(x0);
  for (size_t i = 0; i < v.size(); ++i) v[i] -= v0[i];
  return v;
}

void run_parity(DType act, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const OwnedTensor bounds = test::doc_bounds_of(c.layouts);
    const int64_t B = bounds->size(1), T = bounds->size(2), P = 2 * c.C + 8;
    const OwnedTensor bounds_g = to(bounds, Device::CUDA, DType::I32);
    const OwnedTensor proj = test::random_tensor({B, T, P}, DType::F64, 1, -2, 2), dz = test::random_tensor({B, T, c.C}, DType::F64, 2);
    // h, ba, bg, dh0, dba0, dbg0, rounded to f32 (the GPU's parameter dtype) for both sides.
    std::vector<OwnedTensor> prm;
    const std::vector<std::vector<int64_t>> shapes = {{c.C, c.W}, {c.C}, {c.C}, {c.C, c.W}, {c.C}, {c.C}};
    for (size_t i = 0; i < shapes.size(); ++i)
      prm.push_back(to(to(test::random_tensor(shapes[i], DType::F64, 3 + i), Device::CPU, DType::F32), Device::CPU, DType::F64));
    const OwnedTensor proj_g = to(proj, Device::CUDA, act), dz_g = to(dz, Device::CUDA, act);
    const Result gr = run(gctx.ctx(), c, proj_g, dz_g, prm, act, DType::F32, test::doc_view(bounds_g));
    const OwnedTensor proj_r = to(proj_g, Device::CPU, DType::F64), dz_r = to(dz_g, Device::CPU, DType::F64);
    const Result cr = run(Ctx{}, c, proj_r, dz_r, prm, DType::F64, DType::F64, test::doc_view(bounds));

    EXPECT_LT(test::rel_error(gr.z, cr.z), tol) << "z";
    EXPECT_LT(test::rel_error(test::columns(gr.dproj, 0, c.C), test::columns(cr.dproj, 0, c.C)), tol) << "da";
    EXPECT_LT(test::rel_error(test::columns(gr.dproj, c.C, c.C), test::columns(cr.dproj, c.C, c.C)), tol) << "dg";
    EXPECT_LT(test::rel_error(added(gr.dh, prm[3]), added(cr.dh, prm[3])), tol) << "dh";
    if (c.biases) {
      EXPECT_LT(test::rel_error(added(gr.dba, prm[4]), added(cr.dba, prm[4])), tol) << "dba";
      EXPECT_LT(test::rel_error(added(gr.dbg, prm[5]), added(cr.dbg, prm[5])), tol) << "dbg";
    }
    // The bounds matter: the stream result is another one (W > 1).
    if (c.W > 1) {
      const Result stream = run(Ctx{}, c, proj_r, dz_r, prm, DType::F64, DType::F64, DocBounds{});
      EXPECT_GT(test::rel_error(stream.z, cr.z), 3 * tol) << "z without bounds";
      EXPECT_GT(test::rel_error(test::columns(stream.dproj, 0, c.C), test::columns(cr.dproj, 0, c.C)), 3 * tol)
          << "da without bounds";
    }
  }
}

TEST(ShortConvDocsGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 2e-5);
}

TEST(ShortConvDocsGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2);
}

}  // namespace
}  // namespace linac::test_short_conv_docs_gpu
