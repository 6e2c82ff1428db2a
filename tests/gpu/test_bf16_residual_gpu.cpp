// train.residual_dtype bf16: the residual stream and its gradient in bf16 under bf16 precision.
// Every architecture's model trains three steps beside the same model with the f32 stream, from
// the same weights on the same batches: the losses and gradient norms must track the f32 run
// within bf16's rounding of the stream (and differ from it somewhere, or the option did nothing),
// and a rerun must give the same bits.
#include <gtest/gtest.h>

#include <cmath>

#include "model/model.h"
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"
#include "train/train_step.h"

namespace linac::test_bf16_residual_gpu {
namespace {

struct Trace {
  std::vector<double> loss, norm;
};

Trace train_steps(const ModelConfig& cfg, const Ctx& ctx, const std::string& residual, int64_t B, int64_t T) {
  Config full;
  full.model = cfg;
  TrainConfig& tc = full.train;
  tc.precision = "bf16";
  tc.residual_dtype = residual;
  tc.steps = 3;
  tc.lr = 1e-3;
  tc.warmup_steps = 0;
  Trace r;
  test::train_two_micro_batch_steps(full, ctx, B, T, [&](int s, const StepStats& st, Model& m) {
    EXPECT_EQ(m.env().resid, residual == "bf16" ? DType::BF16 : DType::F32);
    EXPECT_FALSE(st.skipped) << residual << " step " << s;
    r.loss.push_back(st.loss);
    r.norm.push_back(st.grad_norm);
  });
  return r;
}

TEST(Bf16ResidualGpu, StepsTrackTheF32StreamEveryArchitecture) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  // T = 77: not a multiple of any kernel's chunk or tile.
  const int64_t B = 2, T = 77;
  for (const std::string& arch : test::kGpuConfigArchs) {
    SCOPED_TRACE(arch);
    const ModelConfig cfg = test::gpu_config_of(arch);
    const Trace f32 = train_steps(cfg, g.ctx(), "f32", B, T);
    const Trace bf16 = train_steps(cfg, g.ctx(), "bf16", B, T);
    const Trace again = train_steps(cfg, g.ctx(), "bf16", B, T);
    bool differs = false;
    for (size_t s = 0; s < f32.loss.size(); ++s) {
      ASSERT_TRUE(std::isfinite(bf16.loss[s]) && std::isfinite(bf16.norm[s])) << "step " << s;
      EXPECT_NEAR(bf16.loss[s], f32.loss[s], 1e-2 * f32.loss[s]) << "step " << s;
      EXPECT_NEAR(bf16.norm[s], f32.norm[s], 5e-2 * f32.norm[s]) << "step " << s;
      EXPECT_EQ(again.loss[s], bf16.loss[s]) << "step " << s;
      EXPECT_EQ(again.norm[s], bf16.norm[s]) << "step " << s;
      differs = differs || bf16.loss[s] != f32.loss[s];
    }
    EXPECT_TRUE(differs) << "the bf16 stream gave the f32 stream's losses bit for bit";
  }
}

}  // namespace
}  // namespace linac::test_bf16_residual_gpu
