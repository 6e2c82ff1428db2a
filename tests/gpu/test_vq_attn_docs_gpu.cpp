// VQ-attention with document bounds (vq_attn.h) on the GPU against the CPU block reference (double)
// on the same rounded inputs, f32 and bf16: forward (o, lse) and backward from the GPU's o and lse
// (dq, dkhat, dv, and du, dvr, drho summed over the documents; the backward recomputing the
// weights, and taking the forward's saved cache and weights), over packed rows with documents of
// one token, shorter than a block, starting exactly at the block boundaries 64 and 128, spanning
// several blocks (their caches fill), moved to a block boundary mid-row (the placement of
// vq_packed.h; Lb = 32), and a row that is one document; khat off the codewords (the forward then
// depends on where each document's blocks begin); chunks of one and three blocks (seams inside
// documents and at their padding) close to one chunk, reruns bit for bit; the placement kept
// across calls (VqAttnOpts::doc_blocks) used without the bounds; stream
// results unchanged by the documents path (bounds of one document per row == no bounds, bit for
// bit). Decode steps with a document started in one row mid-batch against the CPU steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "document_checks.h"
#include "test_util.h"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_packed.h"
#include "vq_attn_checks.h"

namespace linac::test_vq_attn_docs_gpu {
namespace {

const std::vector<std::vector<int64_t>> kLayouts = {
    {1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}, {5, 150, 45}};

struct Case {
  int64_t H, Dk, Dv, S, Lb;
};

std::string name(const Case& c) {
  return "H=" + std::to_string(c.H) + " Dk=" + std::to_string(c.Dk) + " Dv=" + std::to_string(c.Dv) +
         " S=" + std::to_string(c.S) + " Lb=" + std::to_string(c.Lb);
}

// Blocks of 64 (documents start on and off block boundaries), of 32 (documents of 67 and 68 fill
// caches), the paper's single head on a codebook larger than a block's tokens.
const Case kCases[] = {{2, 64, 64, 37, 64}, {1, 32, 96, 7, 32}, {1, 128, 256, 512, 64}};

// Host f64 inputs: q|khat|v side by side in one [B, T, W] buffer (strided views, as the mixer
// passes them); khat is the codeword of z plus noise.
struct Inputs {
  Case c;
  test::PackedWindow window;
  int64_t B, T, W;
  OwnedTensor qkv, z, codebook, u, vr, rho, dout;
  explicit Inputs(const Case& cs, const std::vector<std::vector<int64_t>>& layouts = kLayouts)
      : c(cs),
        window(test::packed_window(layouts, 16, 9)),
        B(window.B),
        T(window.T),
        W((cs.H * (2 * cs.Dk + cs.Dv) + 7) / 8 * 8 + 8),
        qkv(test::random_tensor({B, T, W}, DType::F64, 1, -0.5, 0.5)),
        z(DType::I32, Device::CPU, {B, T, cs.H}),
        codebook(test::random_tensor({cs.H, cs.S, cs.Dk}, DType::F64, 2, -0.5, 0.5)),
        u(test::random_tensor({cs.H, cs.Dk}, DType::F64, 3, -0.2, 0.2)),
        vr(test::random_tensor({cs.H, cs.Dk}, DType::F64, 4, -0.2, 0.2)),
        rho(test::random_tensor({cs.H, cs.Lb + 1, cs.Dk}, DType::F64, 5, -0.5, 0.5)),
        dout(test::random_tensor({B, T, cs.H, cs.Dv}, DType::F64, 6)) {
    OwnedTensor cb32 = to(codebook, Device::CPU, DType::F32);
    convert_host(codebook, cb32);
    const auto r = test::random_values(static_cast<size_t>(B * T * cs.H), 7, 0, static_cast<double>(cs.S));
    const auto noise = test::random_values(static_cast<size_t>(B * T * cs.H * cs.Dk), 8, -0.1, 0.1);
    double* buf = qkv->data<double>();
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t h = 0; h < cs.H; ++h) {
        const int32_t code = std::min(static_cast<int32_t>(r[bt * cs.H + h]), static_cast<int32_t>(cs.S - 1));
        z->data<int32_t>()[bt * cs.H + h] = code;
        for (int64_t d = 0; d < cs.Dk; ++d)
          buf[bt * W + cs.H * cs.Dk + h * cs.Dk + d] = codebook->data<double>()[(h * cs.S + code) * cs.Dk + d] +
                                                      noise[(bt * cs.H + h) * cs.Dk + d];
      }
  }
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, c.Dk); }
  Tensor khat(const Tensor& b) const { return test::bthd(b, c.H * c.Dk, c.H, c.Dk); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * c.Dk, c.H, c.Dv); }
  // The bounds, on the host or copied to the GPU.
  const int32_t* bounds() const { return window.docs->data<int32_t>(); }
};

