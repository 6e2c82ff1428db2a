// The attention projection with RoPE (rope_linear.h) on the GPU, through every path this GPU has
// (fused_sm90 on Hopper, composite everywhere):
// - integer-valued operands, whose products and sums are exact in f32 and bf16, so y = x W^T does
//   not depend on the summation order: the fused kernel's y must be bit for bit what matmul then
//   rope_fwd give;
// - random operands against the CPU in f64 (bf16 tolerance);
// - bit-identical reruns, and the path choice.
// Shapes: N not a multiple of the 128-row tile (and an odd count of row blocks, which leaves the
// second CTA of a cluster without rows), M not a multiple of the 256-column tile, K not a multiple
// of the 32-deep k-step, T not dividing the tile (positions wrap inside a tile), head dims 64, 96
// (192-column tiles) and 128, q and k rotated, every column, or q and k after v (the Latte mixer's
// layout, rotated columns from r0 on); one shape has more tiles than the GPU runs at once.
// With packed documents (positions restart at each document start) the same checks, on layouts
// with documents of one token, shorter than a tile, and starting on and off tile boundaries.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "rope/rope_linear.h"
#include "test_util.h"

namespace linac::test_rope_linear_gpu {
namespace {

constexpr double kBase = 10000.0;

struct Shape {
  int64_t t, b, k, heads, d;  // y has 3 * heads heads of d columns (q, k, v)
};
const Shape kShapes[] = {{77, 3, 200, 5, 64}, {129, 40, 136, 3, 128}, {2048, 2, 96, 4, 64}, {300, 5, 168, 3, 96}};

// docs.start ([n] int32, host memory) of rows that are n / t sequences of t tokens, sequence r
// holding documents of `lengths` cycled from its r-th entry.
OwnedTensor doc_starts(int64_t n, int64_t t, const std::vector<int64_t>& lengths) {
  OwnedTensor start = test::doc_layout(n / t, t, test::rotated_rows(lengths, n / t)).starts();
  start.t = start.t.view({n});
  return start;
}
const std::vector<int64_t> kDocLayouts[] = {{1, 5, 17}, {64, 3, 128, 200, 1}};

// y = rope_linear_fwd(x, w) on the GPU in bf16, through the path LINAC_ROPE_LINEAR_KERNELS picks;
// doc_start: host memory or null.
OwnedTensor run_gpu(const Tensor& x, const Tensor& w, int64_t t, int64_t n_rot, int64_t d,
                    const Tensor* doc_start = nullptr, int64_t r0 = 0) {
  GpuContext g;
  OwnedTensor xg = to(x, Device::CUDA, DType::BF16), wg = to(w, Device::CUDA, DType::BF16);
  OwnedTensor y(DType::BF16, Device::CUDA, {x.size(0), w.size(0)});
  test::poison(y);
  OwnedTensor start;
  DocBounds docs;
  if (doc_start) {
    start = to(*doc_start, Device::CUDA, DType::I32);
    docs.start = start.t.data<int32_t>();
  }
  rope_linear_fwd(g.ctx(), xg, wg, y, t, n_rot, d, kBase, docs, r0);
  g.synchronize();
  return y;
}

TEST(RopeLinearGpu, ExactProductsRotateAsRopeFwd) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t, m = 3 * s.heads * s.d;
    OwnedTensor x = test::small_integers({n, s.k}, 1), w = test::small_integers({m, s.k}, 2);
    const int64_t qk = 2 * s.heads * s.d;
    const std::pair<int64_t, int64_t> cols[] = {{0, qk}, {0, m}, {m - qk, qk}};  // (r0, n_rot)
    for (const auto& [r0, n_rot] : cols) {
      SCOPED_TRACE("T " + std::to_string(s.t) + " N " + std::to_string(n) + " K " + std::to_string(s.k) + " M " +
                   std::to_string(m) + " D " + std::to_string(s.d) + " r0 " + std::to_string(r0) + " n_rot " +
                   std::to_string(n_rot));
      const OwnedTensor fused = run_gpu(x, w, s.t, n_rot, s.d, nullptr, r0);
      test::ScopedEnv composite("LINAC_ROPE_LINEAR_KERNELS", "sm80");
      const OwnedTensor ref = run_gpu(x, w, s.t, n_rot, s.d, nullptr, r0);
      EXPECT_EQ(test::bf16_bits(fused), test::bf16_bits(ref));
    }
  }
}

