// greedy_pick on the GPU against the CPU on the same f32 logits: vocabularies below, at and
// well above one CTA's 512 threads (17, 512, 32000, 50257), planted ties (lowest id wins), a row
// of equal logits, rows with -inf; the log-probabilities to 1e-12; bitwise reruns.
#include <limits>

#include "greedy_pick/greedy_pick.h"
#include "test_util.h"

namespace linac::test_greedy_pick_gpu {
namespace {

TEST(GreedyPickGpu, ParityWithTheCpu) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const int64_t V : {17, 512, 32000, 50257}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const int64_t B = 6;
    OwnedTensor logits = test::random_tensor({B, V}, DType::F32, 7, -10, 10);
    float* l = logits->data<float>();
    l[1 * V + V - 1] = l[1 * V + V / 2] = l[1 * V + 5] = 50;  // ties: id 5 wins
    for (int64_t v = 0; v < V; ++v) l[2 * V + v] = -1.5f;
    for (int64_t v = 0; v < V; v += 3) l[3 * V + v] = -std::numeric_limits<float>::infinity();
    l[4 * V + V - 1] = 60;  // the maximum in the last thread's last element
    OwnedTensor id(DType::I32, Device::CPU, {B}), lp(DType::F64, Device::CPU, {B});
    greedy_pick(Ctx{}, logits, id, lp);
    OwnedTensor logits_g = to(logits, Device::CUDA, DType::F32);
    OwnedTensor id_g(DType::I32, Device::CUDA, {B}), lp_g(DType::F64, Device::CUDA, {B});
    test::poison(lp_g);
    greedy_pick(g.ctx(), logits_g, id_g, lp_g);
    EXPECT_EQ(to_doubles(id_g), to_doubles(id));
    EXPECT_LT(test::max_abs_diff(to_doubles(lp_g), to_doubles(lp)), 1e-12);
    EXPECT_EQ(to_doubles(id_g)[1], 5);
    EXPECT_EQ(to_doubles(id_g)[4], V - 1);
    OwnedTensor lp_g2(DType::F64, Device::CUDA, {B});
    greedy_pick(g.ctx(), logits_g, id_g, lp_g2);
    EXPECT_EQ(to_doubles(lp_g), to_doubles(lp_g2)) << "not bitwise reproducible";
  }
}

}  // namespace
}  // namespace linac::test_greedy_pick_gpu