using Result = test::VqResult;

// Forward, then backward from (o_in, lse_in) when given, else from its own forward, on ctx's device;
// B and T those of qkv.
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& z, const Tensor& cb, const Tensor& u,
           const Tensor& vr, const Tensor& rho, const Tensor& dout, DType act, DType par, const VqAttnOpts& opts,
           const Tensor& o_in = Tensor(), const Tensor& lse_in = Tensor()) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  const int64_t B = qkv.size(0), T = qkv.size(1);
  Result r{OwnedTensor(act, dev, {B, T, c.H, c.Dv}), OwnedTensor(par, dev, {B, T, c.H}),
           OwnedTensor(act, dev, {B, T, in.W}),      OwnedTensor(par, dev, {c.H, c.Dk}),
           OwnedTensor(par, dev, {c.H, c.Dk}),              OwnedTensor(par, dev, {c.H, c.Lb + 1, c.Dk})};
  for (const Tensor* t : {&r.o.t, &r.lse.t, &r.grad.t, &r.du.t, &r.dvr.t, &r.drho.t}) test::poison(*t);
  vq_attn_fwd(ctx, in.q(qkv), in.khat(qkv), z, in.v(qkv), cb, u, vr, rho, r.o, r.lse, opts);
  const Tensor& o = o_in.defined() ? o_in : r.o.t;
  const Tensor& lse = lse_in.defined() ? lse_in : r.lse.t;
  vq_attn_bwd(ctx, in.q(qkv), in.khat(qkv), z, in.v(qkv), cb, u, vr, rho, o, lse, dout, in.q(r.grad),
              in.khat(r.grad), in.v(r.grad), r.du, r.dvr, r.drho, opts);
  ctx_synchronize(ctx);
  return r;
}

struct Gpu {
  OwnedTensor qkv, z, cb, u, vr, rho, dout, docs;
  Gpu(const Inputs& in, DType act)
      : qkv(to(in.qkv, Device::CUDA, act)), z(to(in.z, Device::CUDA, DType::I32)),
        cb(to(in.codebook, Device::CUDA, DType::F32)), u(to(in.u, Device::CUDA, DType::F32)),
        vr(to(in.vr, Device::CUDA, DType::F32)), rho(to(in.rho, Device::CUDA, DType::F32)),
        dout(to(in.dout, Device::CUDA, act)), docs(to(in.window.docs, Device::CUDA, DType::I32)) {}
  VqAttnOpts opts(const Inputs& in) const {
    const int32_t* d = docs->data<int32_t>();
    return {in.c.Lb, {d, d + in.B * in.T}, {}};
  }
};

