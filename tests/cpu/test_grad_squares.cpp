// The gradient norm's sums of squares taken during the backward (train/grad_squares.h): every
// architecture's step reports the norm of its whole gradient buffer, and the groups must cover
// each parameter exactly once.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/param_store.h"
#include "model/registry.h"
#include "model_checks.h"
#include "train/grad_squares.h"

namespace linac::test_grad_squares {
namespace {

TEST(GradSquares, StepNormEveryArchitecture) {
  ASSERT_FALSE(architectures().empty());
  for (const ArchInfo& arch : architectures()) {
    for (const char* precision : {"fp64", "fp32"}) {
      SCOPED_TRACE(arch.name + " " + precision);
      test::check_step_grad_norm(test::tiny_config_of(arch), Ctx{}, precision, 2, 19,
                                 std::string(precision) == "fp64" ? 1e-12 : 1e-6);
    }
  }
}

TEST(GradSquares, GroupsCoverEveryParameterOnce) {
  ParamStore ps;
  const int a = ps.add({"a", {5}, Init::Ones, 0, false, {}, true});
  const int b = ps.add({"b", {3, 5}, Init::Normal, 0.02, true});
  const int c = ps.add({"c", {2, 3}, Init::Normal, 0.02, true});
  ps.allocate(Device::CPU, DType::F64, DType::F64, true);
  const Tensor g = ps.flat_grad();
  for (int64_t i = 0; i < g.numel(); ++i) g.data<double>()[i] = 0;
  for (int id : {a, b, c})
    for (int64_t i = 0; i < ps.numel(id); ++i) ps.grad(id).data<double>()[i] = 1 + id + 0.5 * static_cast<double>(i);
  GradSquares sq(ps, Ctx{}, {{c, a}, {b}});
  sq.on_ready({b});
  sq.on_ready({a, c});
  sq.join();
  double want = 0;
  for (int id : {a, b, c})
    for (int64_t i = 0; i < ps.numel(id); ++i) want += std::pow(1 + id + 0.5 * static_cast<double>(i), 2);
  EXPECT_DOUBLE_EQ(sq.total(), want);
  EXPECT_THROW(GradSquares(ps, Ctx{}, {{a, b}}), Error);          // c in no group
  EXPECT_THROW(GradSquares(ps, Ctx{}, {{a, b}, {b, c}}), Error);  // b in two
}

}  // namespace
}  // namespace linac::test_grad_squares