// Random bf16-rounded operands against the CPU in f64, optionally with documents packed in each
// sequence (the lengths of kDocLayouts[1]); q and k first, or (at D = 96) after v.
void random_operands_match_cpu(bool docs) {
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t, m = 3 * s.heads * s.d, n_rot = 2 * s.heads * s.d, r0 = s.d == 96 ? m - n_rot : 0;
    SCOPED_TRACE("T " + std::to_string(s.t) + " D " + std::to_string(s.d));
    // The CPU computes from the same bf16-rounded operands.
    OwnedTensor x =
        to(to(test::random_tensor({n, s.k}, DType::F64, 3), Device::CPU, DType::BF16), Device::CPU, DType::F64);
    OwnedTensor w =
        to(to(test::random_tensor({m, s.k}, DType::F64, 4), Device::CPU, DType::BF16), Device::CPU, DType::F64);
    const OwnedTensor start = docs ? doc_starts(n, s.t, kDocLayouts[1]) : OwnedTensor();
    OwnedTensor ref(DType::F64, Device::CPU, {n, m});
    rope_linear_fwd(Ctx{}, x, w, ref, s.t, n_rot, s.d, kBase,
                    DocBounds{docs ? start.t.data<int32_t>() : nullptr, nullptr}, r0);
    const OwnedTensor y = run_gpu(x, w, s.t, n_rot, s.d, docs ? &start.t : nullptr, r0);
    EXPECT_LT(test::rel_error(to(y, Device::CPU, DType::F64), ref), 5e-3);
  }
}

TEST(RopeLinearGpu, RandomOperandsMatchCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  random_operands_match_cpu(false);
}

TEST(RopeLinearGpu, DocsExactProductsRotateAsRopeFwd) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes)
    for (const std::vector<int64_t>& lengths : kDocLayouts) {
      const int64_t n = s.b * s.t, m = 3 * s.heads * s.d, n_rot = 2 * s.heads * s.d;
      SCOPED_TRACE("T " + std::to_string(s.t) + " D " + std::to_string(s.d) + " first length " +
                   std::to_string(lengths[0]));
      OwnedTensor x = test::small_integers({n, s.k}, 1), w = test::small_integers({m, s.k}, 2);
      const OwnedTensor start = doc_starts(n, s.t, lengths);
      const OwnedTensor fused = run_gpu(x, w, s.t, n_rot, s.d, &start.t);
      const OwnedTensor plain = run_gpu(x, w, s.t, n_rot, s.d);
      test::ScopedEnv composite("LINAC_ROPE_LINEAR_KERNELS", "sm80");
      const OwnedTensor ref = run_gpu(x, w, s.t, n_rot, s.d, &start.t);
      EXPECT_EQ(test::bf16_bits(fused), test::bf16_bits(ref));
      EXPECT_NE(test::bf16_bits(fused), test::bf16_bits(plain));  // the documents restart positions
    }
}

TEST(RopeLinearGpu, DocsRandomOperandsMatchCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  random_operands_match_cpu(true);
}

TEST(RopeLinearGpu, RerunsAreBitIdentical) {
  LINAC_SKIP_WITHOUT_GPU();
  const Shape s = kShapes[1];
  const int64_t n = s.b * s.t, m = 3 * s.heads * s.d;
  OwnedTensor x = test::random_tensor({n, s.k}, DType::F64, 5), w = test::random_tensor({m, s.k}, DType::F64, 6);
  EXPECT_EQ(test::bf16_bits(run_gpu(x, w, s.t, 2 * s.heads * s.d, s.d)),
            test::bf16_bits(run_gpu(x, w, s.t, 2 * s.heads * s.d, s.d)));
}

TEST(RopeLinearGpu, KernelChoice) {
  LINAC_SKIP_WITHOUT_GPU();
  const bool hopper = LINAC_WITH_SM90A && gpu_compute_capability() == 90;
  OwnedTensor x(DType::BF16, Device::CUDA, {16, 64}), w(DType::BF16, Device::CUDA, {384, 64});
  OwnedTensor y(DType::BF16, Device::CUDA, {16, 384}), y32(DType::F32, Device::CUDA, {16, 384});
  test::ScopedEnv unset("LINAC_ROPE_LINEAR_KERNELS", nullptr);
  EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y, 64)), hopper ? "fused_sm90" : "composite");
  EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y, 128)), hopper ? "fused_sm90" : "composite");
  EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y, 96)), hopper ? "fused_sm90" : "composite");
  EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y, 80)), "composite");
  EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y32, 64)), "composite");
  {
    test::ScopedEnv forced("LINAC_ROPE_LINEAR_KERNELS", "sm80");
    EXPECT_EQ(std::string(rope_linear_gpu_kernel(x, w, y, 64)), "composite");
  }
  test::ScopedEnv bad("LINAC_ROPE_LINEAR_KERNELS", "fused");
  EXPECT_THROW(rope_linear_gpu_kernel(x, w, y, 64), UserError);
}

}  // namespace
}  // namespace linac::test_rope_linear_gpu
