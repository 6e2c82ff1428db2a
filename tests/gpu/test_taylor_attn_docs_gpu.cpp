// Taylor attention with document bounds, CUDA vs the CPU chunked reference (double, same bounds) on
// the same rounded inputs, f32 and bf16: forward (o, den, the final state = the last document's)
// and backward (dq, dk, dv), q/k/v and dq/dk/dv strided views of fused buffers. Documents of one
// token, shorter than a chunk (64), starting exactly on chunk boundaries and just after them,
// spanning chunks, a row that is one document; T = 4500 spans three scan segments of 32 chunks:
// a document starting exactly at a segment's first token, a segment without any start (its carry
// passes through), starts in a segment's last chunk. Pair groups (a small workspace) give the
// same bits. The bounds must change the result. The bf16 checks run through each kernel family
// (taylor_attn_families.h): the fused kernels' document instances and the launches.

#include <algorithm>

#include "taylor_attn/taylor_attn.h"
#include "taylor_attn_families.h"
#include "test_util.h"

namespace linac::test_taylor_attn_docs_gpu {
namespace {

constexpr int64_t kF = 16;

struct Case {
  int64_t H, Dv;
  std::vector<std::vector<int64_t>> layouts;  // documents per row
};

std::string name(const Case& c) {
  int64_t T = 0;
  for (int64_t l : c.layouts[0]) T += l;
  return "B=" + std::to_string(c.layouts.size()) + " T=" + std::to_string(T) + " H=" + std::to_string(c.H) +
         " Dv=" + std::to_string(c.Dv);
}

const Case kCases[] = {
    {2, 64, {{1, 63, 64, 5, 67}, {200}, {17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13}, {130, 1, 1, 68}}},
    {3, 48, {{1, 1, 75}, {64, 1, 12}, {30, 47}}},
    {1, 128, {{65, 63, 1, 1, 70}, {199, 1}}},
    // Segments start at 2048 and 4096: row 0 restarts exactly at 2048 and in segment 2's chunks;
    // row 1's segment 1 holds no start (the carry of segment 0 flows through it), row 2 restarts
    // in the last chunk of segment 0 and just after 4096.
    {1, 64, {{1000, 1048, 2000, 400, 52}, {100, 4300, 100}, {2000, 50, 2047, 1, 402}}},
};

struct Result {
  OwnedTensor o, den, sf, dqkv;
};

Result run(const Ctx& ctx, const Case& c, const Tensor& qkv, const Tensor& dout, DType act, DType stat,
           const DocBounds& docs, const Tensor& saved_carries = Tensor()) {
  const Device dev = ctx.device;
  const int64_t B = qkv.size(0), T = qkv.size(1);
  Result r{OwnedTensor(act, dev, {B, T, c.H, c.Dv}), OwnedTensor(stat, dev, {B, c.H, T}),
           OwnedTensor(stat, dev, {B, c.H, taylor_attn_state_rows(kF), c.Dv + 1}), OwnedTensor(act, dev, qkv.dims())};
  for (const Tensor* t : {&r.o.t, &r.den.t, &r.sf.t, &r.dqkv.t}) test::poison(*t);
  TaylorAttnOpts opts;
  opts.docs = docs;
  opts.saved_carries = saved_carries;
  const Tensor q = test::bthd(qkv, 0, c.H, kF), k = test::bthd(qkv, c.H * kF, c.H, kF),
               v = test::bthd(qkv, 2 * c.H * kF, c.H, c.Dv);
  taylor_attn_fwd(ctx, q, k, v, r.o, r.den, r.sf, opts);
  taylor_attn_bwd(ctx, q, k, v, r.o, r.den, dout, test::bthd(r.dqkv, 0, c.H, kF), test::bthd(r.dqkv, c.H * kF, c.H, kF),
                  test::bthd(r.dqkv, 2 * c.H * kF, c.H, c.Dv), opts);
  ctx_synchronize(ctx);
  return r;
}

struct Inputs {
  OwnedTensor bounds, bounds_g, qkv, dout;
  int64_t B, T, W;
  Inputs(const Case& c, uint64_t seed)
      : bounds(test::doc_bounds_of(c.layouts)),
        bounds_g(to(bounds, Device::CUDA, DType::I32)),
        B(bounds->size(1)),
        T(bounds->size(2)),
        W((c.H * (2 * kF + c.Dv) + 7) / 8 * 8 + 8) {
    qkv = test::random_tensor({B, T, W}, DType::F64, seed, -1.5, 1.5);
    dout = test::random_tensor({B, T, c.H, c.Dv}, DType::F64, seed + 1);
  }
};

void run_parity(DType act, double tol_o, double tol_grad) {
  GpuContext gctx;
  for (const char* family : test::taylor_families(act))
    for (const Case& c : kCases) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      SCOPED_TRACE(name(c) + " LINAC_TAYLOR_KERNELS=" + family);
      const Inputs in(c, 1);
      const OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
      const Result gr = run(gctx.ctx(), c, qkv_g, dout_g, act, DType::F32, test::doc_view(in.bounds_g));
      const OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
      const Result cr = run(Ctx{}, c, qkv_r, dout_r, DType::F64, DType::F64, test::doc_view(in.bounds));
      const int64_t HK = c.H * kF, HV = c.H * c.Dv;
      auto cols = [&](const Result& r, int64_t c0, int64_t n) { return test::columns(r.dqkv, c0, n); };
      EXPECT_LT(test::rel_error(gr.o, cr.o), tol_o) << "o";
      EXPECT_LT(test::rel_error(gr.den, cr.den), tol_o) << "den";
      EXPECT_LT(test::rel_error(gr.sf, cr.sf), tol_o) << "final state";
      EXPECT_LT(test::rel_error(cols(gr, 0, HK), cols(cr, 0, HK)), tol_grad) << "dq";
      EXPECT_LT(test::rel_error(cols(gr, HK, HK), cols(cr, HK, HK)), tol_grad) << "dk";
      EXPECT_LT(test::rel_error(cols(gr, 2 * HK, HV), cols(cr, 2 * HK, HV)), tol_grad) << "dv";
      // The bounds matter, by far more than the tolerances.
      const Result stream = run(Ctx{}, c, qkv_r, dout_r, DType::F64, DType::F64, DocBounds{});
      EXPECT_GT(test::rel_error(stream.o, cr.o), 5 * tol_o) << "o without bounds";
      EXPECT_GT(test::rel_error(stream.sf, cr.sf), 5 * tol_o) << "final state without bounds";
      EXPECT_GT(test::rel_error(cols(stream, HK, HK), cols(cr, HK, HK)), 5 * tol_grad) << "dk without bounds";
    }
}

TEST(TaylorAttnDocsGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 1e-5, 1e-5);
}

