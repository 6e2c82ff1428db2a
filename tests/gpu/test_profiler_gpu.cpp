// The step profiler on the GPU (CUDA events): a bf16 training step of a small Transformer++ is
// broken into its phases and ops, every region's time is non-negative, and the phases fit in
// the step's event-timed duration; the timer's per-step laps.
#include <gtest/gtest.h>

#include "core/profiler.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"
#include "train/train_step.h"

namespace linac::test_profiler_gpu {
namespace {

TEST(ProfilerGpu, ATrainingStepsPhasesFitInTheStep) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  const ModelConfig cfg = test::tiny_model(2, 128, 2, 1000, 256);
  Model model(cfg, ctx, {.precision = "bf16", .with_optimizer = true});
  model.init_params(3);
  const int64_t B = 3, T = 200;
  model.reserve(B, T);
  OwnedTensor tok = to(test::random_tokens(B, T, cfg.vocab_size, 1), Device::CUDA, DType::I32);
  OwnedTensor tgt = to(test::random_tokens(B, T, cfg.vocab_size, 2), Device::CUDA, DType::I32);
  TrainConfig tc;
  TrainStep stepper(model, tc, nullptr);
  std::vector<MicroBatch> micro = {{tok.t, tgt.t}};
  stepper.run(0, micro, B * T);  // warm-up
  Profiler prof;
  model.set_profiler(&prof);
  Timer timer(ctx);
  timer.start();
  stepper.run(1, micro, B * T);
  const double step_ms = timer.stop_ms();
  model.set_profiler(nullptr);
  const auto ts = prof.totals();
  double phases = 0;
  int64_t attention = 0;
  for (const auto& t : ts) {
    EXPECT_GE(t.ms, 0.0) << t.name;
    if (t.level == Profiler::Level::Phase) phases += t.ms;
    if (t.name == "attention") attention = t.count;
  }
  EXPECT_EQ(attention, 4);
  EXPECT_GT(phases, 0.0);
  EXPECT_LE(phases, step_ms * 1.001);

  // Per-step laps from events marked without waiting (bench's median and slowest step).
  timer.start();
  for (int64_t i = 0; i < 3; ++i) {
    stepper.run(2 + i, micro, B * T);
    timer.mark();
  }
  const std::vector<double> laps = timer.laps_ms();
  const double total = timer.stop_ms();
  ASSERT_EQ(laps.size(), 3u);
  for (double l : laps) EXPECT_GT(l, 0.0);
  EXPECT_LE(laps[0] + laps[1] + laps[2], total * 1.001);
  EXPECT_TRUE(timer.laps_ms().empty());
}

}  // namespace
}  // namespace linac::test_profiler_gpu
