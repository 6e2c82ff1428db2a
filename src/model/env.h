// ModelEnv: what every module of a model shares — the execution context, the parameters,
// the dtypes in use, the arena of saved activations and a pool of scratch buffers for
// temporaries that do not outlive one sub-layer's forward or backward.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "core/buffer.h"
#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "model/param_store.h"
#include "model/saved_arena.h"

namespace linac {

// Scratch tensors by key. A key's buffer grows to the largest request; it is allocated during
// the first step (shapes are fixed afterwards), so no allocation happens in steady state.
// A tensor from get() is valid until the next get() of the same key.
class ScratchPool {
 public:
  explicit ScratchPool(Device d) : device_(d) {}
  Tensor get(const std::string& key, DType dt, const std::vector<int64_t>& dims);
  size_t bytes() const;
  // How many times get() has (re)allocated a buffer: tensors taken before may have moved since.
  uint64_t allocations() const { return allocations_; }

 private:
  Device device_;
  std::map<std::string, Buffer> bufs_;
  uint64_t allocations_ = 0;
};

struct ModelEnv {
  Ctx ctx;
  ParamStore* params = nullptr;
  DType act = DType::F32;    // activations (bf16 on the GPU in mixed precision)
  DType resid = DType::F32;  // residual stream and its gradient (f32 on the GPU)
  DType stat = DType::F32;   // saved statistics (rstd, lse): f32 on the GPU, act on the CPU
  ScratchPool* scratch = nullptr;
  // Where modules take their saved activations in reserve() (model/saved_arena.h).
  SavedArena* saved = nullptr;
  // grad_scale of the forward_backward in progress: mixers with auxiliary losses scale those
  // losses' gradients by it, as the language-model loss's are (mixer.h).
  float grad_scale = 0;
  // Passes may come with documents (ModelOptions::documents): reserve() sizes for them what depends
  // on their layout.
  bool documents = false;
  // The document bounds of the forward_backward or prefill in progress (mixer.h), on the model's
  // device; undefined for stream packing and while decoding.
  DocBounds docs;
  // What mixers derive from `docs` and share within the pass, by key (VQ-attention's placement of
  // the documents: one read-back of the bounds per pass instead of one per layer and direction);
  // emptied whenever docs is set or cleared.
  std::map<std::string, int64_t> docs_derived;
  // During Model::decode_step: each row's position in its current document (int32 [B], the
  // model's device), for mixers that rotate or index by position without reading it on the host.
  Tensor decode_pos;
  // Set by data-parallel training while it reduces gradients during the backward (Model::
  // set_grad_hooks): mixers whose opens_comm_window() is true call open_comm_window() once in
  // backward(), right before their longest kernel made of many short-lived CTAs (attention's
  // backward; GLA's chunk kernels, after its reverse state scan: GlaOpts::after_reverse_scan).
  // Gradient reductions waiting for a window start there and share the GPU with that kernel
  // instead of stalling a persistent GEMM (comm/grad_reducer.h).
  std::function<void()> comm_window;
  void open_comm_window() const {
    if (comm_window) comm_window();
  }
  Device device() const { return ctx.device; }
};

}  // namespace linac
