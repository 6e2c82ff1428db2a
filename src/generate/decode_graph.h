// Decoding steps replayed from a CUDA graph (docs/generate.md "Decoding on the GPU").
//
// A decoding step launches about ten short kernels per layer; at small batch sizes the GPU waits
// on their launches more than it computes. On the GPU, when every mixer's step is graph-safe
// (mixer.h), DecodeGraph captures one Model::decode_step, followed for greedy decoding by
// greedy_pick writing the next step's input ids in place, and replays it for the steps after:
// one launch per token, with no host work between the steps of a greedy run. The first step
// runs eagerly (scratch buffers take their shapes) and the second is captured; a step that would
// grow the state (a KV cache past its capacity, Model::init_decode) runs eagerly and the next is
// captured again, as after any change of the model's buffers (Model::buffers_epoch). A replay
// runs the same kernels on the same data as an eager step: logits and ids are bitwise the same.
// Every mixer's step is graph-safe today (each row's position read on the device, env.decode_pos);
// a model with one that is not, the CPU and a disabled graph run every step eagerly.
#pragma once

#include <cstdint>

#include "core/cuda_graph.h"
#include "model/model.h"

namespace linac {

class DecodeGraph {
 public:
  struct Options {
    bool greedy = false;  // each step ends with tokens = argmax(logits) (kernels/greedy_pick/greedy_pick.h)
    bool graph = true;    // false: every step eager (an A/B switch; `linac bench --generate --no-graph`)
  };
  // tokens [B] int32 and logits [B, vocab]: Model::decode_step's arguments, the same buffers at
  // every step. logprob [B] f64 (greedy, optional): each picked id's log-probability.
  DecodeGraph(Model& model, Model::DecodeState& state, const Tensor& tokens, const Tensor& logits, Options opt,
              const Tensor& logprob = Tensor());
  // Greedy: tokens (and logprob) from the current logits, e.g. the prefill's: the first new ids.
  void pick();
  // logits = decode_step(tokens); greedy: then tokens = the next ids.
  void step();
  // Whether the last step was a replay of the captured graph.
  bool replayed() const { return replayed_; }
  // Whether steps are captured at all here (GPU, graph-safe mixers, Options::graph).
  bool graphs() const { return use_graph_; }

 private:
  void eager_step();
  Model& model_;
  Model::DecodeState& st_;
  Tensor tokens_, logits_, logprob_;
  Options opt_;
  bool use_graph_ = false, replayed_ = false;
  CudaGraph graph_;
  uint64_t graph_epoch_ = 0;  // Model::buffers_epoch when graph_ was captured
  uint64_t warm_epoch_ = ~uint64_t{0};  // ... after the last eager step
};

}  // namespace linac
