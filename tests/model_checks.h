// Whole-model checks on the CPU: the gradient check in double against central differences,
// decoding token by token against the full-sequence forward, a tiny model learning a task that
// needs token mixing, and a checkpoint round trip. tests/cpu/test_model.cpp runs them for every
// registered architecture (its table holds each one's tiny configs and task); other tests call
// them for configs of their own.
#pragma once

#include <functional>
#include <string>

#include "config/config.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "model/param_store.h"
#include "model/registry.h"

namespace linac {
class Model;
struct StepStats;
}  // namespace linac

namespace linac::test {

// A small Transformer++ (or `arch` with its defaults): the shape most framework tests use.
ModelConfig tiny_model(int64_t n_layers, int64_t d_model, int64_t n_heads, int64_t vocab, int64_t ffn_hidden,
                       const std::string& arch = "transformer");

// A tiny config (d 16, 2 heads) of a registered architecture with its default layer pattern and
// mixer options, for checks that cover every architecture (one added later is covered at once).
ModelConfig tiny_config_of(const ArchInfo& arch);

// [B, T] int32 tokens uniform in [0, V) on the CPU.
OwnedTensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed);

// Norm weights (init 1), biases (init 0) and given tables (Init::Values) start at special values;
// gives them random values around those so their gradients are generic.
void perturb_special_init(ParamStore& ps);

// Builds cfg in fp64, initialises it (perturb_special_init included), and checks that every
// parameter gets a nonzero gradient which matches central differences at n_probe entries
// (relative error < 1e-5). B x T random tokens; one target is ignored.
void check_model_gradients(const ModelConfig& cfg, int64_t B, int64_t T, size_t n_probe);

// Builds cfg in fp64 and checks that decode_step, token by token, gives the same per-position
// negative log-likelihoods as the full-sequence forward (max abs difference < tol). With
// prompt > 0 the first `prompt` tokens go through Model::prefill (its logits score position
// prompt - 1) and decoding goes on from there.
void check_decode_matches_forward(const ModelConfig& cfg, int64_t B, int64_t T, double tol = 1e-10,
                                  int64_t prompt = 0);

// Activation recompute (train.recompute) changes memory, never results: builds cfg on ctx in
// `precision` three times (recompute none, mixer, block) from the same weights, accumulates two
// micro-batches of B x T random tokens, and expects the same losses and auxiliary losses and the
// same gradient bytes; also that the saved activations shrink (none > mixer > block).
void check_recompute_identical(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B,
                               int64_t T);

// Gradient accumulation after a skipped step: builds cfg on ctx in `precision`; the gradients of
// two micro-batches of B x T random tokens, each alone after zero_grad, must add up (within tol
// of their magnitudes, per parameter) to the two accumulated after zero_grad, once every
// parameter's gradient held NaN (what a step with non-finite gradients leaves; the padding stays
// zero). A gradient that zero_grad leaves to its producers (ParamStore::grad_write) and is read or
// added to before its first write brings the NaN through; a first write in the second
// micro-batch loses the first's share.
void check_accumulation_after_nan(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B,
                                  int64_t T, double tol);

// The step's gradient norm (TrainStep, train/grad_squares.h: its sums of squares taken group by
// group during the last micro-batch's backward): builds cfg on ctx in `precision` for training,
// runs three steps of two micro-batches of B x T random tokens (on a GPU: eager, captured,
// replayed) and expects each step's norm within tol (relative) of the one train/optimizer.h's
// grad_norm takes over the whole gradient buffer after it.
void check_step_grad_norm(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, int64_t B, int64_t T,
                          double tol);

// Builds full.model on ctx for training as full.train says, from init_params(7), and runs
// full.train.steps steps (TrainStep) of the same two micro-batches of B x T random tokens, calling
// each(step, stats, model) after every step. Returns the micro-batches replayed from a captured
// graph.
int64_t train_two_micro_batch_steps(const Config& full, const Ctx& ctx, int64_t B, int64_t T,
                                    const std::function<void(int, const StepStats&, Model&)>& each);

// Saving and loading: builds cfg (fp32, AdamW), takes one training step on B x T random tokens
// (so the moments and any buffers hold values of their own), writes a checkpoint under dir, and
// builds a second model from the config the checkpoint recorded: it must record cfg's model,
// and loading must give the same parameters, moments and buffers bit for bit and the same loss
// (and auxiliary loss) on a batch.
void check_checkpoint_round_trip(const ModelConfig& cfg, int64_t B, int64_t T, const std::string& dir);

// Fills one step's tokens and targets ([B, T] each; targets < 0 are ignored) and returns the
// number of scored targets.
using TaskBatch = std::function<int64_t(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T)>;
// Sequences [a_1..a_h, a_1..a_h] with T = 2h: only second-half targets are scored (an induction
// head learns it).
int64_t copy_task(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T, int64_t V);
// The target at position t is the token at t-1.
int64_t previous_token_task(Rng& rng, int32_t* tokens, int32_t* targets, int64_t B, int64_t T, int64_t V);

// Trains cfg (fp32, AdamW per tc) for tc.steps steps on B x T batches from `task` with
// Rng{42, data_stream, 0}; expects the first loss near log(vocab) and the last below max_final_loss.
void check_tiny_model_learns(const ModelConfig& cfg, const TrainConfig& tc, int64_t B, int64_t T,
                             uint64_t data_stream, const TaskBatch& task, double max_final_loss);

}  // namespace linac::test
