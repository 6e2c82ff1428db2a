// The channel mixer's GEMMs with the gate (swiglu_linear.h) on the GPU, through every path this GPU
// has (fused_sm90 on Hopper, composite everywhere):
// - integer-valued operands, whose products and sums are exact in f32 and bf16, so h and da do not
//   depend on the summation order: h must equal the exact product bit for bit, and a and dh must be
//   bit for bit what swiglu_fwd / swiglu_bwd give for it;
// - random operands against the CPU in f64 (bf16 tolerance);
// - bit-identical reruns, and the path choice;
// - the backward's table of du u per 8 value columns (swiglu_value_dots' bits, on both paths);
// - the projection with SiLU on a column range (silu_linear_fwd);
// the fused kernels both in clusters of 2 (multicast weight stages) and of 1.
// Shapes are not multiples of the tiles (N, d, F), and one has more tiles than the GPU has SMs, so
// each persistent CTA runs several.
#include "activation/activation.h"
#include "matmul/matmul.h"
#include "swiglu/swiglu_linear.h"
#include "test_util.h"

namespace linac::test_swiglu_linear_gpu {
namespace {

struct Shape {
  int64_t n, d, f;
};
const Shape kShapes[] = {{300, 200, 200}, {64, 96, 136}, {4160, 136, 520}};

// LINAC_SWIGLU_KERNELS and LINAC_SWIGLU_CLUSTER.
struct Family {
  const char *kernels, *cluster;
};
const Family kFamilies[] = {{"auto", "2"}, {"auto", "1"}, {"sm80", "2"}};

struct Outputs {
  OwnedTensor h, a, dh, dots;
};

// Forward and backward through swiglu_linear on the GPU, bf16.
Outputs run_gpu(const Tensor& x, const Tensor& w_in, const Tensor& dy, const Tensor& w_out, GluAct act) {
  GpuContext gctx;
  const int64_t n = x.size(0), f = w_out.size(1);
  OwnedTensor xg = to(x, Device::CUDA, DType::BF16), wig = to(w_in, Device::CUDA, DType::BF16);
  OwnedTensor dyg = to(dy, Device::CUDA, DType::BF16), wog = to(w_out, Device::CUDA, DType::BF16);
  Outputs r{OwnedTensor(DType::BF16, Device::CUDA, {n, 2 * f}), OwnedTensor(DType::BF16, Device::CUDA, {n, f}),
            OwnedTensor(DType::BF16, Device::CUDA, {n, 2 * f}), OwnedTensor(DType::F32, Device::CUDA, {n, f / 8})};
  OwnedTensor da(DType::BF16, Device::CUDA, {n, f});
  test::poison(r.h);
  test::poison(r.a);
  test::poison(r.dh);
  test::poison(r.dots);
  swiglu_linear_fwd(gctx.ctx(), xg, wig, r.h, r.a, act);
  swiglu_linear_bwd(gctx.ctx(), dyg, wog, r.h, da, r.dh, act, r.dots);
  gctx.synchronize();
  return r;
}

TEST(SwigluLinearGpu, ExactProductsGiveTheGateOfThatProduct) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Family& family : kFamilies)
    for (GluAct act : {GluAct::Silu, GluAct::Identity})
      for (const Shape& s : kShapes) {
        SCOPED_TRACE(std::string(family.kernels) + " cluster " + family.cluster +
                     (act == GluAct::Silu ? " SiLU" : " identity") + " N " + std::to_string(s.n) + " d " +
                     std::to_string(s.d) + " F " + std::to_string(s.f));
        test::ScopedEnv choice("LINAC_SWIGLU_KERNELS", family.kernels), cluster("LINAC_SWIGLU_CLUSTER", family.cluster);
        // h and da are integers of at most d <= 256 in magnitude, exact in bf16.
        OwnedTensor x = test::small_integers({s.n, s.d}, 1), w_in = test::small_integers({2 * s.f, s.d}, 2);
        OwnedTensor dy = test::small_integers({s.n, s.d}, 3), w_out = test::small_integers({s.d, s.f}, 4);
        const Outputs r = run_gpu(x, w_in, dy, w_out, act);
        // Exact h and da on the CPU, then the gate by the GPU's elementwise kernels.
        OwnedTensor h(DType::F64, Device::CPU, {s.n, 2 * s.f}), da(DType::F64, Device::CPU, {s.n, s.f});
        matmul(Ctx{}, x, false, w_in, true, h);
        matmul(Ctx{}, dy, false, w_out, false, da);
        EXPECT_EQ(test::bf16_bits(r.h), test::bf16_bits(h));
        GpuContext gctx;
        OwnedTensor hg = to(h, Device::CUDA, DType::BF16), dag = to(da, Device::CUDA, DType::BF16);
        OwnedTensor a(DType::BF16, Device::CUDA, {s.n, s.f}), dh(DType::BF16, Device::CUDA, {s.n, 2 * s.f});
        swiglu_fwd(gctx.ctx(), hg, a, act);
        swiglu_bwd(gctx.ctx(), hg, dag, dh, act);
        gctx.synchronize();
        EXPECT_EQ(test::bf16_bits(r.a), test::bf16_bits(a));
        EXPECT_EQ(test::bf16_bits(r.dh), test::bf16_bits(dh));
        // The table from the same dh: the GPU op and the CPU (f32 fused multiply-adds in one order).
        OwnedTensor dots(DType::F32, Device::CUDA, {s.n, s.f / 8}), dots_cpu(DType::F32, Device::CPU, {s.n, s.f / 8});
        swiglu_value_dots(gctx.ctx(), hg, r.dh, dots);
        gctx.synchronize();
        swiglu_value_dots(Ctx{}, to(hg, Device::CPU, DType::F64), to(r.dh, Device::CPU, DType::F64), dots_cpu);
        EXPECT_TRUE(test::same_bits(r.dots, dots));
        EXPECT_TRUE(test::same_bits(to(r.dots, Device::CPU, DType::F32), dots_cpu));
      }
}

