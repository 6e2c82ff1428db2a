// Loaders over a synthetic split whose token at position i is i, so every row reveals where
// it was read: determinism, per-epoch coverage, rank disjointness, exact resume, evaluation
// coverage.
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "data/loader.h"
#include "data/test_fixtures.h"

namespace linac::test_loader {
namespace {

constexpr int64_t kVocab = 65536;

struct LoaderFixture : ::testing::Test {
  test::TempDir dir;
  std::string path;
  void make(uint64_t n_train, uint64_t n_val = 100) {
    std::vector<int32_t> train(n_train), val(n_val);
    std::iota(train.begin(), train.end(), 0);
    std::iota(val.begin(), val.end(), 0);
    path = dir / "pos.h5";
    test::write_token_file(path, train, val, kVocab);
  }
};

// Row starts of one batch; checks that each row is T+1 consecutive positions.
std::vector<int32_t> starts(const std::vector<int32_t>& batch, int64_t B, int64_t T) {
  std::vector<int32_t> s;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = batch.data() + b * (T + 1);
    for (int64_t t = 0; t <= T; ++t) EXPECT_EQ(row[t], row[0] + t);
    s.push_back(row[0]);
  }
  return s;
}

TEST_F(LoaderFixture, SameSeedSameBatchesOtherSeedOthers) {
  make(20000);
  const TokenDataset ds(path);
  TrainLoader a(ds, Split::Train, 4, 32, 0, 1, 7), b(ds, Split::Train, 4, 32, 0, 1, 7), c(ds, Split::Train, 4, 32, 0, 1, 8);
  bool differs = false;
  for (int k = 0; k < 20; ++k) {
    const auto x = a.next(), y = b.next(), z = c.next();
    EXPECT_EQ(x, y);
    differs |= x != z;
    starts(x, 4, 32);
  }
  EXPECT_TRUE(differs);
}

TEST_F(LoaderFixture, EachEpochVisitsEverySlotOnce) {
  make(1000);
  const TokenDataset ds(path);
  const int64_t T = 16;
  TrainLoader ld(ds, Split::Train, 1, T, 0, 1, 3);
  std::set<uint64_t> shifts;
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    const uint64_t m = ld.windows_in_epoch(epoch);
    const uint64_t shift = ld.window_start(epoch, 0) % T;
    shifts.insert(shift);
    EXPECT_EQ(m, (1000 - 1 - shift) / T);
    std::set<int32_t> seen;
    for (uint64_t i = 0; i < m; ++i) {
      const int32_t s = starts(ld.next(), 1, T)[0];
      EXPECT_EQ(static_cast<uint64_t>(s) % T, shift);
      EXPECT_LE(static_cast<uint64_t>(s) + T + 1, 1000u);
      seen.insert(s);
    }
    EXPECT_EQ(seen.size(), m) << "epoch " << epoch;
    EXPECT_EQ(ld.state().epoch, epoch + 1);
    EXPECT_EQ(ld.state().cursor, 0u);
  }
  EXPECT_GT(shifts.size(), 1u);  // slot boundaries move between epochs
}

TEST_F(LoaderFixture, RanksAreDisjointAndEqualOneRankWithTheGlobalBatch) {
  make(50000);
  const TokenDataset ds(path);
  const int64_t B = 3, T = 20;
  for (int world : {2, 3}) {
    TrainLoader single(ds, Split::Train, B * world, T, 0, 1, 11);
    std::vector<TrainLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(ds, Split::Train, B, T, r, world, 11);
    std::set<int32_t> used;
    for (int step = 0; step < 40; ++step) {
      const auto global = single.next();
      std::vector<int32_t> joined;
      for (auto& ld : ranks) {
        const auto part = ld.next();
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, global) << "world " << world << " step " << step;
      for (int32_t s : starts(joined, B * world, T)) EXPECT_TRUE(used.insert(s).second) << "window reused: " << s;
      for (auto& ld : ranks) EXPECT_EQ(ld.state(), single.state());
    }
  }
}

