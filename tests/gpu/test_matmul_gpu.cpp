// Matmul cuBLASLt (and the skinny kernel for a few rows) vs the CPU reference (double) on the same
// rounded inputs: every transpose combination, bf16 -> bf16, bf16 -> f32 accumulation, f32 -> f32,
// strided rows, batches, odd sizes; nothing outside C's view written; the same call twice is
// bit-identical.
#include <cmath>
#include <cstring>
#include <limits>

#include "matmul/matmul.h"
#include "swiglu/swiglu.h"
#include "test_util.h"

namespace linac::test_matmul_gpu {
namespace {

// A stored [rows, cols] matrix (or [batch, rows, cols]) viewed inside a buffer `pad` columns
// wider, from column 1 when padded (so the view's pointer is only element-aligned). `gpu` holds
// it in the GPU dtype, `ref` the same rounded values in f64 on the host.
struct Operand {
  OwnedTensor gpu, ref;
  Tensor gpu_view, ref_view;
};

// Fills the view with random values and the padding with `pad_value`.
Operand make_operand(int64_t batch, int64_t rows, int64_t cols, int64_t pad, DType dt, uint64_t seed,
                     double pad_value = std::numeric_limits<double>::quiet_NaN()) {
  std::vector<int64_t> dims = {rows, cols + pad};
  if (batch > 0) dims.insert(dims.begin(), batch);
  const int d = batch > 0 ? 2 : 1;
  const int64_t off = pad > 0 ? 1 : 0;
  OwnedTensor host = test::random_tensor(dims, DType::F64, seed);
  double* h = host->data<double>();
  for (int64_t i = 0; i < host->numel(); ++i) {
    const int64_t col = i % (cols + pad);
    if (col < off || col >= off + cols) h[i] = pad_value;
  }
  Operand o;
  o.gpu = to(host, Device::CUDA, dt);
  o.ref = to(o.gpu, Device::CPU, DType::F64);
  o.gpu_view = o.gpu->narrow(d, off, cols);
  o.ref_view = o.ref->narrow(d, off, cols);
  return o;
}

struct Case {
  int64_t m, n, k;
  int64_t batch = 0;  // 0: 2-D matmul
  int64_t pad = 0;
  float alpha = 1.f, beta = 0.f;
};

// Output rounding dominates bf16 C; bf16 x bf16 products are exact in fp32, so bf16 -> f32
// differs from the reference only by fp32 accumulation (tensor cores may truncate a little, hence
// more slack than for pure f32), which still exposes any bf16 rounding of the output (~4e-3).
// f32 -> f32 at 1e-5 also exposes TF32 (~1e-3).
double tolerance(DType ab, DType c) {
  if (c == DType::BF16) return 1e-2;
  return ab == DType::BF16 ? 1e-4 : 1e-5;
}

// Compares C's whole buffers (n columns in rows pad wider): the view must match the reference,
// the padding must still be NaN.
void expect_c_matches(const Operand& c, int64_t n, int64_t pad, double tol) {
  const std::vector<double> got = to_doubles(c.gpu), want = to_doubles(c.ref);
  std::vector<double> got_view, want_view;
  const int64_t width = n + pad, off = pad > 0 ? 1 : 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t col = static_cast<int64_t>(i) % width;
    if (col >= off && col < off + n) {
      got_view.push_back(got[i]);
      want_view.push_back(want[i]);
    } else {
      ASSERT_TRUE(std::isnan(got[i])) << "wrote outside C at " << i;
    }
  }
  ASSERT_TRUE(test::all_finite(got_view));
  EXPECT_LT(test::rel_error(got_view, want_view), tol);
}

void check_case(const Case& cs, DType ab, DType cdt) {
  GpuContext gctx;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "M=" << cs.m << " N=" << cs.n << " K=" << cs.k << " batch=" << cs.batch
                                        << " pad=" << cs.pad << " alpha=" << cs.alpha << " beta=" << cs.beta
                                        << " ta=" << ta << " tb=" << tb << " A/B " << dtype_name(ab) << " C "
                                        << dtype_name(cdt));
      Operand a = make_operand(cs.batch, ta ? cs.k : cs.m, ta ? cs.m : cs.k, cs.pad, ab, 1);
      Operand b = make_operand(cs.batch, tb ? cs.n : cs.k, tb ? cs.k : cs.n, cs.pad, ab, 2);
      // beta = 0: C starts all NaN and must not be read.
      Operand c = make_operand(cs.batch, cs.m, cs.n, cs.pad, cdt, 3);
      if (cs.beta == 0.f) test::poison(c.gpu);
      if (cs.batch > 0) {
        matmul_batched(gctx.ctx(), a.gpu_view, ta, b.gpu_view, tb, c.gpu_view, cs.alpha, cs.beta);
        matmul_batched(Ctx{}, a.ref_view, ta, b.ref_view, tb, c.ref_view, cs.alpha, cs.beta);
      } else {
        matmul(gctx.ctx(), a.gpu_view, ta, b.gpu_view, tb, c.gpu_view, cs.alpha, cs.beta);
        matmul(Ctx{}, a.ref_view, ta, b.ref_view, tb, c.ref_view, cs.alpha, cs.beta);
      }
      gctx.synchronize();
      expect_c_matches(c, cs.n, cs.pad, tolerance(ab, cdt));
    }
}