TEST(SwigluLinearGpu, RandomOperandsMatchCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Family& family : kFamilies)
    for (GluAct act : {GluAct::Silu, GluAct::Identity})
      for (const Shape& s : kShapes) {
        SCOPED_TRACE(std::string(family.kernels) + " cluster " + family.cluster +
                     (act == GluAct::Silu ? " SiLU" : " identity") + " N " + std::to_string(s.n) + " F " +
                     std::to_string(s.f));
        test::ScopedEnv choice("LINAC_SWIGLU_KERNELS", family.kernels), cluster("LINAC_SWIGLU_CLUSTER", family.cluster);
        // Operands rounded to bf16 first, so the CPU sees what the GPU sees.
        auto rounded = [](OwnedTensor t) { return to(to(t, Device::CPU, DType::BF16), Device::CPU, DType::F64); };
        OwnedTensor x = rounded(test::random_tensor({s.n, s.d}, DType::F64, 5, -2, 2));
        OwnedTensor w_in = rounded(test::random_tensor({2 * s.f, s.d}, DType::F64, 6, -0.2, 0.2));
        OwnedTensor dy = rounded(test::random_tensor({s.n, s.d}, DType::F64, 7));
        OwnedTensor w_out = rounded(test::random_tensor({s.d, s.f}, DType::F64, 8, -0.2, 0.2));
        const Outputs r = run_gpu(x, w_in, dy, w_out, act);
        OwnedTensor h(DType::F64, Device::CPU, {s.n, 2 * s.f}), a(DType::F64, Device::CPU, {s.n, s.f});
        OwnedTensor da(DType::F64, Device::CPU, {s.n, s.f}), dh(DType::F64, Device::CPU, {s.n, 2 * s.f});
        swiglu_linear_fwd(Ctx{}, x, w_in, h, a, act);
        // The GPU's gate sees its own bf16 h: compare dh against the CPU's gate of that h.
        OwnedTensor hr = to(r.h, Device::CPU, DType::F64);
        swiglu_linear_bwd(Ctx{}, dy, w_out, hr, da, dh, act);
        EXPECT_LT(test::rel_error(r.h, h), 5e-3);
        EXPECT_LT(test::rel_error(r.a, a), 1e-2);
        EXPECT_LT(test::rel_error(r.dh, dh), 1e-2);
      }
}