TEST(TaylorAttnDocsGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2, 2e-2);
}

// Pairs in groups (a workspace of three pairs; the bounds are read per batch row of each pair)
// give the bits of one group, and so does a backward that reads the forward's saved carries
// (T = 2300: two segments; the buffer poisoned before the forward), as the Based layer runs it.
TEST(TaylorAttnDocsGpu, GroupedEqualsOneGroup) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case c{3, 64, {{1, 63, 64, 5, 67, 2100}, {2300}, {2047, 1, 1, 251}}};
  const Inputs in(c, 5);
  for (DType act : {DType::BF16, DType::F32})
    for (const char* family : test::taylor_families(act)) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      SCOPED_TRACE(std::string(dtype_name(act)) + " LINAC_TAYLOR_KERNELS=" + family);
      const OwnedTensor qkv_g = to(in.qkv, Device::CUDA, act), dout_g = to(in.dout, Device::CUDA, act);
      const Result r1 = run(gctx.ctx(), c, qkv_g, dout_g, act, DType::F32, test::doc_view(in.bounds_g));
      Ctx small = gctx.ctx();
      small.workspace_bytes = test::taylor_family_workspace(family, in.T, 3, kF, c.Dv, act);
      const Result r2 = run(small, c, qkv_g, dout_g, act, DType::F32, test::doc_view(in.bounds_g));
      const size_t carries = taylor_attn_saved_carries_bytes(in.B, in.T, c.H, kF, c.Dv, act);
      EXPECT_EQ(carries > 0, act == DType::BF16);
      OwnedTensor saved(DType::F32, Device::CUDA, {std::max<int64_t>(1, carries / sizeof(float))});
      test::poison(saved);
      const Result r3 = run(small, c, qkv_g, dout_g, act, DType::F32, test::doc_view(in.bounds_g), saved);
      for (const Result* r : {&r2, &r3}) {
        EXPECT_TRUE(test::same_bits(r1.o, r->o));
        EXPECT_TRUE(test::same_bits(r1.den, r->den));
        EXPECT_TRUE(test::same_bits(r1.sf, r->sf));
        EXPECT_TRUE(test::same_bits(r1.dqkv, r->dqkv));
      }
    }
}