const Case kOddSizes[] = {{7, 129, 37}, {1, 1, 1}, {13, 16, 1}, {1, 300, 9}, {97, 131, 513}, {256, 512, 384}};

TEST(MatmulGpu, Bf16ToBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Case& cs : kOddSizes) check_case(cs, DType::BF16, DType::BF16);
}

TEST(MatmulGpu, Bf16ToF32Accumulate) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Case& cs : kOddSizes) check_case({cs.m, cs.n, cs.k, 0, 0, 1.f, 1.f}, DType::BF16, DType::F32);
  check_case({7, 129, 37, 0, 0, 1.f, 0.f}, DType::BF16, DType::F32);
}

TEST(MatmulGpu, F32ToF32) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Case& cs : kOddSizes) check_case(cs, DType::F32, DType::F32);
}

TEST(MatmulGpu, AlphaBeta) {
  LINAC_SKIP_WITHOUT_GPU();
  for (DType ab : {DType::BF16, DType::F32}) {
    check_case({23, 40, 300, 0, 0, 0.5f, 0.f}, ab, DType::F32);
    check_case({23, 40, 300, 0, 0, 2.f, -0.75f}, ab, DType::F32);
  }
  check_case({23, 40, 300, 0, 0, -1.5f, 1.f}, DType::BF16, DType::BF16);
}

TEST(MatmulGpu, StridedRowViews) {
  LINAC_SKIP_WITHOUT_GPU();
  check_case({7, 129, 37, 0, 3}, DType::BF16, DType::BF16);
  check_case({50, 33, 260, 0, 5, 1.f, 1.f}, DType::BF16, DType::F32);
  check_case({64, 128, 64, 0, 8}, DType::F32, DType::F32);
}

TEST(MatmulGpu, Batched) {
  LINAC_SKIP_WITHOUT_GPU();
  check_case({7, 129, 37, 3}, DType::BF16, DType::BF16);
  check_case({19, 20, 21, 4, 2, 0.5f, 1.f}, DType::BF16, DType::F32);
  check_case({64, 64, 128, 5, 0}, DType::F32, DType::F32);
}

TEST(MatmulGpu, BatchedBroadcastsZeroBatchStride) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t batch = 3, m = 11, n = 17, k = 29;
  OwnedTensor a = to(test::random_tensor({batch, m, k}, DType::F64, 4), Device::CUDA, DType::BF16);
  OwnedTensor w = to(test::random_tensor({n, k}, DType::F64, 5), Device::CUDA, DType::BF16);
  Tensor wb = w.t;  // [batch, n, k] view of one matrix
  wb.ndim = 3;
  wb.shape = {batch, n, k};
  wb.strides = {0, k, 1};
  OwnedTensor c(DType::F32, Device::CUDA, {batch, m, n}), cb(DType::F32, Device::CUDA, {m, n});
  test::poison(c);
  matmul_batched(gctx.ctx(), a, false, wb, true, c);
  for (int64_t bi = 0; bi < batch; ++bi) {
    matmul(gctx.ctx(), a->select(0, bi), false, w, true, cb);
    gctx.synchronize();
    OwnedTensor a_ref = to(a->select(0, bi), Device::CPU, DType::F64), w_ref = to(w, Device::CPU, DType::F64);
    OwnedTensor c_ref(DType::F64, Device::CPU, {m, n});
    matmul(Ctx{}, a_ref, false, w_ref, true, c_ref);
    EXPECT_LT(test::rel_error(c->select(0, bi), c_ref), 1e-4) << "batch " << bi;
    EXPECT_LT(test::rel_error(cb, c_ref), 1e-4) << "batch " << bi;
  }
}

