// GradReducer's ZeRO-2 staging driven by hand in one process: the store is rank 0 of a 2-rank
// layout and the communicator has one rank, so a reduction to rank 0 copies the slot into the
// accumulator and rank 1's parts go nowhere. Every group waits for a comm window that never
// comes during the backward, so a slot is reused while its last group still waits: the reducer
// must start that group's reduction first. Rank 0's accumulator ends with the sum of every
// micro-batch's gradients of what it owns; reduced in bf16, with the sum of each micro-batch's
// gradients rounded to bf16 (added in the master dtype: the accumulator is never rounded).
#include <gtest/gtest.h>

#include "comm/comm.h"
#include "comm/grad_reducer.h"
#include "model/param_store.h"

namespace linac::test_grad_reducer {
namespace {

class GradReducerStaging : public ::testing::TestWithParam<DType> {};

TEST_P(GradReducerStaging, GroupsReachTheOwnersAccumulatorAcrossMicroBatchesAndSlotReuse) {
  const DType reduce_dtype = GetParam();
  ParamStore ps;
  const int norm = ps.add({"norm", {5}, Init::Ones, 0, false, {}, true});  // replicated: not staged
  const int a = ps.add({"a", {3, 16}, Init::Normal, 0.02, true});
  const int b = ps.add({"b", {4, 16}, Init::Normal, 0.02, true});
  const int c = ps.add({"c", {5, 13}, Init::Normal, 0.02, true});
  const int d = ps.add({"d", {2, 16}, Init::Normal, 0.02, true});
  const int e = ps.add({"e", {7, 9}, Init::Normal, 0.02, true});
  ps.shard(0, 2, true);
  ps.allocate(Device::CPU, DType::F64, DType::F64, true);
  const std::vector<std::vector<int>> groups = {{a, b}, {norm, c, d}, {e}};
  const std::unique_ptr<Comm> comm = Comm::create(Device::CPU);
  ASSERT_EQ(comm->world(), 1);
  GradReducer red(ps, *comm, Ctx{}, 1 << 20, true, groups, reduce_dtype);
  EXPECT_EQ(red.groups(), 3u);
  // The largest group, c and d (neighbours: one run of 65 + 63 padding + 32), rounded to 64.
  EXPECT_EQ(GradReducer::stage_slot_numel(ps, groups), 192);

  auto value = [](int mb, int id, int64_t j) { return 0.25 * (mb + 1) + 0.01 * id + 1e-4 * static_cast<double>(j); };
  // What one micro-batch's reduction delivers (from a world of one: the value itself).
  auto wire = [&](int mb, int id, int64_t j) {
    const double v = value(mb, id, j);
    return reduce_dtype == DType::BF16 ? static_cast<double>(round_bf16(static_cast<float>(v))) : v;
  };
  ps.zero_grad(Ctx{});
  for (int mb = 0; mb < 2; ++mb) {
    red.start_micro_batch(mb == 0, mb == 1);
    for (const auto& ids : groups) {
      red.on_begin(ids);
      for (int id : ids) {
        double* g = ps.grad(id).data<double>();
        for (int64_t j = 0; j < ps.numel(id); ++j) g[j] += value(mb, id, j);
      }
      red.on_ready(ids, true);
    }
    red.window();
  }
  EXPECT_ANY_THROW(ps.grad(a));  // outside its backward a sharded gradient does not exist

  const int64_t lo = ps.replicated_numel(), hi = lo + ps.shard_numel();
  std::vector<double> want(static_cast<size_t>(ps.shard_numel()), 0.0), exact = want;
  for (int id : {a, b, c, d, e})
    for (int64_t j = 0; j < ps.numel(id); ++j)
      if (const int64_t at = ps.offset(id) + j; at >= lo && at < hi) {
        want[static_cast<size_t>(at - lo)] = wire(0, id, j) + wire(1, id, j);
        exact[static_cast<size_t>(at - lo)] = value(0, id, j) + value(1, id, j);
      }
  EXPECT_EQ(to_doubles(ps.owned().back().grad), want);
  if (reduce_dtype == DType::BF16) EXPECT_NE(want, exact);  // else the check above could not fail
  // The replicated group keeps its gradient whole (reduced by the buckets in a real run).
  const std::vector<double> n = to_doubles(ps.grad(norm));
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(n[static_cast<size_t>(j)], value(0, norm, j) + value(1, norm, j));
}

INSTANTIATE_TEST_SUITE_P(ReduceDtype, GradReducerStaging, ::testing::Values(DType::F64, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace linac::test_grad_reducer