// One document per row is the stream, bit for bit, in every kernel family and at any length: the
// only restart is at the first chunk, whose state is zero anyway, every row enters the states, and
// the row weights and masks multiply by one.
TEST(TaylorAttnDocsGpu, OneDocumentIsTheStream) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case cases[] = {
      {2, 64, {{1000}, {1000}}}, {3, 48, {{2048}}}, {1, 16, {{130}, {130}, {130}}}, {2, 64, {{2500}, {2500}}}};
  for (const char* family : test::taylor_families(DType::BF16))
    for (const Case& c : cases) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      SCOPED_TRACE(name(c) + " LINAC_TAYLOR_KERNELS=" + family);
      const Inputs in(c, 9);
      const OwnedTensor qkv_g = to(in.qkv, Device::CUDA, DType::BF16), dout_g = to(in.dout, Device::CUDA, DType::BF16);
      const Result docs = run(gctx.ctx(), c, qkv_g, dout_g, DType::BF16, DType::F32, test::doc_view(in.bounds_g));
      const Result stream = run(gctx.ctx(), c, qkv_g, dout_g, DType::BF16, DType::F32, DocBounds{});
      EXPECT_TRUE(test::same_bits(docs.o, stream.o)) << "o";
      EXPECT_TRUE(test::same_bits(docs.den, stream.den)) << "den";
      EXPECT_TRUE(test::same_bits(docs.sf, stream.sf)) << "final state";
      const int64_t n = c.H * (2 * kF + c.Dv);  // the q|k|v columns (the pad stays poisoned)
      EXPECT_TRUE(test::columns(docs.dqkv, 0, n) == test::columns(stream.dqkv, 0, n)) << "dq, dk, dv";
    }
}

// The fused kernels' document instances against the launches, many documents: the mma.sync walks
// (LINAC_TAYLOR_KERNELS=sm80) sum in the launches' order and mask the same way, so at one scan
// segment (T <= 2048) every output is the same bits; with more segments the carries enter in
// another order, and the wgmma walks round their own way: those agree to rounding.
TEST(TaylorAttnDocsGpu, FusedKernelsAreTheLaunches) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Case cases[] = {
      kCases[0], kCases[1], kCases[3], {3, 64, {{1, 63, 64, 5, 67, 2100}, {2300}, {2047, 1, 1, 251}}}};
  for (const Case& c : cases) {
    const Inputs in(c, 13);
    const OwnedTensor qkv_g = to(in.qkv, Device::CUDA, DType::BF16), dout_g = to(in.dout, Device::CUDA, DType::BF16);
    auto run_family = [&](const char* family) {
      const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", family);
      return run(gctx.ctx(), c, qkv_g, dout_g, DType::BF16, DType::F32, test::doc_view(in.bounds_g));
    };
    const Result launches = run_family("chunk");
    const int64_t n = c.H * (2 * kF + c.Dv);
    const std::vector<double> gl = test::columns(launches.dqkv, 0, n);
    for (const char* family : test::taylor_families(DType::BF16)) {
      if (std::string(family) == "chunk") continue;
      SCOPED_TRACE(name(c) + " LINAC_TAYLOR_KERNELS=" + family);
      const Result fused = run_family(family);
      const std::vector<double> gf = test::columns(fused.dqkv, 0, n);
      if (in.T <= 2048 && std::string(family) == "sm80") {
        EXPECT_TRUE(test::same_bits(fused.o, launches.o)) << "o";
        EXPECT_TRUE(test::same_bits(fused.den, launches.den)) << "den";
        EXPECT_TRUE(test::same_bits(fused.sf, launches.sf)) << "final state";
        EXPECT_TRUE(gf == gl) << "dq, dk, dv";
      } else {
        EXPECT_LT(test::rel_error(fused.o, launches.o), 1e-2) << "o";
        EXPECT_LT(test::rel_error(fused.den, launches.den), 1e-2) << "den";
        EXPECT_LT(test::rel_error(fused.sf, launches.sf), 1e-5) << "final state";
        EXPECT_LT(test::rel_error(gf, gl), 2e-2) << "dq, dk, dv";
      }
    }
  }
}

}  // namespace
}  // namespace linac::test_taylor_attn_docs_gpu