// A few rows against a weight, as decoding multiplies (matmul_skinny.cu): M from 1 to
// kSkinnyMaxRows (8- and 16-row tiles), K a multiple of 8 but not of a warp's 32-value chunk (and
// A past 100 KB of shared memory), N not a multiple of a tile's 8 columns, with 1, 2 and 4 tiles
// per CTA; C bf16 and f32 with alpha and beta; A with a row stride past K (NaN between rows);
// bitwise reruns.
TEST(MatmulGpu, SkinnyRows) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& sh : {Shape{1, 129, 264}, Shape{2, 2304, 768}, Shape{1, 5, 2056}, Shape{2, 770, 8},
                          Shape{2, 7, 8200}, Shape{1, 32000, 768}, Shape{3, 100, 776}, Shape{8, 2304, 768},
                          Shape{9, 8200, 200}, Shape{12, 33, 40}, Shape{16, 16400, 520}, Shape{16, 770, 5632}}) {
    OwnedTensor a(DType::BF16, Device::CUDA, {sh.m, sh.k}), w(DType::BF16, Device::CUDA, {sh.n, sh.k});
    OwnedTensor c(DType::F32, Device::CUDA, {sh.m, sh.n});
    GemmProblem p;
    p.m = sh.m, p.n = sh.n, p.k = sh.k, p.trans_b = true, p.lda = sh.k, p.ldb = sh.k, p.ldc = sh.n;
    ASSERT_TRUE(matmul_skinny_applies(p, a, w, c)) << "M=" << sh.m << " N=" << sh.n << " K=" << sh.k;
    check_case({sh.m, sh.n, sh.k}, DType::BF16, DType::BF16);
    check_case({sh.m, sh.n, sh.k, 0, 0, 0.5f, 1.f}, DType::BF16, DType::F32);
    check_case({sh.m, sh.n, sh.k, 0, 0, 2.f, -0.75f}, DType::BF16, DType::BF16);
  }
  {
    // A's rows 8 elements apart past K (still 16-byte aligned, so the skinny kernel takes it),
    // NaN in the gap: nothing past K may be read.
    const int64_t m = 11, n = 300, k = 136;
    OwnedTensor host = test::random_tensor({m, k + 8}, DType::F64, 41);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = k; j < k + 8; ++j) host->data<double>()[r * (k + 8) + j] = std::nan("");
    OwnedTensor a = to(host, Device::CUDA, DType::BF16);
    OwnedTensor w = to(test::random_tensor({n, k}, DType::F64, 42), Device::CUDA, DType::BF16);
    OwnedTensor c(DType::F32, Device::CUDA, {m, n}), c_ref(DType::F64, Device::CPU, {m, n});
    const Tensor a_view = a->narrow(1, 0, k);
    GemmProblem p;
    p.m = m, p.n = n, p.k = k, p.trans_b = true, p.lda = k + 8, p.ldb = k, p.ldc = n;
    ASSERT_TRUE(matmul_skinny_applies(p, a_view, w, c));
    matmul(gctx.ctx(), a_view, false, w, true, c);
    gctx.synchronize();
    OwnedTensor a_ref = to(a, Device::CPU, DType::F64), w_ref = to(w, Device::CPU, DType::F64);
    matmul(Ctx{}, a_ref->narrow(1, 0, k), false, w_ref, true, c_ref);
    EXPECT_LT(test::rel_error(c, c_ref), 1e-4);
  }
  for (int64_t m : {2, 16}) {
    SCOPED_TRACE(::testing::Message() << "rerun, M=" << m);
    OwnedTensor a = to(test::random_tensor({m, 768}, DType::F64, 31), Device::CUDA, DType::BF16);
    OwnedTensor w = to(test::random_tensor({2304, 768}, DType::F64, 32), Device::CUDA, DType::BF16);
    OwnedTensor c1(DType::BF16, Device::CUDA, {m, 2304}), c2(DType::BF16, Device::CUDA, {m, 2304});
    matmul(gctx.ctx(), a, false, w, true, c1);
    matmul(gctx.ctx(), a, false, w, true, c2);
    gctx.synchronize();
    EXPECT_EQ(test::bf16_bits(c1), test::bf16_bits(c2));
  }
}

