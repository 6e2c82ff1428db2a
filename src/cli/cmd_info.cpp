// linac info CONFIG: parameter counts, the layer table and the memory plan.
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "config/config.h"
#include "core/gpu.h"
#include "data/hdf5_util.h"
#include "data/mqar.h"
#include "data/tokenizer.h"
#include "comm/grad_reducer.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/saved_arena.h"
#include "train/checkpoint.h"

namespace linac::cli {

namespace {
const char* kUsage =
    "usage: linac info CONFIG.json|CHECKPOINT.h5 [--set key.path=value]... [--ranks N] [--json]\n\n"
    "Prints the parameter count (total / non-embedding), the layer table and the memory plan per\n"
    "GPU (parameters, gradients, optimizer state, activations saved for the backward under\n"
    "train.recompute, the LM head's chunk of logits and, on a GPU, the kernels' workspace) for the\n"
    "configured micro-batch of train.micro_batch x data.seq_len tokens, on the device the config\n"
    "would train on. --ranks N (default 1) plans for N data-parallel ranks:\n"
    "with train.zero 1 the master weights and AdamW moments are split over them (ZeRO-1), with 2\n"
    "the gradients too (ZeRO-2: a shard each, plus two staging slots of a block's gradients). Given a\n"
    "checkpoint, uses the config stored in it (--set may change its data and train keys, for the\n"
    "memory plan, not its model) and also prints its training state and tokenizer.\n";
// What `info` reports, computed once for both outputs.
struct Info {
  std::string source;
  bool is_ckpt = false, gpu = false, zero = false;
  int64_t ranks = 1, B = 0, T = 0;
  CheckpointData meta;
  Config cfg;
  Precision prec{};
  DType logits = DType::F32;  // the LM head's logits (train.logits_dtype under bf16 compute)
  // Bytes per rank.
  double master = 0, copy = 0, grads = 0, optim = 0, buffers = 0, acts = 0, head = 0, workspace = 0, total = 0;
  double flops = 0;
  int64_t state_T = 0, state = 0;
  std::string documents_ok;  // empty, or why data.packing "document" cannot be used
};

// The memory plan per rank, from the store's layout (64-element alignment included): whole
// buffers, or under ZeRO-1 the replicated group plus one shard of the master (when a compute copy
// exists) and the moments; gradients and the compute weights stay whole, but for ZeRO-2's
// gradients (the replicated group, one shard and two staging slots). Then the scratch a step
// holds on top: the LM head's chunk of logits (and their gradient) and, on a GPU, the kernels'
// workspace (LINAC_WORKSPACE_MB).
void plan_memory(const Model& model, Info& in) {
  const ParamStore& ps = model.params();
  const double flat = static_cast<double>(ps.flat_numel());
  const double held = in.zero ? static_cast<double>(ps.replicated_numel() + ps.shard_numel()) : flat;
  const double msize = static_cast<double>(dtype_size(in.prec.master));
  in.master = (in.prec.act != in.prec.master ? held : flat) * msize;
  in.copy = in.prec.act != in.prec.master ? flat * static_cast<double>(dtype_size(in.prec.act)) : 0.0;
  const double staged = 2.0 * static_cast<double>(GradReducer::stage_slot_numel(ps, model.grad_groups()));
  in.grads = (ps.grads_sharded() ? held + staged : flat) * msize;
  in.optim = 2 * held * msize;
  in.acts = static_cast<double>(model.activation_bytes(in.B, in.T));
  in.buffers = static_cast<double>(ps.buffer_numel()) * msize;
  in.head = static_cast<double>(model.head_scratch_bytes(in.B * in.T));
  in.logits = model.logit_dtype();
  in.workspace = in.gpu ? static_cast<double>(GpuContext::default_workspace_bytes()) : 0.0;
  in.total = in.master + in.copy + in.grads + in.optim + in.buffers + in.acts + in.head + in.workspace;
}

void print_json(const Model& model, const Info& in) {
  const ParamStore& ps = model.params();
  json j = {{"config", in.source},
            {"model", in.cfg.to_json()["model"]},
            {"arch", in.cfg.model.arch},
            {"params", ps.total_numel()},
            {"non_embedding_params", ps.total_numel() - model.n_embedding_params()},
            {"device", device_name(in.gpu ? Device::CUDA : Device::CPU)},
            {"micro_batch_tokens", in.B * in.T},
            {"ranks", in.ranks},
            {"zero", in.zero ? in.cfg.train.zero : 0},
            {"recompute", in.cfg.train.recompute},
            {"packing", in.cfg.data.packing},
            {"logits_dtype", dtype_name(in.logits)},
            {"residual_dtype", dtype_name(in.prec.resid)},
            {"documents_supported", in.documents_ok.empty()},
            {"bytes",
             {{"params", in.master + in.copy},
              {"grads", in.grads},
              {"optimizer", in.optim},
              {"buffers", in.buffers},
              {"activations", in.acts},
              {"head_scratch", in.head},
              {"workspace", in.workspace},
              {"total", in.total}}},
            {"activation_bytes_per_token", in.acts / static_cast<double>(in.B * in.T)},
            {"train_flops_per_token", in.flops},
            {"decode_state_elements", in.state},
            {"decode_state_bytes", {{"per_sequence", 4 * in.state}, {"at_seq_len", in.state_T}}}};
  json layers = json::array();
  for (const auto& r : model.layer_table()) layers.push_back({{"name", r.name}, {"kind", r.kind}, {"params", r.params}});
  j["layers"] = layers;
  if (in.is_ckpt)
    j["checkpoint"] = {{"step", in.meta.state.step}, {"updates", in.meta.state.updates},
                       {"tokens_seen", in.meta.state.tokens_seen}, {"world_size", in.meta.state.world_size},
                       {"tokenizer", !in.meta.tokenizer.empty()}};
  std::printf("%s\n", j.dump(2).c_str());
}

void print_model(const Model& model, const Info& in) {
  const auto& m = in.cfg.model;
  const double n = static_cast<double>(model.params().total_numel());
  std::printf("%-11s %s\n", in.is_ckpt ? "checkpoint" : "config", in.source.c_str());
  if (in.is_ckpt)
    std::printf("state       step %lld (%lld updates), %s tokens seen, %lld rank(s)\n",
                static_cast<long long>(in.meta.state.step), static_cast<long long>(in.meta.state.updates),
                human_count(static_cast<double>(in.meta.state.tokens_seen)).c_str(),
                static_cast<long long>(in.meta.state.world_size));
  if (in.is_ckpt) {
    if (in.meta.tokenizer.empty())
      std::printf("tokenizer   none (token-id data or an imported tokenizer.json model: generate --prompt-ids)\n");
    else
      std::printf("tokenizer   SentencePiece, %lld pieces\n",
                  static_cast<long long>(Tokenizer::from_bytes(in.meta.tokenizer, in.source).vocab_size()));
  }
  std::printf("arch        %s — %s\n", m.arch.c_str(), find_architecture(m.arch, in.source).summary.c_str());
  const std::string channel = model_channel_mixer(m) == "none"
                                  ? std::string("no channel mixer")
                                  : model_channel_mixer(m) + " " + std::to_string(m.ffn_dim());
  // Grouped-query attention: the primary mixer's key/value heads.
  const int64_t kv = m.mixer.is_object() && m.mixer.contains("kv_heads") ? m.mixer["kv_heads"].get<int64_t>() : 0;
  const std::string kv_heads = kv > 0 && kv != m.n_heads ? ", " + std::to_string(kv) + " key/value heads" : "";
  std::printf("shape       %lld layers, d_model %lld, %lld heads (head dim %lld%s), %s, vocab %lld, %s embeddings\n",
              static_cast<long long>(m.n_layers), static_cast<long long>(m.d_model), static_cast<long long>(m.n_heads),
              static_cast<long long>(m.head_dim()), kv_heads.c_str(), channel.c_str(),
              static_cast<long long>(m.vocab_size), m.tie_embeddings ? "tied" : "untied");
  std::printf("parameters  %s total, %s non-embedding\n", human_count(n).c_str(),
              human_count(n - static_cast<double>(model.n_embedding_params())).c_str());
  // What data.packing "document" would meet: every token mixer must support it.
  std::printf("packing     %s (document packing: %s)\n\n", in.cfg.data.packing.c_str(),
              in.documents_ok.empty() ? "supported" : in.documents_ok.c_str());
  std::printf("  %-22s %-15s %12s\n", "layer", "kind", "params");
  for (const auto& r : model.layer_table())
    std::printf("  %-22s %-15s %12s\n", r.name.c_str(), r.kind.c_str(), human_count(static_cast<double>(r.params)).c_str());
}

void print_plan(const Info& in) {
  const std::string ranks = in.zero ? ", ZeRO-" + std::to_string(in.cfg.train.zero) + " over " + std::to_string(in.ranks) + " ranks"
                            : in.ranks > 1 ? ", " + std::to_string(in.ranks) + " ranks, no ZeRO"
                                           : "";
  std::printf("\nmemory plan per %s (%s compute), micro-batch %lld x %lld = %lld tokens, recompute %s%s\n",
              in.gpu ? "GPU" : "process", dtype_name(in.prec.act), static_cast<long long>(in.B),
              static_cast<long long>(in.T), static_cast<long long>(in.B * in.T), in.cfg.train.recompute.c_str(),
              ranks.c_str());
  const std::string params = std::string("parameters (") + dtype_name(in.prec.master) + " master" +
                             (in.copy > 0 ? std::string(" + ") + dtype_name(in.prec.act) + " copy)" : ")");
  std::printf("  %-34s %12s\n", params.c_str(), human_bytes(in.master + in.copy).c_str());
  std::printf("  %-34s %12s\n", "gradients", human_bytes(in.grads).c_str());
  std::printf("  %-34s %12s\n", "optimizer (AdamW m, v)", human_bytes(in.optim).c_str());
  if (in.buffers > 0) std::printf("  %-34s %12s\n", "buffers (e.g. codebooks)", human_bytes(in.buffers).c_str());
  const std::string acts = std::string("activations saved (") + dtype_name(in.prec.resid) + " residual stream)";
  std::printf("  %-34s %12s  (%s per token)\n", acts.c_str(), human_bytes(in.acts).c_str(),
              human_bytes(in.acts / static_cast<double>(in.B * in.T)).c_str());
  std::printf("  %-34s %12s\n", (std::string("LM head logits chunk, ") + dtype_name(in.logits)).c_str(),
              human_bytes(in.head).c_str());
  if (in.workspace > 0) std::printf("  %-34s %12s\n", "kernel workspace", human_bytes(in.workspace).c_str());
  std::printf("  %-34s %12s\n", "total (plus other scratch)", human_bytes(in.total).c_str());
  std::printf("\ntraining FLOPs per token at T=%lld: %s (forward + backward)\n", static_cast<long long>(in.T),
              human_count(in.flops).c_str());
  std::printf("decode state per sequence at T=%lld: %s elements (%s at 4 bytes each, the Based paper's state size)\n",
              static_cast<long long>(in.state_T), human_count(static_cast<double>(in.state)).c_str(),
              human_bytes(4.0 * static_cast<double>(in.state)).c_str());
}

// What info prints for the loaded config (or checkpoint) in `in`.
int describe(Info& in, bool as_json) {
  const Config& cfg = in.cfg;
  in.gpu = cfg.train.device == "cuda" || (cfg.train.device == "auto" && gpu_available());
  in.zero = cfg.train.zero && in.ranks > 1;
  Ctx ctx;
  ctx.device = in.gpu ? Device::CUDA : Device::CPU;
  ModelOptions opts = ModelOptions::for_training(cfg, 0, static_cast<int>(in.ranks));
  opts.allocate = false;
  Model model(cfg.model, ctx, opts);
  model.set_recompute(parse_recompute(cfg.train.recompute));
  in.prec = Precision::resolve(ctx.device, cfg.train.precision, opts.bf16_residual);
  in.B = cfg.train.micro_batch;
  in.T = cfg.data.seq_len;
  plan_memory(model, in);
  in.flops = model.flops_per_token(in.T);
  if (const std::string kind = model.mixer_without_documents(); !kind.empty())
    in.documents_ok = "not supported by the '" + kind + "' mixer";
  // The decoding state of one sequence at the longest length it is used at (MQAR: the longest
  // test slice), in elements and in bytes at 4 bytes per element (the Based paper's axis).
  in.state_T = cfg.data.type == "mqar" ? MqarSet::test(cfg.data.mqar, cfg.model.vocab_size).max_seq_len() : in.T;
  in.state = model.state_elems(in.state_T);
  if (as_json) {
    print_json(model, in);
  } else {
    print_model(model, in);
    print_plan(in);
  }
  return 0;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto sets = args.get_all("set");
  const bool as_json = args.flag("json");
  Info in;
  in.ranks = args.get_int("ranks", 1);
  if (in.ranks < 1 || in.ranks > 65536)
    throw UserError("--ranks: expected a number of ranks from 1 to 65536, got " + std::to_string(in.ranks));
  const auto pos = args.positionals();
  args.finish();
  if (pos.size() != 1) throw UserError("expected one CONFIG.json argument (see --help)");
  in.source = pos[0];

  in.is_ckpt = is_checkpoint_path(in.source);
  if (in.is_ckpt) {
    // A checkpoint's model is the one its weights were trained as; its run settings may be
    // planned otherwise (train.micro_batch, train.zero with --ranks, ...).
    for (const auto& o : sets)
      if (o.rfind("model.", 0) == 0 || o.rfind("model=", 0) == 0)
        throw UserError("--set " + o +
                        ": a checkpoint's model is the one its weights were trained as (--set model "
                        "keys apply to a CONFIG)");
    in.meta = CheckpointReader(in.source).data();
    in.cfg = Config::from_json_with_sets(in.meta.config, in.source + ":/config", sets);
  } else {
    in.cfg = load_config(in.source, sets);
  }
  return blaming_sets(in.cfg, [&] { return describe(in, as_json); });
}

}  // namespace linac::cli
