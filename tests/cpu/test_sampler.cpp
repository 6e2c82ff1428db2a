// Next-token sampling: greedy is the argmax, top-k and top-p never emit a token they exclude,
// the draws follow the (cut, renormalised) softmax, and a fixed seed repeats its tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "generate/sampler.h"

namespace linac::test_sampler {
namespace {

std::vector<float> random_logits(int64_t V, uint64_t seed) {
  Rng rng{seed, 7, 0};
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = static_cast<float>(3.0 * rng.normal());
  return l;
}

// Logits whose softmax at temperature 1 is exactly p.
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::map<int32_t, int> histogram(Sampler& s, const std::vector<float>& l, int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[s.sample(l.data(), static_cast<int64_t>(l.size()), 0, static_cast<uint64_t>(i))];
  return h;
}

TEST(Sampler, TemperatureZeroIsTheArgmax) {
  SamplingOptions o;
  o.temperature = 0;
  Sampler s(o);
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const std::vector<float> l = random_logits(37, seed);
    const auto best = std::max_element(l.begin(), l.end()) - l.begin();
    EXPECT_EQ(s.sample(l.data(), 37, seed, seed), best);
  }
  const std::vector<float> tie = {1.f, 5.f, 5.f, 2.f};
  EXPECT_EQ(s.sample(tie.data(), 4, 0, 0), 1);  // the lowest id among ties
}

TEST(Sampler, DrawsFollowTheSoftmax) {
  const std::vector<double> p = {0.4, 0.3, 0.2, 0.1};
  Sampler s(SamplingOptions{});
  const int n = 20000;
  const auto h = histogram(s, logits_of(p), n);
  for (size_t i = 0; i < p.size(); ++i)  // 5 standard deviations of a binomial
    EXPECT_NEAR(h.count(static_cast<int32_t>(i)) ? h.at(static_cast<int32_t>(i)) / double(n) : 0.0, p[i],
                5 * std::sqrt(p[i] * (1 - p[i]) / n))
        << i;
}

TEST(Sampler, TopKNeverEmitsAnExcludedToken) {
  const std::vector<float> l = random_logits(50, 3);
  std::vector<int32_t> ids(50);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  for (int64_t k : {1, 3, 10}) {
    SamplingOptions o;
    o.top_k = k;
    o.temperature = 5;  // flatten: excluded tokens would be likely without the cut
    Sampler s(o);
    const std::set<int32_t> allowed(ids.begin(), ids.begin() + k);
    const auto h = histogram(s, l, 3000);
    for (const auto& [id, count] : h) EXPECT_TRUE(allowed.count(id)) << "k=" << k << " emitted " << id;
    EXPECT_EQ(h.size(), allowed.size()) << "k=" << k;  // and every kept token appears
  }
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<double> p = {0.05, 0.5, 0.15, 0.3};  // sorted: 1 (0.5), 3 (0.3), 2 (0.15), 0 (0.05)
  SamplingOptions o;
  o.top_p = 0.7;  // 0.5 < 0.7 <= 0.8: ids {1, 3}
  Sampler s(o);
  const int n = 20000;
  const auto h = histogram(s, logits_of(p), n);
  ASSERT_EQ(h.size(), 2u);
  ASSERT_TRUE(h.count(1) && h.count(3));
  const double p1 = 0.5 / 0.8;
  EXPECT_NEAR(h.at(1) / double(n), p1, 5 * std::sqrt(p1 * (1 - p1) / n));
  o.top_p = 0.5;  // the top token alone reaches it
  Sampler top(o);
  EXPECT_EQ(histogram(top, logits_of(p), 500).size(), 1u);
}

// top_p alone sorts its first 1024 candidates and the rest only when its prefix needs them: a
// flat distribution over 5000 ids whose 0.9-prefix (by logit, ties by id) is far longer. The
// draws stay inside the prefix the full sort gives, and reach past its first 1024 ids.
TEST(Sampler, TopPPrefixPastTheFirstSortedCandidates) {
  const int64_t V = 5000;
  std::vector<float> l = random_logits(V, 11);
  for (float& x : l) x *= 0.05f;
  SamplingOptions o;
  o.top_p = 0.9;
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  double z = 0;
  for (float x : l) z += std::exp(static_cast<double>(x) - l[ids[0]]);
  std::map<int32_t, size_t> rank;
  double mass = 0;
  for (size_t i = 0; i < ids.size() && mass < o.top_p; ++i) {
    rank[ids[i]] = i;
    mass += std::exp(static_cast<double>(l[ids[i]]) - l[ids[0]]) / z;
  }
  ASSERT_GT(rank.size(), 2000u) << "the prefix must outgrow the first sort";
  Sampler s(o);
  size_t deep = 0;
  for (uint64_t i = 0; i < 4000; ++i) {
    const int32_t t = s.sample(l.data(), V, 0, i);
    ASSERT_TRUE(rank.count(t)) << "emitted " << t << ", outside the 0.9 prefix";
    deep += rank.at(t) >= 1024;
  }
  EXPECT_GT(deep, 1000u);
}

TEST(Sampler, NoCutWalksEveryIdWithWeight) {
  // No cut: the draw walks ids in id order; ids of weight 0 (logit -inf) are never drawn, even
  // at the end of the walk.
  std::vector<float> l = {-INFINITY, 0.f, -INFINITY, 1.f, -INFINITY};
  Sampler s(SamplingOptions{});
  const auto h = histogram(s, l, 4000);
  ASSERT_EQ(h.size(), 2u);
  const double p3 = std::exp(1.0) / (1 + std::exp(1.0));
  EXPECT_NEAR(h.at(3) / 4000.0, p3, 5 * std::sqrt(p3 * (1 - p3) / 4000));
}

TEST(Sampler, AFixedSeedRepeatsItsTokens) {
  const std::vector<float> l = random_logits(64, 9);
  auto run = [&](uint64_t seed, uint64_t sequence) {
    SamplingOptions o;
    o.seed = seed;
    o.top_k = 20;
    o.top_p = 0.9;
    Sampler s(o);
    std::vector<int32_t> out;
    for (uint64_t i = 0; i < 200; ++i) out.push_back(s.sample(l.data(), 64, sequence, i));
    return out;
  };
  EXPECT_EQ(run(5, 0), run(5, 0));
  EXPECT_NE(run(5, 0), run(6, 0));
  EXPECT_NE(run(5, 0), run(5, 1));  // each sequence of a batch has its own stream
}

TEST(Sampler, OptionsOutOfRangeAreUserErrors) {
  auto bad = [](SamplingOptions o) { EXPECT_THROW(o.validate(), UserError); };
  SamplingOptions o;
  o.temperature = -1;
  bad(o);
  o = {};
  o.temperature = std::nan("");
  bad(o);
  o = {};
  o.top_k = -2;
  bad(o);
  o = {};
  o.top_p = 0;
  bad(o);
  o.top_p = 1.5;
  bad(o);
  EXPECT_NO_THROW(SamplingOptions{}.validate());
}

}  // namespace
}  // namespace linac::test_sampler
