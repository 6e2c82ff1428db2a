// The step profiler: nested regions summed by name and level, nothing recorded without an
// attached profiler, and a model step's phases covering its token mixers, channel mixers, head
// and optimizer with GEMMs and attention among the ops, within the step's wall time, and its
// GEMMs split by problem with their operation counts; the step timer's laps (bench's per-step
// times).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/profiler.h"
#include "model/model.h"
#include "model_checks.h"
#include "train/train_step.h"

namespace linac::test_profiler {
namespace {

const Profiler::Total* find(const std::vector<Profiler::Total>& ts, const std::string& name, Profiler::Level level) {
  for (const auto& t : ts)
    if (t.name == name && t.level == level) return &t;
  return nullptr;
}

TEST(Profiler, NestedRegionsAreSummedByNameAndLevel) {
  Profiler prof;
  Ctx ctx;
  ctx.profiler = &prof;
  for (int i = 0; i < 3; ++i) {
    ProfileScope outer(ctx, "outer");
    {
      ProfileScope inner(ctx, "inner", Profiler::Level::Op);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ProfileScope same_name_other_level(ctx, "outer", Profiler::Level::Op);
    ProfileScope problem(ctx, "outer", Profiler::Level::Shape, 1.5 + i);
  }
  const auto ts = prof.totals();
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].name, "outer");  // first seen first
  const auto* outer = find(ts, "outer", Profiler::Level::Phase);
  const auto* inner = find(ts, "inner", Profiler::Level::Op);
  ASSERT_TRUE(outer && inner && find(ts, "outer", Profiler::Level::Op));
  EXPECT_EQ(outer->count, 3);
  EXPECT_EQ(inner->count, 3);
  EXPECT_GE(inner->ms, 6.0 * 0.9);
  EXPECT_GE(outer->ms, inner->ms);
  EXPECT_EQ(outer->flops, 0.0);
  const auto* problem = find(ts, "outer", Profiler::Level::Shape);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->count, 3);
  EXPECT_DOUBLE_EQ(problem->flops, 1.5 + 2.5 + 3.5);
  prof.clear();
  EXPECT_TRUE(prof.totals().empty());
}

// Timer::mark / laps_ms: one lap per mark, each at least the work between its marks, together
// within start()..stop_ms(), and the marks forgotten once read.
TEST(Profiler, TimerLapsSplitTheTimedSpan) {
  Ctx ctx;
  Timer timer(ctx);
  timer.start();
  for (int ms : {2, 5, 3}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    timer.mark();
  }
  const std::vector<double> laps = timer.laps_ms();
  const double total = timer.stop_ms();
  ASSERT_EQ(laps.size(), 3u);
  EXPECT_GE(laps[0], 2.0);
  EXPECT_GE(laps[1], 5.0);
  EXPECT_GE(laps[2], 3.0);
  EXPECT_LE(laps[0] + laps[1] + laps[2], total);
  EXPECT_TRUE(timer.laps_ms().empty());
}

TEST(Profiler, DetachedScopesRecordNothing) {
  Profiler prof;
  Ctx ctx;  // no profiler attached
  { ProfileScope s(ctx, "x"); }
  EXPECT_TRUE(prof.totals().empty());
}

TEST(Profiler, ATrainingStepsPhasesAndOps) {
  const ModelConfig cfg = test::tiny_model(2, 32, 2, 50, 64);
  Model model(cfg, Ctx{}, {.precision = "fp32", .with_optimizer = true});
  model.init_params(3);
  const int64_t B = 2, T = 37;
  model.reserve(B, T);
  OwnedTensor tok = test::random_tokens(B, T, cfg.vocab_size, 1), tgt = test::random_tokens(B, T, cfg.vocab_size, 2);
  TrainConfig tc;
  TrainStep stepper(model, tc, nullptr);
  std::vector<MicroBatch> micro = {{tok.t, tgt.t}};
  Profiler prof;
  model.set_profiler(&prof);
  const auto t0 = std::chrono::steady_clock::now();
  stepper.run(0, micro, B * T);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  model.set_profiler(nullptr);
  stepper.run(1, micro, B * T);  // detached: adds nothing
  const auto ts = prof.totals();
  for (const char* phase : {"embedding", "norms and residual adds", "token mixer forward (attention)",
                            "token mixer backward (attention)", "channel mixer forward", "channel mixer backward",
                            "LM head and loss, forward and backward", "optimizer: AdamW and buffers"})
    EXPECT_TRUE(find(ts, phase, Profiler::Level::Phase)) << phase;
  const auto* fwd = find(ts, "token mixer forward (attention)", Profiler::Level::Phase);
  ASSERT_TRUE(fwd);
  EXPECT_EQ(fwd->count, 2);  // one per layer, one step
  const auto* gemm = find(ts, "GEMM", Profiler::Level::Op);
  const auto* attn = find(ts, "attention", Profiler::Level::Op);
  ASSERT_TRUE(gemm && attn);
  EXPECT_EQ(attn->count, 4);  // forward and backward of 2 layers
  EXPECT_GT(gemm->count, 10);
  double phases = 0, problems_ms = 0, problems_flops = 0;
  int64_t problem_calls = 0;
  for (const auto& t : ts) {
    EXPECT_GE(t.ms, 0.0) << t.name;
    if (t.level == Profiler::Level::Phase) phases += t.ms;
    if (t.level != Profiler::Level::Shape) continue;
    EXPECT_EQ(t.name.rfind("GEMM ", 0), 0u) << t.name;
    EXPECT_GT(t.flops, 0.0) << t.name;
    problems_ms += t.ms;
    problems_flops += t.flops;
    problem_calls += t.count;
  }
  EXPECT_LE(phases, wall_ms);
  // Every GEMM call is one problem region inside its GEMM op region.
  EXPECT_EQ(problem_calls, gemm->count);
  EXPECT_LE(problems_ms, gemm->ms);
  // The LM head's logits alone: 2 B T d V.
  EXPECT_GT(problems_flops, 2.0 * B * T * cfg.d_model * cfg.vocab_size);
  const auto* logits = find(ts,
                            "GEMM " + std::to_string(B * T) + " x " + std::to_string(cfg.vocab_size) + " x " +
                                std::to_string(cfg.d_model) + " A B^T f32>f32",
                            Profiler::Level::Shape);
  ASSERT_TRUE(logits);
  EXPECT_DOUBLE_EQ(logits->flops / static_cast<double>(logits->count), 2.0 * B * T * cfg.d_model * cfg.vocab_size);
}

}  // namespace
}  // namespace linac::test_profiler