// Decoding launches the skinny kernel as a dependent launch (Ctx::dependent_launches): it may
// start while the kernel ahead still writes its A. A chain of products, each reading the one
// before, must give bitwise what ordinary launches give.
TEST(MatmulGpu, SkinnyChainUnderDependentLaunches) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  Ctx dependent = gctx.ctx();
  dependent.dependent_launches = gpu_compute_capability() >= 90;
  const int64_t m = 5, d = 1024, links = 12;
  std::vector<OwnedTensor> w;
  for (int64_t i = 0; i < links; ++i)
    w.push_back(to(test::random_tensor({d, d}, DType::F64, 50 + static_cast<uint64_t>(i)), Device::CUDA, DType::BF16));
  auto chain = [&](const Ctx& ctx) {
    std::vector<OwnedTensor> x;
    x.push_back(to(test::random_tensor({m, d}, DType::F64, 49), Device::CUDA, DType::BF16));
    for (int64_t i = 0; i < links; ++i) {
      x.emplace_back(DType::BF16, Device::CUDA, std::vector<int64_t>{m, d});
      matmul(ctx, x[i], false, w[i], true, x.back(), 1.0 / 16);
    }
    gctx.synchronize();
    return test::bf16_bits(x.back());
  };
  const auto ordered = chain(gctx.ctx());
  EXPECT_EQ(chain(dependent), ordered);
  EXPECT_EQ(chain(dependent), ordered);
}

// Decoding's MLP output in one launch (matmul_skinny_glu) is bitwise swiglu_fwd followed by
// matmul: both gate activations, 8- and 16-row tiles, F not a multiple of a warp's 32-value chunk,
// gates far enough out to saturate the sigmoid. Problems it does not take are refused.
TEST(MatmulGpu, SkinnyGluIsSwigluThenMatmul) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  struct Shape {
    int64_t m, n, f;
  };
  for (GluAct act : {GluAct::Silu, GluAct::Identity})
    for (const Shape& sh : {Shape{1, 300, 136}, Shape{7, 768, 2048}, Shape{16, 2100, 520}}) {
      SCOPED_TRACE(::testing::Message() << "M=" << sh.m << " N=" << sh.n << " F=" << sh.f << " silu="
                                        << (act == GluAct::Silu));
      OwnedTensor h = to(test::random_tensor({sh.m, 2 * sh.f}, DType::F64, 61, -12, 12), Device::CUDA, DType::BF16);
      OwnedTensor w = to(test::random_tensor({sh.n, sh.f}, DType::F64, 62), Device::CUDA, DType::BF16);
      OwnedTensor a(DType::BF16, Device::CUDA, {sh.m, sh.f});
      OwnedTensor fused(DType::BF16, Device::CUDA, {sh.m, sh.n}), composite(DType::BF16, Device::CUDA, {sh.m, sh.n});
      ASSERT_TRUE(matmul_skinny_glu_applies(h, w, fused));
      matmul_skinny_glu(gctx.ctx(), h, w, fused, act);
      swiglu_fwd(gctx.ctx(), h, a, act);
      matmul(gctx.ctx(), a, false, w, true, composite);
      gctx.synchronize();
      EXPECT_EQ(test::bf16_bits(fused), test::bf16_bits(composite));
    }
  OwnedTensor h(DType::BF16, Device::CUDA, {4, 272}), w(DType::BF16, Device::CUDA, {64, 136});
  OwnedTensor c32(DType::F32, Device::CUDA, {4, 64}), h17(DType::BF16, Device::CUDA, {17, 272});
  OwnedTensor c17(DType::BF16, Device::CUDA, {17, 64}), w_odd(DType::BF16, Device::CUDA, {64, 135});
  OwnedTensor h_odd(DType::BF16, Device::CUDA, {4, 270}), c(DType::BF16, Device::CUDA, {4, 64});
  EXPECT_FALSE(matmul_skinny_glu_applies(h, w, c32)) << "C must be bf16";
  EXPECT_FALSE(matmul_skinny_glu_applies(h17, w, c17)) << "at most kSkinnyMaxRows rows";
  EXPECT_FALSE(matmul_skinny_glu_applies(h_odd, w_odd, c)) << "F must be a multiple of 8";
  EXPECT_TRUE(matmul_skinny_glu_applies(h, w, c));
}

