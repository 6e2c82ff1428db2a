// Gradient accumulation with first writes (ParamStore::grad_write): zero_grad leaves the gradients
// whose producers overwrite them (beta = 0) in an accumulation's first pass, zeroes the others,
// refuses a read of a left gradient before its first write and a first pass that does not write
// one; and every architecture's gradients after a step that left NaN in them are those of a clean
// accumulation, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "model/param_store.h"
#include "model/registry.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_grad_accumulation {
namespace {

void fill(const Tensor& t, double v) { std::fill_n(t.data<float>(), t.numel(), static_cast<float>(v)); }

TEST(GradAccumulation, FirstWritesOfTheStore) {
  ParamStore ps;
  const int norm = ps.add({"norm", {5}, Init::Ones, 0, false, {}, true});
  const int w = ps.add({"w", {3, 5}, Init::Normal, 0.02, true});
  const int w2 = ps.add({"w2", {2, 3}, Init::Normal, 0.02, true});
  ps.allocate(Device::CPU, DType::F32, DType::F32, true);
  ps.zero_grad(Ctx{});
  // The first pass: the matrix's first write replaces, its second adds; the master-read
  // parameter always adds (zero_grad zeroed it).
  ParamStore::GradWrite gw = ps.grad_write(w);
  EXPECT_EQ(gw.beta, 0.f);
  fill(gw.grad, 1.0);
  EXPECT_EQ(ps.grad_write(w).beta, 1.f);
  EXPECT_EQ(ps.grad_write(norm).beta, 1.f);
  fill(ps.grad(norm), 2.0);
  fill(ps.grad(w2), 3.0);  // written as a plain accumulation, no grad_write
  ps.end_grad_pass(true);
  EXPECT_EQ(ps.grad_write(w).beta, 1.f) << "a second pass accumulates";
  ps.end_grad_pass(true);

  ps.zero_grad(Ctx{});
  EXPECT_EQ(to_doubles(ps.grad(norm)), std::vector<double>(5, 0.0));
  EXPECT_EQ(to_doubles(ps.grad(w2)), std::vector<double>(6, 0.0));
  EXPECT_THROW(ps.grad(w), Error) << "w holds the last accumulation's values until its first write";
  gw = ps.grad_write(w);
  EXPECT_EQ(gw.beta, 0.f);
  EXPECT_EQ(to_doubles(gw.grad), std::vector<double>(15, 1.0)) << "zero_grad left w to its producer";
  EXPECT_NO_THROW(ps.end_grad_pass(true));

  ps.zero_grad(Ctx{});
  EXPECT_THROW(ps.end_grad_pass(true), Error) << "a first pass that did not write w leaves stale values";
  ps.zero_grad(Ctx{});
  EXPECT_NO_THROW(ps.end_grad_pass(false)) << "a replayed graph's pass is not checked";
  // The padding after each parameter stays zero: no memset covers a left gradient's padding, and
  // the gradient norm reads the flat buffer.
  const std::vector<double> flat = to_doubles(ps.flat_grad());
  for (int id = 0; id < ps.count(); ++id)
    for (int64_t j = ps.offset(id) + ps.numel(id); j < ps.offset(id) + ParamStore::align(ps.numel(id)); ++j)
      ASSERT_EQ(flat[static_cast<size_t>(j)], 0.0) << ps.spec(id).name << "'s padding";
}

// Every registered architecture at its default layer pattern, float and double.
TEST(GradAccumulation, AfterNanGradientsEveryArchitecture) {
  ASSERT_FALSE(architectures().empty());
  for (const ArchInfo& arch : architectures()) {
    for (const char* precision : {"fp64", "fp32"}) {
      SCOPED_TRACE(arch.name + " " + precision);
      test::check_accumulation_after_nan(test::tiny_config_of(arch), Ctx{}, precision, 2, 19,
                                         std::string(precision) == "fp64" ? 1e-12 : 1e-5);
    }
  }
}

}  // namespace
}  // namespace linac::test_grad_accumulation
