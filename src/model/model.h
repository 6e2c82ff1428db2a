// The language model: tokens -> Embedding -> [Block x n_layers] -> RMSNorm -> LM head ->
// fused softmax cross-entropy, with an explicit backward pass (no autodiff).
//
// Block l (pre-norm residual), residual stream R[0..2L] ([B*T, d], residual dtype):
//   R[2l+1] = R[2l]   + Mixer_l(RMSNorm(R[2l]))
//   R[2l+2] = R[2l+1] + SwiGLU_l(RMSNorm(R[2l+1]))
// Sub-layers write their output in the activation dtype; each add happens inside the next norm's
// pass (which reads R[i] and the output, and writes R[i+1] and its normed copy).
// The LM head (model_head.cpp) runs in row chunks (at most kHeadChunkElems logits at a time), so
// the full [B*T, vocab] logits never exist; the cross-entropy kernel turns each chunk of
// logits (f32, or bf16 with ModelOptions::bf16_logits) into its gradient in one pass.
//
// The block norm is RMSNorm with a weight, or SimpleRMSNorm (no parameters) for model.norm
// "srmsnorm"; the channel mixer SwiGLU or SGLU; the embedding output is multiplied by
// model.embed_scale (model/registry.h resolves the architecture's defaults).
//
// Parameter names (checkpoint layout, docs/training.md "Parameter names"):
//   embed.weight [V, d]; layers.<l>.norm1.weight [d]; layers.<l>.attn.* (mixer);
//   layers.<l>.norm2.weight [d]; layers.<l>.mlp.w13 [2F, d], layers.<l>.mlp.w2 [d, F];
//   norm_f.weight [d]; head.weight [V, d] (absent with tie_embeddings). SimpleRMSNorm models have
//   no norm weights.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/profiler.h"
#include "model/env.h"
#include "model/mixer.h"

namespace linac {

// Dtypes for a device and a `train.precision`.
struct Precision {
  DType master, act, resid, stat;
  // `bf16_residual`: the residual stream in bf16 too (train.residual_dtype; bf16 precision on the GPU only).
  static Precision resolve(Device device, const std::string& precision, bool bf16_residual);
};
// The train.precision a model with activations in `act` computes in: "fp32" for a bf16 config on
// the CPU, which computes in its master dtype.
const char* precision_in_effect(DType act);

// How a Model is built. Inference and checks name what they need, e.g.
// {.precision = "fp64"}; a training run's options come from its config once (for_training).
struct ModelOptions {
  std::string precision = "fp32";  // train.precision: bf16 (GPU, mixed), fp32, fp64 (CPU checks)
  bool with_optimizer = false;     // allocate the AdamW moments
  bool allocate = true;            // false: shapes and layout only (`linac info`)
  int zero_world = 1;              // > 1: ZeRO-1 over that many ranks (ParamStore::shard) ...
  int zero_rank = 0;               // ... this process being zero_rank
  bool zero_grads = false;         // ZeRO-2: the gradients sharded too
  bool bf16_logits = false;        // train.logits_dtype bf16 (or auto): the LM head's logits in bf16 under bf16 compute
  bool bf16_residual = false;  // train.residual_dtype bf16 (or auto): the residual stream in bf16 under bf16 compute
  bool documents = false;  // data.packing "document": reserve() sizes for documents what depends on their layout
  // train.precision, train.logits_dtype and train.residual_dtype with the optimizer; train.zero over `world` ranks as
  // `rank` (no sharding with one rank); data.packing.
  static ModelOptions for_training(const Config& cfg, int rank, int world);
};

class Model {
 public:
  // Registers and allocates the parameters (zeroed; call init_params or load them), as `opts`
  // says.
  Model(const ModelConfig& cfg, const Ctx& ctx, const ModelOptions& opts);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  const ModelEnv& env() const { return env_; }
  // Times the model's phases and ops into `p` from now on (core/profiler.h); null stops it.
  void set_profiler(Profiler* p) { env_.ctx.profiler = p; }

  void init_params(uint64_t seed);
  // What the backward recomputes instead of keeping (train.recompute; model/saved_arena.h). Set it
  // before reserve() (a later call reserves again). Gradients do not depend on it, bit for bit.
  void set_recompute(Recompute r);
  Recompute recompute() const { return recompute_; }
  // Allocates activations for micro-batches of up to B sequences of up to T tokens.
  void reserve(int64_t B, int64_t T);

