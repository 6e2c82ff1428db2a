// Mixer: the interface of a block's sub-layers — token mixers (attention, GLA, ...) and
// channel mixers (SwiGLU). Blocks are pre-norm residual:
//   x += Mixer(Norm(x));  x += ChannelMixer(Norm(x))
//
// forward(x, out, add): out = f(x), or out = add + f(x) when `add` [B, T, d] (out's dtype, not
//                    overlapping out, or out itself) is defined. x is the normed input [B, T, d]
//                    (activation dtype) and stays valid (unchanged) until backward; out [B, T, d]
//                    is overwritten. The model passes the residual stream R[i] as `add` and
//                    R[i+1] as out where the stream has the activation dtype, so the output
//                    projection's GEMM adds it in its epilogue (matmul_add) and no pass of its own
//                    reads and writes the stream; with an f32 stream it adds out inside the next
//                    norm's pass (rmsnorm.h's residual add) instead, so the output projection
//                    writes bf16 once rather than reading and writing f32.
// backward(x, dy, dx): dy = dL/d(out) [B, T, d] (activation dtype); writes dx = dL/dx
//                    (overwrite) and accumulates parameter gradients.
// reserve(B, T):     takes what forward saves for backward from env.saved (SavedArena), once,
//                    for the largest shape. Activation recompute re-runs forward on the same x
//                    right before backward (into a scratch `out`), so forward must depend only on
//                    x and the parameters and must not accumulate state across calls.
// init_state(B), step(state, x_t, out_t): decoding one token at a time with constant memory,
//                    for mixers with a recurrent form: x_t [B, d] and out_t [B, d] (activation
//                    dtype, overwritten like forward's out). Mixers without one
//                    (softmax attention) keep the defaults, which throw a UserError naming them;
//                    position-wise mixers (SwiGLU) decode through forward on [B, 1, d].
// graph_safe_step(): step() launches the same kernels with the same arguments at every call
//                    while step_grows(state) is false: nothing it launches depends on a host-side
//                    position (positions come from env.decode_pos on the device), it neither
//                    synchronises nor allocates, and its host-side bookkeeping is advance(state).
//                    A CUDA graph captured from one step then replays every later one
//                    (generate/decode_graph.h). reserve_state(state, n) makes room for n tokens
//                    per row up front, so that no step grows the state.
// graph_safe_training(documents): forward() and backward() of a training micro-batch (with
//                    document bounds or without) neither synchronise with the host nor read
//                    anything on it, and launch the same kernels with the same arguments for
//                    the same inputs, buffers and grad_scale: a training step's forward and
//                    backward then replay from a CUDA graph (train/train_step.h). True unless
//                    a mixer says otherwise.
// prefill(state, x, out): out = f(x) for a prompt x [B, T, d] (as forward) and leaves `state` as
//                    T calls of step would, starting from a fresh init_state (Model::prefill
//                    guarantees it): every mixer with a recurrent form runs its training forward
//                    and hands the state over from what that forward computed (its final chunked
//                    state, or the prompt's last keys and values), rather than stepping T times.
//                    Needs reserve(B, T).
// Documents (data.packing "document", docs/data.md): while env.docs is defined, forward and
//                    backward treat every row of [B, T] as documents back to back (core/doc_bounds.h):
//                    no token depends on a token of another document, positions restart at 0 at
//                    each document, recurrent states start empty there. supports_documents() says
//                    whether the mixer does; start_document(state, b) makes row b of a decoding
//                    state what init_state would give it (the next token starts a document), and
//                    prefill leaves the state of the prompt's last document.
// aux_loss_sum():    the sum over the last forward's tokens of the mixer's auxiliary loss terms,
//                    already weighted (e.g. Transformer-VQ's beta * commitment loss); the backward
//                    adds their gradient scaled by the same grad_scale as the language-model loss,
//                    so a step minimises (LM loss sum + aux loss sum) / targets.
// update_buffers(sum_ranks): once per applied optimizer step, after all of its backward passes:
//                    updates the mixer's non-gradient state (buffers registered with
//                    ParamStore::add_buffer, e.g. EMA codebooks) from statistics gathered during
//                    the step; sum_ranks(t) sums a contiguous f32/f64 tensor over the
//                    data-parallel ranks in place, so every rank applies the same update.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/env.h"