// Shapes where cuBLASLt is likely to split K (small M x N, deep K) and a large one; the
// weight-gradient path accumulates into f32 from the same start both times.
TEST(MatmulGpu, SameCallTwiceIsBitIdentical) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  struct Shape {
    int64_t m, n, k;
    bool ta, tb;
    DType ab, c;
    float beta;
  };
  for (const Shape& s : {Shape{64, 64, 16384, true, false, DType::BF16, DType::F32, 1.f},
                         Shape{64, 64, 16384, false, true, DType::BF16, DType::BF16, 0.f},
                         Shape{4096, 1024, 1024, false, true, DType::BF16, DType::BF16, 0.f},
                         Shape{1024, 768, 4096, true, false, DType::BF16, DType::F32, 1.f},
                         Shape{96, 80, 8192, false, false, DType::F32, DType::F32, 0.f}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k);
    OwnedTensor a = to(test::random_tensor(s.ta ? std::vector<int64_t>{s.k, s.m} : std::vector<int64_t>{s.m, s.k},
                                           DType::F64, 21),
                       Device::CUDA, s.ab);
    OwnedTensor b = to(test::random_tensor(s.tb ? std::vector<int64_t>{s.n, s.k} : std::vector<int64_t>{s.k, s.n},
                                           DType::F64, 22),
                       Device::CUDA, s.ab);
    OwnedTensor c0 = test::random_tensor({s.m, s.n}, s.c, 23);
    std::vector<OwnedTensor> outs;
    for (int rep = 0; rep < 2; ++rep) {
      outs.push_back(to(c0, Device::CUDA, s.c));
      matmul(gctx.ctx(), a, s.ta, b, s.tb, outs.back(), 1.f, s.beta);
    }
    gctx.synchronize();
    OwnedTensor h0 = to(outs[0], Device::CPU, s.c), h1 = to(outs[1], Device::CPU, s.c);
    EXPECT_EQ(std::memcmp(h0->ptr, h1->ptr, h0->nbytes()), 0);
  }
}

TEST(MatmulGpu, BiasEpilogue) {
  // cuBLASLt's bias epilogue against the CPU's product + bias on the same rounded inputs: the
  // linear layer's call (A [M, K], W [N, K]) at odd sizes and a model-like shape, bf16 and f32; a
  // strided C keeps its padding; a row count the skinny kernel would take still gets the bias.
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  struct Shape {
    int64_t m, n, k, pad;
    DType dt;
  };
  for (const Shape& s :
       {Shape{97, 136, 72, 0, DType::BF16}, Shape{2048, 768, 1024, 0, DType::BF16}, Shape{50, 40, 264, 8, DType::BF16},
        Shape{3, 64, 128, 0, DType::BF16}, Shape{97, 132, 36, 0, DType::F32}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " pad=" << s.pad << " "
                                      << dtype_name(s.dt));
    Operand a = make_operand(0, s.m, s.k, 0, s.dt, 31);
    Operand w = make_operand(0, s.n, s.k, 0, s.dt, 32);
    Operand c = make_operand(0, s.m, s.n, s.pad, s.dt, 33);
    OwnedTensor bias_gpu = to(test::random_tensor({s.n}, DType::F64, 34), Device::CUDA, s.dt);
    OwnedTensor bias_ref = to(bias_gpu, Device::CPU, DType::F64);
    test::poison(c.gpu);
    matmul_bias(gctx.ctx(), a.gpu_view, false, w.gpu_view, true, bias_gpu, c.gpu_view);
    matmul_bias(Ctx{}, a.ref_view, false, w.ref_view, true, bias_ref, c.ref_view);
    gctx.synchronize();
    expect_c_matches(c, s.n, s.pad, tolerance(s.dt, s.dt));
  }
}