void run_parity(DType act, double tol_o, double tol_grad,
                const std::vector<Case>& cases = {std::begin(kCases), std::end(kCases)},
                const std::vector<std::vector<int64_t>>& layouts = kLayouts) {
  GpuContext gctx;
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    Inputs in(c, layouts);
    const Gpu g(in, act);
    Result gr = run(gctx.ctx(), in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, act, DType::F32, g.opts(in));
    OwnedTensor qkv_r = to(g.qkv, Device::CPU, DType::F64), dout_r = to(g.dout, Device::CPU, DType::F64);
    OwnedTensor u_r = to(g.u, Device::CPU, DType::F64), vr_r = to(g.vr, Device::CPU, DType::F64);
    OwnedTensor rho_r = to(g.rho, Device::CPU, DType::F64);
    OwnedTensor o_r = to(gr.o, Device::CPU, DType::F64), lse_r = to(gr.lse, Device::CPU, DType::F64);
    const VqAttnOpts host{c.Lb, {in.bounds(), in.bounds() + in.B * in.T}, {}};
    Result cr = run(Ctx{}, in, qkv_r, in.z, in.codebook, u_r, vr_r, rho_r, dout_r, DType::F64, DType::F64, host, o_r,
                    lse_r);
    test::expect_vq_close(gr, cr, c.H * c.Dk, c.H * c.Dv, tol_o, tol_grad);
    {  // The forward's cache and weights saved for the backward, sized for documents.
      SCOPED_TRACE("saved cache and weights");
      auto words = [](size_t bytes) {
        return OwnedTensor(DType::F32, Device::CUDA, {static_cast<int64_t>(bytes / 4)});
      };
      const OwnedTensor cache = words(vq_attn_saved_cache_bytes(in.B, in.T, c.H, c.Dv, c.S, c.Lb, act, true));
      const OwnedTensor weights = words(vq_attn_saved_weights_bytes(in.B, in.T, c.H, c.S, c.Lb, act, true));
      VqAttnOpts saved = g.opts(in);
      saved.saved_cache = cache;
      saved.saved_weights = weights;
      const Result gs = run(gctx.ctx(), in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, act, DType::F32, saved);
      EXPECT_TRUE(test::same_bits(gs.o, gr.o));
      test::expect_vq_close(gs, cr, c.H * c.Dk, c.H * c.Dv, tol_o, tol_grad);
    }
    // The reference itself differs from the stream form (the bounds are not a no-op).
    Result sr = run(Ctx{}, in, qkv_r, in.z, in.codebook, u_r, vr_r, rho_r, dout_r, DType::F64, DType::F64,
                    VqAttnOpts{c.Lb, {}, {}});
    EXPECT_GT(test::rel_error(sr.o, cr.o), 1e-2);
  }
}

TEST(VqAttnDocsGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 1e-5, 2e-5);
}

TEST(VqAttnDocsGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2, 2e-2);
}

// Workspaces that hold chunks of one and of three blocks give the full workspace's results (the
// previous block's key and value gradients accumulate across chunk seams, now also at documents
// moved to a block boundary and their padding), and reruns the same bits. Returns R.
int64_t check_chunked(const Case& c, const std::vector<std::vector<int64_t>>& layouts) {
  GpuContext gctx;
  Inputs in(c, layouts);
  std::vector<int32_t> end(in.bounds() + in.B * in.T, in.bounds() + 2 * in.B * in.T);
  const int64_t R = vq_cuda::plan_documents(end.data(), in.B, in.T, c.Lb).R;
  const vq_cuda::Geo geo = vq_cuda::geo_of(in.B, in.T, c.H, c.Dk, c.Dv, c.S, c.Lb, R);
  for (DType act : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(act));
    const Gpu g(in, act);
    auto run_on = [&](const Ctx& ctx) {
      return run(ctx, in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, act, DType::F32, g.opts(in));
    };
    const Result r1 = run_on(gctx.ctx()), r2 = run_on(gctx.ctx());
    for (auto m : {&Result::o, &Result::lse, &Result::grad, &Result::du, &Result::dvr, &Result::drho})
      EXPECT_TRUE(test::same_bits(r1.*m, r2.*m));
    // In bf16 a chunk's dv window part is stored in the activation dtype before the next chunk adds
    // to it: one more rounding (2^-9 relative) than one chunk takes, so the gradients get 5e-3.
    const double tol = act == DType::BF16 ? 2e-3 : 1e-5, tol_grad = act == DType::BF16 ? 5e-3 : 1e-5;
    for (int64_t cap : {1, 3}) {
      SCOPED_TRACE("blocks per chunk " + std::to_string(cap));
      Ctx small = gctx.ctx();
      small.workspace_bytes = vq_cuda::doc_tables_bytes(in.B, in.T, c.Lb, R) +
                              vq_cuda::layout(geo, dtype_size(act), true, cap, nullptr, nullptr);
      EXPECT_LE(small.workspace_bytes, gctx.ctx().workspace_bytes);
      test::expect_vq_close(run_on(small), r1, c.H * c.Dk, c.H * c.Dv, tol, tol_grad, 1e-6);
    }
  }
  return R;
}

