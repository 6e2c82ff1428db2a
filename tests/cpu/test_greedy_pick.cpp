// greedy_pick on the CPU: the host Sampler's temperature-0 choice (the first maximum, so the lowest
// id among ties) and the log-probability of softmax in double, on random rows with planted ties,
// a row of equal logits and a row with -inf entries, f32 and f64; the arguments it refuses.
#include <cmath>
#include <limits>

#include "generate/sampler.h"
#include "greedy_pick/greedy_pick.h"
#include "test_util.h"

namespace linac::test_greedy_pick {
namespace {

// Rows of V logits: random, with the maximum planted twice in row 1, all equal in row 2 and
// -inf in most of row 3.
std::vector<double> logit_rows(int64_t B, int64_t V) {
  std::vector<double> l = test::random_values(static_cast<size_t>(B * V), 5, -8, 8);
  l[1 * V + 700] = l[1 * V + 701 % V] = l[1 * V + 3] = 20;
  for (int64_t v = 0; v < V; ++v) l[2 * V + v] = 0.25;
  for (int64_t v = 0; v < V; v += 2) l[3 * V + v] = -std::numeric_limits<double>::infinity();
  return l;
}

double log_softmax_at(const std::vector<double>& l, int64_t b, int64_t V, int64_t id) {
  double m = -std::numeric_limits<double>::infinity(), z = 0;
  for (int64_t v = 0; v < V; ++v) m = std::max(m, l[b * V + v]);
  for (int64_t v = 0; v < V; ++v) z += std::exp(l[b * V + v] - m);
  return l[b * V + id] - m - std::log(z);
}

void check(DType dt) {
  const int64_t B = 5, V = 1001;
  const std::vector<double> l = logit_rows(B, V);
  OwnedTensor l64(DType::F64, Device::CPU, {B, V});
  std::copy(l.begin(), l.end(), l64->data<double>());
  OwnedTensor logits = to(l64, Device::CPU, dt);
  const std::vector<double> rounded = to_doubles(logits);
  OwnedTensor id(DType::I32, Device::CPU, {B}), logprob(DType::F64, Device::CPU, {B});
  greedy_pick(Ctx{}, logits, id, logprob);
  std::vector<float> row_f(static_cast<size_t>(V));
  SamplingOptions greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t v = 0; v < V; ++v) row_f[static_cast<size_t>(v)] = static_cast<float>(rounded[b * V + v]);
    EXPECT_EQ(id->data<int32_t>()[b], sampler.sample(row_f.data(), V, 0, 0)) << "row " << b;
    EXPECT_NEAR(logprob->data<double>()[b], log_softmax_at(rounded, b, V, id->data<int32_t>()[b]), 1e-12);
  }
  EXPECT_EQ(id->data<int32_t>()[1], 3) << "ties go to the lowest id";
  EXPECT_EQ(id->data<int32_t>()[2], 0);
  EXPECT_NEAR(logprob->data<double>()[2], -std::log(static_cast<double>(V)), 1e-12);
}

TEST(GreedyPick, IsTheSamplersTemperatureZeroF32) { check(DType::F32); }
TEST(GreedyPick, IsTheSamplersTemperatureZeroF64) { check(DType::F64); }

TEST(GreedyPick, LogprobIsOptional) {
  OwnedTensor logits = test::random_tensor({3, 17}, DType::F32, 2);
  OwnedTensor a(DType::I32, Device::CPU, {3}), b(DType::I32, Device::CPU, {3}), lp(DType::F64, Device::CPU, {3});
  greedy_pick(Ctx{}, logits, a);
  greedy_pick(Ctx{}, logits, b, lp);
  EXPECT_EQ(to_doubles(a), to_doubles(b));
}

TEST(GreedyPick, RejectsBadArguments) {
  OwnedTensor logits = test::random_tensor({3, 17}, DType::F32, 2);
  OwnedTensor id(DType::I32, Device::CPU, {3}), short_id(DType::I32, Device::CPU, {2});
  OwnedTensor f_id(DType::F32, Device::CPU, {3}), lp32(DType::F32, Device::CPU, {3});
  EXPECT_THROW(greedy_pick(Ctx{}, logits, short_id), Error);
  EXPECT_THROW(greedy_pick(Ctx{}, logits, f_id), Error);
  EXPECT_THROW(greedy_pick(Ctx{}, logits, id, lp32), Error);
  EXPECT_THROW(greedy_pick(Ctx{}, logits.t.view({51}), id), Error);
}

}  // namespace
}  // namespace linac::test_greedy_pick