TEST(MatmulGpu, AddendFromAnotherBuffer) {
  // matmul_add with C_in a buffer of its own (cuBLASLt's C pointer apart from D), as the model's
  // output projections add the residual stream: against the CPU's product + C_in on the same
  // rounded inputs, bf16 -> bf16 and bf16 -> f32, with and without the bias epilogue, at odd sizes,
  // a model-like shape and a row count the skinny kernel would take otherwise; C_in unchanged, C's
  // padding untouched.
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  struct Shape {
    int64_t m, n, k, pad;
    DType c;
    bool bias;
  };
  for (const Shape& s : {Shape{97, 136, 72, 0, DType::BF16, false}, Shape{4096, 768, 1024, 0, DType::BF16, false},
                         Shape{50, 40, 264, 8, DType::BF16, false}, Shape{3, 64, 128, 0, DType::BF16, false},
                         Shape{97, 132, 40, 0, DType::F32, false}, Shape{97, 136, 72, 8, DType::BF16, true}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " pad=" << s.pad << " C "
                                      << dtype_name(s.c) << (s.bias ? " bias" : ""));
    Operand a = make_operand(0, s.m, s.k, 0, DType::BF16, 41);
    Operand w = make_operand(0, s.n, s.k, 0, DType::BF16, 42);
    Operand c = make_operand(0, s.m, s.n, s.pad, s.c, 43);
    Operand c_in = make_operand(0, s.m, s.n, s.pad, s.c, 44);
    const std::vector<double> in0 = to_doubles(c_in.gpu);
    test::poison(c.gpu);
    if (s.bias) {
      OwnedTensor bias_gpu = to(test::random_tensor({s.n}, DType::F64, 45), Device::CUDA, s.c);
      OwnedTensor bias_ref = to(bias_gpu, Device::CPU, DType::F64);
      matmul_bias(gctx.ctx(), a.gpu_view, false, w.gpu_view, true, bias_gpu, c.gpu_view, c_in.gpu_view);
      matmul_bias(Ctx{}, a.ref_view, false, w.ref_view, true, bias_ref, c.ref_view, c_in.ref_view);
    } else {
      matmul_add(gctx.ctx(), a.gpu_view, false, w.gpu_view, true, c_in.gpu_view, c.gpu_view);
      matmul_add(Ctx{}, a.ref_view, false, w.ref_view, true, c_in.ref_view, c.ref_view);
    }
    gctx.synchronize();
    expect_c_matches(c, s.n, s.pad, tolerance(DType::BF16, s.c));
    const std::vector<double> in1 = to_doubles(c_in.gpu);
    for (size_t i = 0; i < in0.size(); ++i)
      if (!std::isnan(in0[i])) ASSERT_EQ(in1[i], in0[i]) << "C_in changed at " << i;
  }
}

TEST(MatmulGpu, RejectsUnsupportedDtypes) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  OwnedTensor a32(DType::F32, Device::CUDA, {4, 5}), b32(DType::F32, Device::CUDA, {5, 3});
  OwnedTensor b16(DType::BF16, Device::CUDA, {5, 3}), c16(DType::BF16, Device::CUDA, {4, 3});
  OwnedTensor c_host(DType::F32, Device::CPU, {4, 3});
  EXPECT_THROW(matmul(gctx.ctx(), a32, false, b16, false, c16), Error);     // mixed A/B
  EXPECT_THROW(matmul(gctx.ctx(), a32, false, b32, false, c16), Error);     // f32 -> bf16
  EXPECT_THROW(matmul(gctx.ctx(), a32, false, b32, false, c_host), Error);  // C on the host
}

}  // namespace
}  // namespace linac::test_matmul_gpu