  // tokens, targets: [B, T] int32 on the model's device; targets < 0 are ignored.
  // Returns sum over valid targets of -log p(target). When grad_scale != 0 also runs the
  // backward pass: gradients of grad_scale * (that sum) accumulate into params().grad.
  // hits, when given, receives the number of valid targets that are their row's argmax (accuracy).
  // docs, when given: the rows' document bounds [2, B, T] int32 on the model's device (start,
  // then end: core/doc_bounds.h, data/documents.h computes them): every token sees only its own
  // document (data.packing "document"; UserError for mixers that do not support it).
  double forward_backward(const Tensor& tokens, const Tensor& targets, float grad_scale, double* hits = nullptr,
                          const Tensor& docs = Tensor());
  double forward_loss(const Tensor& tokens, const Tensor& targets, double* hits = nullptr,
                      const Tensor& docs = Tensor()) {
    return forward_backward(tokens, targets, 0.f, hits, docs);
  }
  // forward_backward in two halves, for a step replayed from a CUDA graph (train/train_step.h):
  // the launches (hits, when given, are read back inside), then the read-back of their loss sum
  // (which synchronises).
  void launch_forward_backward(const Tensor& tokens, const Tensor& targets, float grad_scale, const Tensor& docs,
                               double* hits = nullptr);
  double read_loss_sum();
  // Whether every mixer's training forward and backward may be captured into a CUDA graph
  // (Mixer::graph_safe_training), with document bounds or without.
  bool training_graph_safe(bool documents) const;
  // The kind of the first mixer that does not support document packing ("" when all do), and a
  // UserError naming it.
  std::string mixer_without_documents() const;
  void check_documents() const;
  // -log p(target) of each of the last forward's B*T tokens (0 where the target is ignored).
  std::vector<double> token_losses() const;
  // The mixers' auxiliary loss terms of the last forward, summed over its tokens (0 for
  // architectures without any); forward_backward's gradients include them (see mixer.h).
  double aux_loss_sum() const;
  // Once per applied optimizer step: every mixer updates its non-gradient buffers (mixer.h).
  void update_buffers(const std::function<void(const Tensor&)>& sum_ranks);

  // Data-parallel training's hooks into the backward pass (comm/grad_reducer.h). `begin` gets the
  // ids of a group of grad_groups() before the backward writes their first gradient; `ready` gets
  // them when their gradients are final for this call, and whether the next block's token mixer
  // opens a comm window in its backward (Mixer::opens_comm_window); `window` is called there
  // (ModelEnv::open_comm_window). Empty functions remove them.
  void set_grad_hooks(std::function<void(const std::vector<int>&)> begin,
                      std::function<void(const std::vector<int>&, bool)> ready, std::function<void()> window) {
    grad_begin_ = std::move(begin);
    grad_ready_ = std::move(ready);
    env_.comm_window = std::move(window);
  }
  // The parameters by the part of the backward that writes their gradients, in the backward's
  // order: the final norm and the LM head, each block from the last, the embedding. Every
  // parameter is in exactly one group (a tied head is the embedding, written by both ends).
  std::vector<std::vector<int>> grad_groups() const;

  // Decoding one token at a time with constant memory, for architectures whose mixer has a
  // recurrent form (the others throw a UserError naming their mixer). The state holds every
  // layer's mixer state, each row's position and the [B, d] activations of one step.
  struct DecodeState {
    int64_t B = 0;
    int64_t pos = 0;  // tokens consumed
    std::vector<std::unique_ptr<MixerState>> layers;
    // Two residual streams [B, d] (each norm's residual add writes the other), normed [B, d], rstd
    // [B], a sub-layer's output [B, d].
    Buffer x, x2, xn, rstd, y;
    Buffer positions;  // int32 [B] on the model's device: each row's position in its current document
    Tensor positions_tensor() const { return positions.tensor(DType::I32, {B}); }
  };
  // capacity: tokens per row the state holds before a step must grow it (KV caches are sized for
  // them up front; 0 leaves the mixers' defaults). Decoding past it still works.
  DecodeState init_decode(int64_t B, int64_t capacity = 0);
  // tokens_t: [B] int32 on the model's device; logits_out: [B, vocab] (f32 on the GPU, the compute
  // dtype on the CPU), overwritten. Advances every layer's state by one token.
  void decode_step(DecodeState& state, const Tensor& tokens_t, const Tensor& logits_out);
  // Whether every mixer's step is graph-safe (mixer.h), and whether the next step grows the state:
  // a step captured into a CUDA graph replays while the state has room (generate/decode_graph.h).
  bool decode_graph_safe() const;
  bool decode_step_grows(const DecodeState& state) const;
  // The host side of one decode_step whose launches were replayed from a graph: the state's
  // token count and the mixers' host bookkeeping (Mixer::advance) move on by one token.
  void advance_decode(DecodeState& state);
  // Changes whenever a buffer the model's kernels write may have moved (reserve, a scratch
  // buffer grown): a captured CUDA graph holds their addresses.
  uint64_t buffers_epoch() const { return reserves_ + scratch_.allocations(); }
  // Consumes a prompt tokens [B, T] (int32, model's device) in one pass of the training forward
  // (each mixer's prefill), from a fresh state; writes the logits after its last token into
  // logits_last [B, vocab] (dtype as decode_step's). Reserves activations for [B, T] if needed.
  // docs as forward_backward's: the state left is that of each row's last document.
  void prefill(DecodeState& state, const Tensor& tokens, const Tensor& logits_last, const Tensor& docs = Tensor());
  // The next token of `row` starts a new document: its state becomes init_decode's (document
  // packing; UserError for mixers that do not support it).
  void start_document(DecodeState& state, int64_t row);

