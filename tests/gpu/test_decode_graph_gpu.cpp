// DecodeGraph on the GPU (bf16, the precision generate runs in): for every registered
// architecture, greedy decoding with steps replayed from a CUDA graph gives bitwise the ids,
// log-probabilities and logits of eager steps, and every architecture's steps after the first
// two are replays (with per-row positions where rings and rotations follow them); a KV cache that grows mid-run (a
// prompt of 250 tokens in the cache's first 256 slots) and a row that starts a new document mid-run keep the equality;
// the step's dependent launches (Ctx::dependent_launches) change no bit of either.
#include <gtest/gtest.h>

#include "generate/decode_graph.h"
#include "model/model.h"
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac::test_decode_graph_gpu {
namespace {

struct Trace {
  std::vector<double> values;  // every step's ids, log-probabilities and logits, in order
  int replays = 0;
};

// Greedy decoding of `steps` tokens after a prompt of P random tokens; row 1 starts a new
// document before step `new_doc` (never when < 0).
Trace decode(Model& model, int64_t B, int64_t P, int steps, bool graph, int64_t capacity, int new_doc) {
  const Ctx& ctx = model.env().ctx;
  const int64_t V = model.config().vocab_size;
  OwnedTensor prompt = to(test::random_tokens(B, P, V, 9), Device::CUDA, DType::I32);
  OwnedTensor tokens(DType::I32, Device::CUDA, {B}), logits(DType::F32, Device::CUDA, {B, V});
  OwnedTensor logprob(DType::F64, Device::CUDA, {B});
  Model::DecodeState st = model.init_decode(B, capacity);
  DecodeGraph dg(model, st, tokens, logits, {.greedy = true, .graph = graph}, logprob);
  model.prefill(st, prompt, logits);
  dg.pick();
  Trace tr;
  for (int i = 0; i < steps; ++i) {
    if (i == new_doc) model.start_document(st, 1);
    dg.step();
    tr.replays += dg.replayed();
    ctx_synchronize(ctx);
    for (const Tensor* t : {&tokens.t, &logprob.t, &logits.t}) {
      const std::vector<double> v = to_doubles(*t);
      tr.values.insert(tr.values.end(), v.begin(), v.end());
    }
  }
  EXPECT_EQ(st.pos, P + steps);
  return tr;
}

TEST(DecodeGraphGpu, ReplaysAreBitwiseEagerSteps) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const ArchInfo& arch : architectures()) {
    SCOPED_TRACE(arch.name);
    Model model(test::gpu_tiny_of(arch), g.ctx(), {.precision = "bf16"});
    model.init_params(3);
    const int steps = 12;
    const Trace eager = decode(model, 3, 37, steps, false, 0, -1);
    const Trace graphed = decode(model, 3, 37, steps, true, 37 + steps, -1);
    EXPECT_EQ(eager.replays, 0);
    EXPECT_EQ(graphed.values, eager.values);
    EXPECT_TRUE(model.decode_graph_safe()) << "every architecture's step replays from a graph";
    EXPECT_EQ(graphed.replays, steps - 2) << "the first step eager, the second captured";
  }
}

// The mixers whose steps index a ring by each row's document position (Transformer-VQ's window,
// Latte-Macchiato's local attention) or rotate by it (Latte's VAPOR), with rings shorter than the
// run (VQ blocks of 16 with a codebook cache filling, a window of 33) and row 1 starting a new
// document mid-run: its position goes back to 0 while row 0's and row 2's run on, in replays too.
TEST(DecodeGraphGpu, RingsAndPositionsPerRowInReplays) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const char* arch : {"transformer_vq", "latte", "latte_macchiato"}) {
    SCOPED_TRACE(arch);
    Model model(test::gpu_config_of(arch), g.ctx(), {.precision = "bf16"});
    model.init_params(6);
    ASSERT_TRUE(model.decode_graph_safe());
    const int steps = 24;
    const Trace eager = decode(model, 3, 37, steps, false, 0, 9);
    const Trace graphed = decode(model, 3, 37, steps, true, 37 + steps, 9);
    EXPECT_EQ(graphed.values, eager.values);
    EXPECT_EQ(graphed.replays, steps - 2);
  }
}

// A kernel of the step that read its inputs before the kernel ahead had written them would
// differ from the step launched in plain stream order, bit for bit.
TEST(DecodeGraphGpu, DependentLaunchesChangeNoBits) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  for (const ArchInfo& arch : architectures()) {
    SCOPED_TRACE(arch.name);
    Model model(test::gpu_tiny_of(arch), g.ctx(), {.precision = "bf16"});
    model.init_params(5);
    const int steps = 10;
    Trace ordered_eager, ordered_graph;
    {
      test::ScopedEnv off("LINAC_DEPENDENT_LAUNCHES", "off");
      ordered_eager = decode(model, 16, 41, steps, false, 0, -1);
      ordered_graph = decode(model, 16, 41, steps, true, 41 + steps, -1);
    }
    EXPECT_EQ(decode(model, 16, 41, steps, false, 0, -1).values, ordered_eager.values);
    EXPECT_EQ(decode(model, 16, 41, steps, true, 41 + steps, -1).values, ordered_graph.values);
  }
}

TEST(DecodeGraphGpu, CacheGrowthAndNewDocumentsMidRun) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext g;
  ModelConfig cfg = test::tiny_model(2, 128, 2, 1000, 256);
  cfg.mixer = {{"kv_heads", 1}};
  Model model(cfg, g.ctx(), {.precision = "bf16"});
  model.init_params(4);
  ASSERT_TRUE(model.decode_graph_safe());
  const int steps = 16;
  // The cache's first 256 slots fill at step 6: that step runs eagerly and grows it, the next is
  // captured again.
  const Trace eager = decode(model, 2, 250, steps, false, 0, 9);
  const Trace graphed = decode(model, 2, 250, steps, true, 0, 9);
  EXPECT_EQ(graphed.values, eager.values);
  EXPECT_EQ(graphed.replays, steps - 4);
}

}  // namespace
}  // namespace linac::test_decode_graph_gpu
