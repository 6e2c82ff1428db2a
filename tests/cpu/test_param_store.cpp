// ParamStore's non-gradient buffers (Transformer-VQ's codebook statistics use them): initialised
// by their spec like parameters, outside the parameter count, the flat gradient and the
// optimizer, and saved and restored bit for bit by checkpoints; a checkpoint that lacks a
// buffer the model has is refused with a user error. Consecutive matrices stack into one
// (adjacent_rows).
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <memory>

#include "core/error.h"
#include "model/param_store.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train_fixture.h"

namespace linac::test_param_store {
namespace {

ParamStore store_with_buffers(bool with_buffers) {
  ParamStore ps;
  ps.add({"w", {3, 5}, Init::Normal, 0.02, true});
  if (with_buffers) {
    ps.add_buffer({"layers.0.vq.c_sum", {4, 6}, Init::Normal, 0.5, false});
    ps.add_buffer({"layers.0.vq.c_count", {4}, Init::Ones, 0, false});
  }
  ps.allocate(Device::CPU, DType::F32, DType::F32, true);
  ps.init(7, Ctx{});
  return ps;
}

TEST(ParamStoreBuffers, InitialisedOutsideParametersAndOptimizer) {
  const ParamStore ps = store_with_buffers(true);
  EXPECT_EQ(ps.total_numel(), 15);
  EXPECT_EQ(ps.buffer_count(), 2);
  const std::vector<double> sum = to_doubles(ps.buffer(0)), count = to_doubles(ps.buffer(1));
  EXPECT_EQ(sum.size(), 24u);
  EXPECT_EQ(count, std::vector<double>(4, 1.0));
  double sq = 0;
  for (double x : sum) sq += x * x;
  EXPECT_GT(sq, 24 * 0.25 * 0.3);  // N(0, 0.5^2) draws, not zeros
  EXPECT_LT(sq, 24 * 0.25 * 3.0);
  EXPECT_EQ(ps.flat_grad().numel(), ps.flat_master().numel());
  EXPECT_LT(ps.flat_master().numel(), 64 + 24);  // the buffers live in their own allocation
}

TEST(ParamStoreBuffers, CheckpointRoundTripIsExact) {
  const std::string dir = test::fresh_dir("param_store_buffers");
  ParamStore a = store_with_buffers(true);
  test::fill_random(a.buffer(0), 3, -2, 2);
  test::fill_random(a.buffer(1), 4, 0, 9);
  CheckpointData data;
  data.config = json::object();
  const std::string path = dir + "/a.h5";
  save_checkpoint(path, a, data);

  ParamStore b = store_with_buffers(true);
  CheckpointReader(path).load_params(b, true);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(to_doubles(a.buffer(i)), to_doubles(b.buffer(i))) << i;

  // A model with buffers cannot load a checkpoint that has none.
  const std::string plain = dir + "/plain.h5";
  save_checkpoint(plain, store_with_buffers(false), data);
  ParamStore c = store_with_buffers(true);
  EXPECT_THROW(CheckpointReader(plain).load_params(c, false), UserError);
}

// Initial values are drawn by several threads, a chunk of the flat layout at a time (a 1.3B model
// took about a minute on one thread and 16 GB of host memory at once): each value depends on its
// index alone, so any thread count and chunk size give the same bits, and so does each rank's
// part of a sharded master (ZeRO-1 with a bf16 compute copy: the master is not whole).
TEST(ParamStoreInit, ValuesDoNotDependOnThreadsChunksOrShards) {
  auto store = [](int rank, int world) {
    auto ps = std::make_unique<ParamStore>();
    ps->add({"big", {512, 300}, Init::Normal, 0.02, true});
    ps->add({"ones", {37}, Init::Ones, 0, true});
    ps->add({"small", {7, 9}, Init::Normal, 1.0, true});
    if (world > 1) ps->shard(rank, world);
    ps->allocate(Device::CPU, DType::F32, world > 1 ? DType::BF16 : DType::F32, true);
    return ps;
  };
  auto init_with = [&](int threads, int64_t chunk) {
    auto ps = store(0, 1);
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    ps->init(11, Ctx{}, chunk);
    omp_set_num_threads(before);
    return to_doubles(ps->flat_master());
  };
  const std::vector<double> one = init_with(1, ParamStore::kInitChunk);
  EXPECT_EQ(init_with(2, ParamStore::kInitChunk), one);
  EXPECT_EQ(init_with(3, 1000), one);  // chunks that end inside parameters and inside the padding
  EXPECT_EQ(init_with(2, 64), one);
  double sq = 0;
  for (size_t j = 0; j < 512 * 300; ++j) sq += one[j] * one[j];
  EXPECT_NEAR(sq / (512 * 300), 0.02 * 0.02, 0.02 * 0.02 * 0.05);  // N(0, 0.02^2) draws, not zeros
  for (int rank = 0; rank < 3; ++rank) {
    auto ps = store(rank, 3);
    ASSERT_FALSE(ps->master_whole());
    ps->init(11, Ctx{}, 777);
    for (const auto& [lo, hi] : ps->held(ParamPart::Master)) {
      OwnedTensor part(DType::F64, Device::CPU, {hi - lo});
      ps->read_range(ParamPart::Master, lo, hi, part);
      // The sharded layout pads the last shard past the whole one's end: zeros there.
      std::vector<double> want(static_cast<size_t>(hi - lo), 0.0);
      for (int64_t j = lo; j < std::min<int64_t>(hi, static_cast<int64_t>(one.size())); ++j)
        want[static_cast<size_t>(j - lo)] = one[static_cast<size_t>(j)];
      EXPECT_EQ(to_doubles(part), want) << rank << " " << lo;
    }
  }
}

// Parameters registered one after another (whole multiples of the 64-element alignment) stack
// into one matrix (a fused projection's single GEMM), weights and gradients alike; anything that
// is not back to back, or differs in columns, does not.
TEST(ParamStoreLayout, AdjacentRowsStackConsecutiveMatrices) {
  ParamStore ps;
  const int a = ps.add({"a", {4, 16}, Init::Normal, 0.02, true});
  const int b = ps.add({"b", {8, 16}, Init::Normal, 0.02, true});
  const int c = ps.add({"c", {3, 16}, Init::Normal, 0.02, true});  // 48 elements: padded to 64
  const int d = ps.add({"d", {4, 16}, Init::Normal, 0.02, true});
  const int e = ps.add({"e", {4, 8}, Init::Normal, 0.02, true});
  ps.allocate(Device::CPU, DType::F32, DType::F32, true);
  ps.init(3, Ctx{});
  const Tensor ab = adjacent_rows({ps.weight(a), ps.weight(b), ps.weight(c)});
  ASSERT_TRUE(ab.defined());
  EXPECT_EQ(ab.dims(), (std::vector<int64_t>{15, 16}));
  std::vector<double> want = to_doubles(ps.weight(a));
  for (int id : {b, c}) {
    const std::vector<double> w = to_doubles(ps.weight(id));
    want.insert(want.end(), w.begin(), w.end());
  }
  EXPECT_EQ(to_doubles(ab), want);
  EXPECT_EQ(adjacent_rows({ps.grad(a), ps.grad(b)}).ptr, ps.grad(a).ptr);
  EXPECT_FALSE(adjacent_rows({ps.weight(c), ps.weight(d)}).defined());  // c's padding lies between
  EXPECT_FALSE(adjacent_rows({ps.weight(a), ps.weight(c)}).defined());  // b lies between
  EXPECT_FALSE(adjacent_rows({ps.weight(b), ps.weight(a)}).defined());  // wrong order
  EXPECT_FALSE(adjacent_rows({ps.weight(d), ps.weight(e)}).defined());  // other column count
}

}  // namespace
}  // namespace linac::test_param_store