TEST_F(LoaderFixture, ResumesExactlyFromSavedState) {
  make(3000);  // short epochs: the run below crosses several epoch boundaries
  const TokenDataset ds(path);
  const int64_t B = 5, T = 24;
  for (int world : {1, 2}) {
    TrainLoader run(ds, Split::Train, B, T, world - 1, world, 99);
    for (int k = 0; k < 17; ++k) run.next();
    const LoaderState saved = run.state();
    const auto as_vector = saved.to_vector();
    const auto as_json = saved.to_json().dump();
    std::vector<std::vector<int32_t>> expected;
    for (int k = 0; k < 30; ++k) expected.push_back(run.next());
    EXPECT_GT(run.state().epoch, saved.epoch);

    TrainLoader from_vec(ds, Split::Train, B, T, world - 1, world, 12345);  // seed comes from the state
    from_vec.set_state(LoaderState::from_vector(as_vector));
    TrainLoader from_json(ds, Split::Train, B, T, world - 1, world, 0);
    from_json.set_state(LoaderState::from_json(nlohmann::json::parse(as_json)));
    for (int k = 0; k < 30; ++k) {
      EXPECT_EQ(from_vec.next(), expected[k]) << k;
      EXPECT_EQ(from_json.next(), expected[k]) << k;
    }
    EXPECT_EQ(from_vec.state(), run.state());
  }
}

TEST_F(LoaderFixture, BadShapesAndStatesAreUserErrors) {
  make(100, 10);
  const TokenDataset ds(path);
  EXPECT_THROW(TrainLoader(ds, Split::Val, 1, 10, 0, 1, 1), UserError);  // 10 tokens < T+1
  EXPECT_NO_THROW(TrainLoader(ds, Split::Val, 1, 9, 0, 1, 1));
  EXPECT_THROW(TrainLoader(ds, Split::Train, 0, 8, 0, 1, 1), UserError);
  EXPECT_THROW(LoaderState::from_vector({1, 2, 3}), UserError);
  EXPECT_THROW(LoaderState::from_vector({9, 1, 0, 0}), UserError);
  EXPECT_THROW(LoaderState::from_json(nlohmann::json{{"seed", 1}}), UserError);
}

TEST_F(LoaderFixture, EvalScoresEveryTargetOnceAcrossRanks) {
  const uint64_t n = 1037;  // 1036 targets: not a multiple of T
  make(n);
  const TokenDataset ds(path);
  const int64_t B = 4, T = 50;
  for (int world : {1, 2, 3}) {
    std::map<int32_t, int> scored;
    int64_t batches = -1;
    for (int r = 0; r < world; ++r) {
      EvalLoader ld(ds, Split::Train, B, T, r, world);
      EXPECT_EQ(ld.num_windows(), (n - 1 + T - 1) / T);
      if (batches >= 0) EXPECT_EQ(ld.num_batches(), batches);
      batches = ld.num_batches();
      std::vector<int32_t> tokens(ld.batch_elems()), counts(B);
      int64_t got = 0;
      while (ld.next(tokens.data(), counts.data())) {
        ++got;
        for (int64_t b = 0; b < B; ++b) {
          const int32_t* row = tokens.data() + b * (T + 1);
          ASSERT_LE(counts[b], T);
          for (int32_t t = 0; t < counts[b]; ++t) {
            EXPECT_EQ(row[t + 1], row[t] + 1);
            ++scored[row[t + 1]];  // the target's position
          }
          for (int64_t t = counts[b] > 0 ? counts[b] + 1 : 0; t <= T; ++t) EXPECT_EQ(row[t], ld.pad_token());
        }
      }
      EXPECT_EQ(got, batches);
      ld.reset();
      EXPECT_TRUE(ld.next(tokens.data(), counts.data()));
    }
    ASSERT_EQ(scored.size(), n - 1) << "world " << world;
    EXPECT_EQ(scored.begin()->first, 1);
    EXPECT_EQ(scored.rbegin()->first, static_cast<int32_t>(n - 1));
    for (const auto& [pos, times] : scored) EXPECT_EQ(times, 1) << pos;
  }
}

TEST_F(LoaderFixture, EvalCanStopAfterMaxTargets) {
  make(1000);
  const TokenDataset ds(path);
  EvalLoader ld(ds, Split::Train, 2, 64, 0, 1, 100);
  EXPECT_EQ(ld.num_targets(), 100u);
  EXPECT_EQ(ld.num_windows(), 2u);
  std::vector<int32_t> tokens(ld.batch_elems()), counts(2);
  ASSERT_TRUE(ld.next(tokens.data(), counts.data()));
  EXPECT_EQ(counts[0], 64);
  EXPECT_EQ(counts[1], 36);
  EXPECT_FALSE(ld.next(tokens.data(), counts.data()));
}

}  // namespace
}  // namespace linac::test_loader