TEST(VqAttnDocsGpu, DeterministicAndChunked) {
  LINAC_SKIP_WITHOUT_GPU();
  const Case c = kCases[1];  // Lb = 32: documents move to block boundaries
  const Inputs in(c);
  EXPECT_GT(check_chunked(c, kLayouts), (in.T + c.Lb - 1) / c.Lb);  // the placement pads
}

// Four blocks per row after the placement: the gradient store sums each token's cache-mean
// gradients itself instead of the sweep (two terms for block 0, one for block 1), stopping at
// segment ends (the 90-token document moved to block 1, the 110-token one starting there).
TEST(VqAttnDocsGpu, ParityCacheGradsSummedInStore) {
  LINAC_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> layouts = {{150}, {30, 90, 30}, {1, 39, 110}, {5, 35, 70, 40}};
  const std::vector<Case> cases = {{1, 32, 64, 9, 40}, {2, 16, 20, 6, 40}};  // 16-byte and four-wide stores
  const Inputs in(cases[0], layouts);
  std::vector<int32_t> end(in.bounds() + in.B * in.T, in.bounds() + 2 * in.B * in.T);
  ASSERT_EQ(vq_cuda::plan_documents(end.data(), in.B, in.T, 40).R, 4);
  run_parity(DType::F32, 1e-5, 2e-5, cases, layouts);
  run_parity(DType::BF16, 1e-2, 2e-2, cases, layouts);
  // Chunks of one and three blocks split the rows' four: the gcache GEMMs take blocks 2 and 3 of
  // each row from whichever chunk holds them.
  EXPECT_EQ(check_chunked(cases[0], layouts), 4);
}

// VqAttnOpts::doc_blocks: the first call plans the placement and stores its block count; calls
// given that count use the tables at the workspace's start as they are, without reading the
// bounds: after the bounds on the device are overwritten with one document per row, such a call
// still gives the first call's bits, while one that plans again does not.
TEST(VqAttnDocsGpu, PlacementKeptAcrossCalls) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c = kCases[1];
  Inputs in(c);
  Gpu g(in, DType::BF16);
  int64_t R = 0;
  VqAttnOpts opts = g.opts(in);
  opts.doc_blocks = &R;
  auto run_with = [&](const VqAttnOpts& o) {
    return run(gctx.ctx(), in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, DType::BF16, DType::F32, o);
  };
  const Result first = run_with(opts);
  EXPECT_GT(R, (in.T + c.Lb - 1) / c.Lb);  // the placement's, which pads
  OwnedTensor whole(DType::I32, Device::CPU, {2, in.B, in.T});
  for (int64_t i = 0; i < in.B * in.T; ++i) {
    whole->data<int32_t>()[i] = 0;
    whole->data<int32_t>()[in.B * in.T + i] = static_cast<int32_t>(in.T);
  }
  copy_tensor(g.docs, whole);
  const Result kept = run_with(opts);
  EXPECT_TRUE(test::same_bits(kept.o, first.o));
  EXPECT_TRUE(test::same_bits(kept.grad, first.grad));
  EXPECT_TRUE(test::same_bits(kept.drho, first.drho));
  int64_t R2 = 0;
  opts.doc_blocks = &R2;
  const Result planned = run_with(opts);
  EXPECT_EQ(R2, (in.T + c.Lb - 1) / c.Lb);
  EXPECT_GT(test::rel_error(planned.o, first.o), 1e-2);
}