namespace linac {

// A mixer's decoding state (e.g. GLA's per-head Dk x Dv matrices); owned by the caller.
struct MixerState {
  virtual ~MixerState() = default;
};

// The length of each row's last document in a [B, T] prefill (T for every row without documents):
// the position a row decodes on from.
std::vector<int64_t> last_doc_lengths(const ModelEnv& env, int64_t B, int64_t T);
// Whether every row of a decoding state sits at the same position (then they decode in one call).
bool rows_agree(const std::vector<int64_t>& pos);
// forward's `add` as the [N, d] addend of the output projection's matmul_add (empty stays empty).
inline Tensor addend_rows(const Tensor& add, int64_t N, int64_t d) { return add.ptr ? add.view({N, d}) : Tensor(); }

class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual std::string kind() const = 0;
  virtual void reserve(int64_t B, int64_t T) = 0;
  virtual void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) = 0;
  virtual void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) = 0;
  // forward() where no backward follows (a position-wise mixer's part of a decoding step): the
  // same out, but what only backward() reads need not be kept.
  virtual void forward_no_grad(const Tensor& x, const Tensor& out) { forward(x, out); }
  // Bytes saved between forward and backward for a [B, T] micro-batch.
  virtual size_t activation_bytes(int64_t B, int64_t T) const = 0;
  // Training FLOPs per token (forward + backward) at sequence length T, for MFU.
  virtual double flops_per_token(int64_t T) const = 0;
  // Elements of one sequence's decoding state after T tokens (KV cache, recurrent sums, window
  // ring, convolution inputs), counted as the Based paper counts state size (its §3.5 and App.
  // E.2: attention 2dT, a window 2d min(T, w), linear attention its state matrices); scratch
  // excluded. Position-wise mixers keep none.
  virtual int64_t state_elems(int64_t T) const {
    (void)T;
    return 0;
  }
  // True when backward() calls env.open_comm_window() (model/env.h) once, right before a long
  // kernel of many short-lived CTAs: gradient reductions of the blocks above wait for it.
  virtual bool opens_comm_window() const { return false; }
  virtual bool supports_documents() const { return false; }
  virtual void start_document(MixerState& state, int64_t row) {
    (void)state, (void)row;
    throw UserError("the '" + kind() + "' mixer does not support data.packing \"document\"");
  }
  virtual double aux_loss_sum() const { return 0; }
  virtual void update_buffers(const std::function<void(const Tensor&)>& sum_ranks) { (void)sum_ranks; }
  virtual std::unique_ptr<MixerState> init_state(int64_t B) {
    (void)B;
    throw UserError("the '" + kind() + "' mixer has no recurrent form: it cannot decode token by token");
  }
  virtual void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) {
    (void)state, (void)x_t, (void)out_t;
    throw UserError("the '" + kind() + "' mixer has no recurrent form: it cannot decode token by token");
  }
  virtual void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
    (void)ctx, (void)state, (void)x, (void)out;
    throw UserError("the '" + kind() + "' mixer has no recurrent form: it cannot decode token by token");
  }
  virtual bool graph_safe_step() const { return false; }
  virtual bool graph_safe_training(bool documents) const {
    (void)documents;
    return true;
  }
  // Whether the next step() reallocates the state, moving its buffers.
  virtual bool step_grows(const MixerState& state) const {
    (void)state;
    return false;
  }
  virtual void reserve_state(MixerState& state, int64_t tokens) { (void)state, (void)tokens; }
  // What a step does on the host besides its launches (e.g. advance host-side positions).
  virtual void advance(MixerState& state) { (void)state; }
};

}  // namespace linac