TEST(SwigluLinearGpu, RerunsAreBitIdentical) {
  LINAC_SKIP_WITHOUT_GPU();
  const Shape s = kShapes[2];
  OwnedTensor x = test::random_tensor({s.n, s.d}, DType::F64, 9),
              w_in = test::random_tensor({2 * s.f, s.d}, DType::F64, 10);
  OwnedTensor dy = test::random_tensor({s.n, s.d}, DType::F64, 11),
              w_out = test::random_tensor({s.d, s.f}, DType::F64, 12);
  const Outputs r1 = run_gpu(x, w_in, dy, w_out, GluAct::Silu), r2 = run_gpu(x, w_in, dy, w_out, GluAct::Silu);
  EXPECT_EQ(test::bf16_bits(r1.h), test::bf16_bits(r2.h));
  EXPECT_EQ(test::bf16_bits(r1.a), test::bf16_bits(r2.a));
  EXPECT_EQ(test::bf16_bits(r1.dh), test::bf16_bits(r2.dh));
  EXPECT_TRUE(test::same_bits(r1.dots, r2.dots));
  // The cluster size changes which CTA loads what, never a sum's order: the same bits.
  test::ScopedEnv single("LINAC_SWIGLU_CLUSTER", "1");
  const Outputs r3 = run_gpu(x, w_in, dy, w_out, GluAct::Silu);
  EXPECT_EQ(test::bf16_bits(r1.h), test::bf16_bits(r3.h));
  EXPECT_EQ(test::bf16_bits(r1.a), test::bf16_bits(r3.a));
  EXPECT_EQ(test::bf16_bits(r1.dh), test::bf16_bits(r3.dh));
  EXPECT_TRUE(test::same_bits(r1.dots, r3.dots));
}

// The projection with SiLU from column c0 on (silu_linear_fwd): with integer operands the product
// is exact, so y must be it bit for bit and a must be what silu_fwd gives for it; with random
// operands the CPU in f64. c0 = 0, inside a tile (8, 136); M not a multiple of the tile's 256
// columns.
struct SiluShape {
  int64_t n, d, m, c0;
};
const SiluShape kSiluShapes[] = {{300, 200, 200, 0}, {64, 96, 136, 8}, {4160, 136, 520, 136}};

