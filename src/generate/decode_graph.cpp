#include "generate/decode_graph.h"

#include "greedy_pick/greedy_pick.h"

namespace linac {

DecodeGraph::DecodeGraph(Model& model, Model::DecodeState& state, const Tensor& tokens, const Tensor& logits,
                         Options opt, const Tensor& logprob)
    : model_(model), st_(state), tokens_(tokens), logits_(logits), logprob_(logprob), opt_(opt) {
  LINAC_CHECK(!logprob.ptr || opt.greedy, "DecodeGraph: logprob comes with greedy picks");
  use_graph_ = opt.graph && model.env().ctx.is_gpu() && model.decode_graph_safe();
}

void DecodeGraph::pick() {
  LINAC_CHECK(opt_.greedy, "DecodeGraph::pick: greedy decoding only");
  // Right after the step's last kernel, as the step's own launches (Model::decode_step).
  Ctx ctx = model_.env().ctx;
  ctx.dependent_launches = dependent_launches_available(ctx);
  greedy_pick(ctx, logits_, tokens_, logprob_);
}

void DecodeGraph::eager_step() {
  model_.decode_step(st_, tokens_, logits_);
  if (opt_.greedy) pick();
}

void DecodeGraph::step() {
  replayed_ = false;
  if (!use_graph_) return eager_step();
  const Ctx& ctx = model_.env().ctx;
  if (graph_.captured() && graph_epoch_ != model_.buffers_epoch()) graph_.reset();
  if (model_.decode_step_grows(st_)) {
    graph_.reset();
    eager_step();
    warm_epoch_ = model_.buffers_epoch();
    return;
  }
  if (graph_.captured()) {
    model_.advance_decode(st_);
    graph_.launch(ctx);
    replayed_ = true;
    return;
  }
  if (warm_epoch_ != model_.buffers_epoch()) {
    eager_step();
    warm_epoch_ = model_.buffers_epoch();
    return;
  }
  // The capture runs the step's host side (its bookkeeping advances here) and records its launches.
  graph_.capture(ctx, [&] { eager_step(); });
  graph_epoch_ = model_.buffers_epoch();
  graph_.launch(ctx);
}

}  // namespace linac