// Bounds of one document per row run the documents path on whole rows: bit for bit the stream
// results (the same placement, so the same kernels on the same packed rows).
TEST(VqAttnDocsGpu, OneDocumentPerRowEqualsStreamBitwise) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c = kCases[0];
  Inputs in(c);
  const Gpu g(in, DType::BF16);
  OwnedTensor whole(DType::I32, Device::CPU, {2, in.B, in.T});
  for (int64_t i = 0; i < in.B * in.T; ++i) {
    whole->data<int32_t>()[i] = 0;
    whole->data<int32_t>()[in.B * in.T + i] = static_cast<int32_t>(in.T);
  }
  const OwnedTensor whole_d = to(whole, Device::CUDA, DType::I32);
  const int32_t* d = whole_d->data<int32_t>();
  const VqAttnOpts docs{c.Lb, {d, d + in.B * in.T}}, stream{c.Lb, {}};
  const Result a = run(gctx.ctx(), in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, DType::BF16, DType::F32, docs);
  const Result b = run(gctx.ctx(), in, g.qkv, g.z, g.cb, g.u, g.vr, g.rho, g.dout, DType::BF16, DType::F32, stream);
  EXPECT_TRUE(test::same_bits(a.o, b.o));
  EXPECT_TRUE(test::same_bits(a.grad, b.grad));
  EXPECT_TRUE(test::same_bits(a.du, b.du) && test::same_bits(a.dvr, b.dvr) && test::same_bits(a.drho, b.drho));
}

using test::token;

// Decode steps on the GPU with row 0 starting a document at token 45 (not a multiple of Lb = 8,
// after its cache has filled; its position back to 0), row 1 decoding on: equal to the same steps
// on the CPU.
TEST(VqAttnDocsGpu, DecodeStartDocumentMatchesCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c{2, 64, 96, 7, 8};
  const int64_t n1 = 45, T = 80;
  Inputs in(c);
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    const Gpu g(in, act);
    const OwnedTensor qkv_r = to(g.qkv, Device::CPU, DType::F64), u_r = to(g.u, Device::CPU, DType::F64);
    const OwnedTensor vr_r = to(g.vr, Device::CPU, DType::F64), rho_r = to(g.rho, Device::CPU, DType::F64);
    const int64_t B = 2;
    std::vector<double> outs[2];
    for (const Device dev : {Device::CPU, Device::CUDA}) {
      const bool gpu = dev == Device::CUDA;
      const Ctx ctx = gpu ? gctx.ctx() : Ctx{};
      const DType st_dt = gpu ? DType::F32 : DType::F64, o_dt = gpu ? act : DType::F64;
      OwnedTensor rk(st_dt, dev, {B, c.H, c.Lb, c.Dk}), rv(st_dt, dev, {B, c.H, c.Lb, c.Dv});
      OwnedTensor rz(DType::I32, dev, {B, c.H, c.Lb}), n(st_dt, dev, {B, c.H, c.S}), m(st_dt, dev, {B, c.H, c.S, c.Dv});
      const VqAttnState st{rk, rv, rz, n, m};
      vq_attn_state_reset(ctx, st);
      OwnedTensor o(o_dt, dev, {B, T, c.H, c.Dv});
      const Tensor qkv = gpu ? g.qkv.t : qkv_r.t;
      for (int64_t t = 0; t < T; ++t) {
        if (t == n1) vq_attn_state_start_document(ctx, st, 0);
        OwnedTensor zc_h(DType::I32, Device::CPU, {B, c.H});
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < c.H; ++h) zc_h->data<int32_t>()[b * c.H + h] = in.z->data<int32_t>()[(b * in.T + t) * c.H + h];
        const OwnedTensor zc = to(zc_h, dev, DType::I32);
        auto rows = [&](const Tensor& x) { return token(x.narrow(0, 0, B), t); };
        const OwnedTensor pos =
            test::int32_values({static_cast<int32_t>(t < n1 ? t : t - n1), static_cast<int32_t>(t)}, dev);
        vq_attn_step(ctx, rows(in.q(qkv)), rows(in.khat(qkv)), zc, rows(in.v(qkv)), gpu ? g.cb.t : in.codebook.t,
                     gpu ? g.u.t : u_r.t, gpu ? g.vr.t : vr_r.t, gpu ? g.rho.t : rho_r.t, st, pos, token(o.t, t));
        if (gpu) ctx_synchronize(ctx);
      }
      outs[gpu] = to_doubles(o);
    }
    EXPECT_LT(test::rel_error(outs[1], outs[0]), act == DType::F32 ? 1e-5 : 1e-2);
  }
}

}  // namespace
}  // namespace linac::test_vq_attn_docs_gpu