TEST(SwigluLinearGpu, SiluLinear) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Family& family : kFamilies)
    for (const SiluShape& s : kSiluShapes)
      for (bool exact : {true, false}) {
        SCOPED_TRACE(std::string(family.kernels) + " cluster " + family.cluster + (exact ? " exact" : " random") +
                     " N " + std::to_string(s.n) + " d " + std::to_string(s.d) + " M " + std::to_string(s.m) + " c0 " +
                     std::to_string(s.c0));
        test::ScopedEnv choice("LINAC_SWIGLU_KERNELS", family.kernels), cluster("LINAC_SWIGLU_CLUSTER", family.cluster);
        auto rounded = [](OwnedTensor t) { return to(to(t, Device::CPU, DType::BF16), Device::CPU, DType::F64); };
        OwnedTensor x = exact ? test::small_integers({s.n, s.d}, 21)
                              : rounded(test::random_tensor({s.n, s.d}, DType::F64, 21, -2, 2));
        OwnedTensor w = exact ? test::small_integers({s.m, s.d}, 22)
                              : rounded(test::random_tensor({s.m, s.d}, DType::F64, 22, -0.2, 0.2));
        GpuContext gctx;
        OwnedTensor xg = to(x, Device::CUDA, DType::BF16), wg = to(w, Device::CUDA, DType::BF16);
        OwnedTensor y(DType::BF16, Device::CUDA, {s.n, s.m}), v(DType::BF16, Device::CUDA, {s.n, s.m - s.c0});
        test::poison(y);
        test::poison(v);
        silu_linear_fwd(gctx.ctx(), xg, wg, y, v, s.c0);
        gctx.synchronize();
        if (exact) {
          OwnedTensor p(DType::F64, Device::CPU, {s.n, s.m});
          matmul(Ctx{}, x, false, w, true, p);
          EXPECT_EQ(test::bf16_bits(y), test::bf16_bits(p));
          // silu_fwd of that product: the same bits.
          OwnedTensor v2(DType::BF16, Device::CUDA, {s.n, s.m - s.c0});
          silu_fwd(gctx.ctx(), y->narrow(1, s.c0, s.m - s.c0), v2);
          gctx.synchronize();
          EXPECT_EQ(test::bf16_bits(v), test::bf16_bits(v2));
        } else {
          OwnedTensor yc(DType::F64, Device::CPU, {s.n, s.m}), vc(DType::F64, Device::CPU, {s.n, s.m - s.c0});
          silu_linear_fwd(Ctx{}, x, w, yc, vc, s.c0);
          EXPECT_LT(test::rel_error(y, yc), 5e-3);
          EXPECT_LT(test::rel_error(v, vc), 1e-2);
        }
      }
}

TEST(SwigluLinearGpu, KernelChoice) {
  LINAC_SKIP_WITHOUT_GPU();
  const bool hopper = LINAC_WITH_SM90A && gpu_compute_capability() == 90;
  OwnedTensor x(DType::BF16, Device::CUDA, {24, 64}), w(DType::BF16, Device::CUDA, {128, 64});
  OwnedTensor h(DType::BF16, Device::CUDA, {24, 128}), a(DType::BF16, Device::CUDA, {24, 64});
  OwnedTensor a32(DType::F32, Device::CUDA, {24, 64}), x_odd(DType::BF16, Device::CUDA, {24, 60});
  OwnedTensor x_decode(DType::BF16, Device::CUDA, {kSkinnyMaxRows, 64});
  test::ScopedEnv unset("LINAC_SWIGLU_KERNELS", nullptr);
  EXPECT_EQ(std::string(swiglu_linear_gpu_kernel(x, w, h, a)), hopper ? "fused_sm90" : "composite");
  EXPECT_EQ(std::string(swiglu_linear_gpu_kernel(x_decode, w, h, a)), "composite");  // matmul's skinny kernel
  EXPECT_EQ(std::string(swiglu_linear_gpu_kernel(x, w, h, a32)), "composite");
  EXPECT_EQ(std::string(swiglu_linear_gpu_kernel(x_odd, w, h, a)), "composite");
  {
    test::ScopedEnv forced("LINAC_SWIGLU_KERNELS", "sm80");
    EXPECT_EQ(std::string(swiglu_linear_gpu_kernel(x, w, h, a)), "composite");
  }
  {
    test::ScopedEnv bad("LINAC_SWIGLU_KERNELS", "fused");
    EXPECT_THROW(swiglu_linear_gpu_kernel(x, w, h, a), UserError);
  }
  test::ScopedEnv cluster_unset("LINAC_SWIGLU_CLUSTER", nullptr);
  EXPECT_EQ(swiglu_linear_cluster(), 2);
  for (const char* c : {"1", "2"}) {
    test::ScopedEnv cluster(("LINAC_SWIGLU_CLUSTER"), c);
    EXPECT_EQ(swiglu_linear_cluster(), c[0] - '0');
  }
  test::ScopedEnv bad_cluster("LINAC_SWIGLU_CLUSTER", "4");
  EXPECT_THROW(swiglu_linear_cluster(), UserError);
}

}  // namespace
}  // namespace linac::test_swiglu_linear_gpu
