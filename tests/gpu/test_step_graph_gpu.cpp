// Training steps replayed from CUDA graphs (train.cuda_graph, train/train_step.h): for every
// architecture, steps whose micro-batches replay a captured graph give the same losses, gradient
// norms and weights bit for bit as steps launched kernel by kernel (two micro-batches per step,
// bf16 mixed precision); replays happen where the mixers allow them, not for Transformer-VQ with
// document bounds (it reads them on the host), and a grad_scale that changes every step keeps
// the steps eager.
#include <string>
#include <vector>

#include "model/model.h"
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"
#include "train/train_step.h"

namespace linac::test_step_graph_gpu {
namespace {

constexpr int64_t kB = 2, kT = 77;

struct Steps {
  std::vector<double> stats;           // loss, auxiliary loss and gradient norm of every step
  std::vector<unsigned char> weights;  // the master weights' bytes after the last step
  int64_t replays = 0;
};

// `n` steps of two micro-batches of kB x kT random tokens (with document bounds `docs` when
// defined), from the same initial weights. vary_scale: a different count of scored targets, so a
// different grad_scale, at every step.
Steps train(const ModelConfig& cfg, const Ctx& ctx, bool graph, const Tensor& docs, int n, bool vary_scale = false) {
  Config full;
  full.model = cfg;
  full.data.packing = docs.defined() ? "document" : "stream";
  TrainConfig& tc = full.train;
  tc.precision = "bf16";
  tc.steps = n;
  tc.lr = 1e-3;
  tc.warmup_steps = 0;
  tc.cuda_graph = graph;
  Model m(cfg, ctx, ModelOptions::for_training(full, 0, 1));
  m.init_params(7);
  m.reserve(kB, kT);
  TrainStep ts(m, tc);
  ts.sync_weights();
  std::vector<OwnedTensor> bufs;
  bufs.reserve(4);
  std::vector<MicroBatch> micro;
  for (uint64_t i = 0; i < 2; ++i) {
    bufs.push_back(to(test::random_tokens(kB, kT, cfg.vocab_size, 40 + 2 * i), Device::CUDA, DType::I32));
    bufs.push_back(to(test::random_tokens(kB, kT, cfg.vocab_size, 41 + 2 * i), Device::CUDA, DType::I32));
    micro.push_back({bufs[2 * i].t, bufs[2 * i + 1].t, docs});
  }
  Steps out;
  for (int s = 0; s < n; ++s) {
    const StepStats st = ts.run(s, micro, 2 * kB * kT - (vary_scale ? s : 0));
    out.stats.insert(out.stats.end(), {st.loss, st.aux_loss, st.grad_norm});
  }
  OwnedTensor w(m.params().master_dtype(), Device::CPU, {m.params().flat_numel()});
  copy_tensor(w.t, m.params().flat_master());
  const auto* p = static_cast<const unsigned char*>(w->ptr);
  out.weights.assign(p, p + w->nbytes());
  out.replays = ts.graph_replays();
  return out;
}

void expect_same(const Steps& graph, const Steps& eager) {
  EXPECT_EQ(graph.stats, eager.stats);
  EXPECT_TRUE(graph.weights == eager.weights) << "weights differ from the eager steps'";
  EXPECT_EQ(eager.replays, 0);
}

TEST(StepGraphGpu, ReplaysEqualEagerSteps) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const std::string& arch : test::kGpuConfigArchs) {
    SCOPED_TRACE(arch);
    const ModelConfig cfg = test::gpu_config_of(arch);
    const Steps graph = train(cfg, g.ctx(), true, Tensor(), 4), eager = train(cfg, g.ctx(), false, Tensor(), 4);
    expect_same(graph, eager);
    // Step 0 runs eagerly; each micro-batch is captured at step 1 (or step 2, if the optimizer's
    // first step grew a scratch buffer) and replays from then on.
    EXPECT_GE(graph.replays, 4);
  }
}

// Document bounds: attention replays them; Transformer-VQ runs eagerly (Mixer::graph_safe_training).
TEST(StepGraphGpu, DocumentsReplayWhereTheMixersAllow) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  const OwnedTensor docs = to(test::doc_bounds_of(test::rotated_rows({1, 20, 33, 5, 18}, kB)), Device::CUDA, DType::I32);
  for (const std::string arch : {"transformer", "transformer_vq"}) {
    SCOPED_TRACE(arch);
    const ModelConfig cfg = test::gpu_config_of(arch);
    const Steps graph = train(cfg, g.ctx(), true, docs, 3), eager = train(cfg, g.ctx(), false, docs, 3);
    expect_same(graph, eager);
    if (arch == "transformer")
      EXPECT_GE(graph.replays, 2);
    else
      EXPECT_EQ(graph.replays, 0);
  }
}

// A grad_scale that differs at every step (the count of scored targets changes) is part of what a
// capture bakes in: such steps stay eager instead of capturing every step, with the same results.
TEST(StepGraphGpu, ChangingGradScaleStaysEager) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  const ModelConfig cfg = test::gpu_config_of("transformer");
  const Steps graph = train(cfg, g.ctx(), true, Tensor(), 3, true), eager = train(cfg, g.ctx(), false, Tensor(), 3, true);
  expect_same(graph, eager);
  EXPECT_EQ(graph.replays, 0);
}

}  // namespace
}  // namespace linac::test_step_graph_gpu