  int64_t n_params() const { return params_.total_numel(); }
  int64_t n_embedding_params() const;  // embed (+ head when untied)
  // Saved activations of a [B, T] micro-batch under the configured recompute.
  size_t activation_bytes(int64_t B, int64_t T) const;
  // The LM head's scratch for a micro-batch of N tokens: one chunk of logits and, where its dtype
  // differs from theirs, of their gradient.
  size_t head_scratch_bytes(int64_t N) const;
  DType logit_dtype() const;  // the training and evaluation head's logits
  // Elements of one sequence's decoding state after T tokens, over all layers (Mixer::state_elems).
  int64_t state_elems(int64_t T) const;
  double flops_per_token(int64_t T) const;  // training (fwd+bwd) model FLOPs

  struct LayerRow {
    std::string name, kind;
    int64_t params;
  };
  std::vector<LayerRow> layer_table() const;

 private:
  class DocScope;
  struct Block {
    int norm1 = -1, norm2 = -1;
    std::unique_ptr<Mixer> mixer, mlp;
    SavedBuf xn1, xn2, rstd1, rstd2;
    std::vector<int> param_ids;  // every parameter registered by this block
    std::string mixer_fwd, mixer_bwd;  // profile region names: "token mixer forward (<kind>)"
  };
  // The ready hook, for `next` the block whose backward comes next (-1: none).
  void grads_ready(const std::vector<int>& ids, int next) const;
  std::vector<int> head_grad_group() const;  // the final norm's and the LM head's parameters
  void run_head(const Tensor& xf, const Tensor& targets, float grad_scale, const Tensor& dxf, const Tensor& losses,
                const Tensor& hits);
  // logits [n, V] = logit_scale * (x W^T + bias), the head's forward for n rows of x.
  void head_logits(const Tensor& x, const Tensor& logits);
  // The final norm, or a plain cast to the activation dtype without one (residual add as norm_fwd).
  void final_norm_fwd(const Tensor& x, const Tensor& y, const Tensor& rstd, const Tensor& add = Tensor(),
                      const Tensor& h = Tensor()) const;

  // The block norm: RMSNorm with weight `id`, or SimpleRMSNorm when id < 0. x is the residual
  // stream, y the normed activations; the backward ADDS the input gradient into dx. Fused into
  // the norms' passes: the residual add (h = x + add, a sub-layer's output; the norm is h's) and
  // dx_copy, the updated dx in the activation dtype (the next sub-layer's output gradient).
  void norm_fwd(int id, const Tensor& x, const Tensor& y, const Tensor& rstd, const Tensor& add = Tensor(),
                const Tensor& h = Tensor()) const;
  void norm_bwd(int id, const Tensor& x, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                const Tensor& dx_copy = Tensor()) const;
  Tensor resid(int i, int64_t B, int64_t T) const;
  // Whether the training forward's sub-layers add their output to the residual stream in their
  // output GEMM (the stream in the activation dtype: a bf16 stream, or the CPU's f32/f64) rather
  // than in the next norm's pass (an f32 stream under bf16 activations, which the GEMM would have
  // to read and write in f32).
  bool gemm_adds_residual() const { return env_.resid == env_.act; }
  // Re-runs block l's forward (train.recompute "block") so its saved activations are back,
  // without touching the next block's input.
  void recompute_block(int l, int64_t B, int64_t T);
  DType decode_logit_dtype() const;          // decode_step's and prefill's logits
  int64_t head_chunk_rows(int64_t N) const;  // rows of logits per LM head chunk

  ModelConfig cfg_;
  ParamStore params_;
  ScratchPool scratch_;
  SavedArena saved_;
  ModelEnv env_;
  Recompute recompute_ = Recompute::None;
  uint64_t reserves_ = 0;  // reserve() calls (buffers_epoch)
  int embed_ = -1, norm_f_ = -1, head_ = -1, head_bias_ = -1;  // norm ids are -1 for SimpleRMSNorm
  bool has_mlp_ = true;  // false: blocks are x += Mixer(Norm(x)) only (channel_mixer "none")
  bool simple_norm_ = false;
  bool bf16_logits_ = false;  // ModelOptions::bf16_logits under bf16 compute
  double embed_scale_ = 1;  // applied in the model's precision (f32 on the GPU)
  std::vector<Block> blocks_;
  std::vector<SavedBuf> resid_;  // R[0..2L] (R[2l+2] is R[2l+1] without channel mixers)
  SavedBuf xf_, rstd_f_, losses_;
  Buffer ones_logit_, ones_act_;  // [B*T] ones in decoding's logits' and the activations' dtypes (head bias GEMMs)
  std::function<void(const std::vector<int>&)> grad_begin_;
  std::function<void(const std::vector<int>&, bool)> grad_ready_;
  int64_t B_ = 0, T_ = 0;
  int64_t last_tokens_ = 0;  // B*T of the last forward_backward
};

}  // namespace linac
