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
#include "dist/grad_reducer.h"
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
    "checkpoint, uses the config stored in it and also prints its training state.\n";
}  // namespace

int cmd_info(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto sets = args.get_all("set");
  const bool as_json = args.flag("json");
  const int64_t ranks = args.get_int("ranks", 1);
  if (ranks < 1 || ranks > 65536) throw UserError("--ranks: expected a number of ranks from 1 to 65536, got " + std::to_string(ranks));
  args.finish();
  const auto pos = args.positionals();
  if (pos.size() != 1) throw UserError("expected one CONFIG.json argument (see --help)");

  const bool is_ckpt = h5::is_hdf5(pos[0]) || std::filesystem::path(pos[0]).extension() == ".h5";
  CheckpointData meta;
  Config cfg;
  if (is_ckpt) {
    meta = CheckpointReader(pos[0]).data();
    json doc = meta.config;
    for (const auto& o : sets) apply_override(doc, o);
    cfg = Config::from_json(doc, pos[0] + ":/config");
  } else {
    cfg = load_config(pos[0], sets);
  }
  const bool gpu = cfg.train.device == "cuda" || (cfg.train.device == "auto" && gpu_available());
  Ctx ctx;
  ctx.device = gpu ? Device::CUDA : Device::CPU;
  const bool zero = cfg.train.zero && ranks > 1;
  Model model(cfg.model, ctx, cfg.train.precision, true, /*allocate=*/false, zero ? static_cast<int>(ranks) : 1, 0,
              cfg.train.zero == 2);
  model.set_recompute(parse_recompute(cfg.train.recompute));
  const ParamStore& ps = model.params();
  const Precision prec = Precision::resolve(ctx.device, cfg.train.precision);

  const int64_t B = cfg.train.micro_batch, T = cfg.data.seq_len;
  const double n = static_cast<double>(ps.total_numel());
  // Per rank, from the store's layout (64-element alignment included): whole buffers, or under
  // ZeRO-1 the replicated group plus one shard of the master (when a compute copy exists) and the
  // moments; gradients and the compute weights stay whole, but for ZeRO-2's gradients (the
  // replicated group, one shard and two staging slots).
  const double flat = static_cast<double>(ps.flat_numel());
  const double held = zero ? static_cast<double>(ps.replicated_numel() + ps.shard_numel()) : flat;
  const double msize = static_cast<double>(dtype_size(prec.master));
  const double master = (prec.act != prec.master ? held : flat) * msize;
  const double copy = prec.act != prec.master ? flat * static_cast<double>(dtype_size(prec.act)) : 0.0;
  const double grads =
      (ps.grads_sharded() ? held + 2.0 * static_cast<double>(GradReducer::stage_slot_numel(ps, model.grad_groups()))
                          : flat) *
      msize;
  const double optim = 2 * held * msize;
  const double acts = static_cast<double>(model.activation_bytes(B, T));
  const double buffers = static_cast<double>(ps.buffer_numel()) * static_cast<double>(dtype_size(prec.master));
  // Scratch that a step holds on top: the LM head's chunk of logits (and their gradient) and, on a
  // GPU, the kernels' workspace (LINAC_WORKSPACE_MB).
  const double head = static_cast<double>(model.head_scratch_bytes(B * T));
  const double workspace = gpu ? static_cast<double>(GpuContext::default_workspace_bytes()) : 0.0;
  const double total = master + copy + grads + optim + buffers + acts + head + workspace;
  const double flops = model.flops_per_token(T);
  // The decoding state of one sequence at the longest length it is used at (MQAR: the longest
  // test slice), in elements and in bytes at 4 bytes per element (the Based paper's axis).
  const int64_t state_T = cfg.data.type == "mqar" ? MqarSet::test(cfg).max_seq_len() : T;
  const int64_t state = model.state_elems(state_T);

  if (as_json) {
    json j = {{"config", pos[0]},
              {"arch", cfg.model.arch},
              {"params", ps.total_numel()},
              {"non_embedding_params", ps.total_numel() - model.n_embedding_params()},
              {"device", device_name(ctx.device)},
              {"micro_batch_tokens", B * T},
              {"ranks", ranks},
              {"zero", zero ? cfg.train.zero : 0},
              {"recompute", cfg.train.recompute},
              {"bytes",
               {{"params", master + copy},
                {"grads", grads},
                {"optimizer", optim},
                {"buffers", buffers},
                {"activations", acts},
                {"head_scratch", head},
                {"workspace", workspace},
                {"total", total}}},
              {"activation_bytes_per_token", acts / static_cast<double>(B * T)},
              {"train_flops_per_token", flops},
              {"decode_state_elements", state},
              {"decode_state_bytes", {{"per_sequence", 4 * state}, {"at_seq_len", state_T}}}};
    json layers = json::array();
    for (const auto& r : model.layer_table()) layers.push_back({{"name", r.name}, {"kind", r.kind}, {"params", r.params}});
    j["layers"] = layers;
    if (is_ckpt)
      j["checkpoint"] = {{"step", meta.state.step}, {"updates", meta.state.updates},
                         {"tokens_seen", meta.state.tokens_seen}, {"world_size", meta.state.world_size}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  const auto& m = cfg.model;
  std::printf("%-11s %s\n", is_ckpt ? "checkpoint" : "config", pos[0].c_str());
  if (is_ckpt)
    std::printf("state       step %lld (%lld updates), %s tokens seen, %lld rank(s)\n",
                static_cast<long long>(meta.state.step), static_cast<long long>(meta.state.updates),
                human_count(static_cast<double>(meta.state.tokens_seen)).c_str(),
                static_cast<long long>(meta.state.world_size));
  std::printf("arch        %s — %s\n", m.arch.c_str(), find_architecture(m.arch, pos[0]).summary.c_str());
  const std::string channel = model_channel_mixer(m) == "none"
                                  ? std::string("no channel mixer")
                                  : model_channel_mixer(m) + " " + std::to_string(m.ffn_dim());
  std::printf("shape       %lld layers, d_model %lld, %lld heads (head dim %lld), %s, vocab %lld, %s embeddings\n",
              static_cast<long long>(m.n_layers), static_cast<long long>(m.d_model), static_cast<long long>(m.n_heads),
              static_cast<long long>(m.head_dim()), channel.c_str(), static_cast<long long>(m.vocab_size),
              m.tie_embeddings ? "tied" : "untied");
  std::printf("parameters  %s total, %s non-embedding\n\n", human_count(n).c_str(),
              human_count(n - static_cast<double>(model.n_embedding_params())).c_str());
  std::printf("  %-22s %-15s %12s\n", "layer", "kind", "params");
  for (const auto& r : model.layer_table())
    std::printf("  %-22s %-15s %12s\n", r.name.c_str(), r.kind.c_str(), human_count(static_cast<double>(r.params)).c_str());

  std::printf("\nmemory plan per %s (%s compute), micro-batch %lld x %lld = %lld tokens, recompute %s%s\n",
              ctx.device == Device::CUDA ? "GPU" : "process", dtype_name(prec.act), static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(B * T), cfg.train.recompute.c_str(),
              zero ? (", ZeRO-" + std::to_string(cfg.train.zero) + " over " + std::to_string(ranks) + " ranks").c_str()
                   : (ranks > 1 ? (", " + std::to_string(ranks) + " ranks, no ZeRO").c_str() : ""));
  std::printf("  %-34s %12s\n", (std::string("parameters (") + dtype_name(prec.master) + " master" +
                                     (copy > 0 ? std::string(" + ") + dtype_name(prec.act) + " copy)" : ")"))
                                        .c_str(),
              human_bytes(master + copy).c_str());
  std::printf("  %-34s %12s\n", "gradients", human_bytes(grads).c_str());
  std::printf("  %-34s %12s\n", "optimizer (AdamW m, v)", human_bytes(optim).c_str());
  if (buffers > 0) std::printf("  %-34s %12s\n", "buffers (e.g. codebooks)", human_bytes(buffers).c_str());
  std::printf("  %-34s %12s  (%s per token)\n", "activations saved for backward", human_bytes(acts).c_str(),
              human_bytes(acts / static_cast<double>(B * T)).c_str());
  std::printf("  %-34s %12s\n", "LM head logits chunk", human_bytes(head).c_str());
  if (workspace > 0) std::printf("  %-34s %12s\n", "kernel workspace", human_bytes(workspace).c_str());
  std::printf("  %-34s %12s\n", "total (plus other scratch)", human_bytes(total).c_str());
  std::printf("\ntraining FLOPs per token at T=%lld: %s (forward + backward)\n", static_cast<long long>(T),
              human_count(flops).c_str());
  std::printf("decode state per sequence at T=%lld: %s elements (%s at 4 bytes each, the Based paper's state size)\n",
              static_cast<long long>(state_T), human_count(static_cast<double>(state)).c_str(),
              human_bytes(4.0 * static_cast<double>(state)).c_str());
  return 0;
}

}  // namespace linac::cli
