// linac bench: times full training steps (forward, backward, optimizer) on random tokens, or
// single ops (--op), with device events after warm-up. Every performance figure in
// docs/performance.md comes from here.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>

#include "cli/args.h"
#include "cli/bench_generate.h"
#include "cli/bench_ops.h"
#include "cli/bench_profile.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/rng.h"
#include "data/documents.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "train/gemm_algo_table.h"
#include "train/train_step.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac bench CONFIG.json [--seq-lens T1,T2,...] [--tokens-per-step N] [--micro-tokens N]\n"
    "                   [--steps N] [--warmup N] [--doc-len L] [--profile] [--no-graph] [--set key.path=value]...\n"
    "                   [--tune-gemms FILE [--tune-steps N]] [--json]\n"
    "       linac bench --op attention|attention_decode|gla|latte|lightning|short_conv|taylor|vq_attn"
    " [--seq-lens ...]\n"
    "                   [--tokens N] [--heads H] [--kv-heads K] [--head-dim D] [--dk Dk --dv Dv] [--feature-dim F]\n"
    "                   [--window W] [--doc-len L] [--latents L (latte, per head; default 16) --macchiato]\n"
    "                   [--codes S --block Lb (vq_attn)] [--channels C --width W] [--dtype bf16|fp32]\n"
    "                   [--iters N] [--json]\n"
    "       linac bench --generate CONFIG.json|CKPT.h5 [--batch 1,16,128] [--prompt-len 512] [--gen-len 1024]\n"
    "                   [--no-graph] [--device auto|cpu|gpu] [--set key.path=value]... [--json]\n\n"
    "Model mode: for each sequence length T (default: data.seq_len), times --steps steps (default 5)\n"
    "of --tokens-per-step tokens (default: one micro-batch of train.micro_batch x data.seq_len) split\n"
    "into micro-batches of --micro-tokens (default: the same), on random tokens, after --warmup\n"
    "steps (default 2); reports tokens/s, MFU\n"
    "(model FLOPs over the GPU's dense bf16 peak), GPU memory in use (device-wide) and peak memory (the\n"
    "most linac's own buffers held at once on this rank: parameters, gradients, optimizer state, saved\n"
    "activations, scratch; train.recompute and train.zero change it). On a CPU-only machine it times the\n"
    "CPU path, prints no MFU and reports peak host memory. --profile then runs --steps more steps\n"
    "with every phase (embedding, norms, each token mixer's forward and backward, channel mixers, LM\n"
    "head and loss, gradient all-reduce, optimizer) and op family (GEMM, attention, cross-entropy)\n"
    "timed by device events (each kernel launched on its own), and prints where a step's time goes.\n"
    "On one GPU the timed steps replay each micro-batch's forward and backward from a CUDA graph where\n"
    "the mixers allow it (train.cuda_graph); --no-graph launches every kernel on its own.\n"
    "--tune-gemms FILE first runs --tune-steps eager steps (default 32) per T in which each GEMM problem's\n"
    "calls go round cuBLASLt's first 8 candidate algorithms and 8 configurations it does not rank\n"
    "(screened in isolation), timed where they run; the fastest by its median (by 3% at least over the\n"
    "heuristic's first, 10% for a screened one) is written to FILE and used by the timed steps.\n"
    "FILE serves train.gemm_algos (--set train.gemm_algos=FILE here) on the same GPU model and cuBLASLt.\n"
    "--doc-len L times document packing (data.packing \"document\", which then needs it): every token\n"
    "is an EOS with probability 1/L, so document lengths are geometric with mean L; MFU is not reported\n"
    "then (a document's attention does less than a causal window's work).\n"
    "Under mpirun every rank runs --tokens-per-step tokens per step (weak scaling) and rank 0\n"
    "reports the job's total tokens/s; gradients are all-reduced as in training\n"
    "(--set train.overlap_comm=false to reduce after the backward instead of during it,\n"
    "--set train.reduce_dtype=bf16 to reduce in bf16).\n"
    "Op mode (GPU only): times one op's forward and backward at --tokens tokens per call (B = tokens / T; attention\n"
    "with --doc-len: packed documents of geometric lengths, TFLOP/s of the keys each query sees; taylor\n"
    "and vq_attn take --doc-len too, their TFLOP/s counting the stream's work);\n"
    "short_conv (memory bound) reports GB/s of activations moved instead of TFLOP/s; attention_decode\n"
    "times one query per sequence over a full cache of T slots (no backward) and reports GB/s of cache read;\n"
    "vq_attn defaults to Transformer-VQ's head (H 1, Dk 128, Dv 1536, S 512 codes, block 512).\n"
    "Generate mode: for each prompt length and batch, prefills random prompts in one pass and decodes\n"
    "--gen-len tokens greedily one step at a time, each step's ids picked on the device and fed to the\n"
    "next, replayed from a CUDA graph where the mixers allow it (--no-graph: every step launched on its\n"
    "own), with a config's seeded initial weights or a checkpoint's; reports\n"
    "prefill and decode tokens/s, decode tokens/s over the first and the last tenth of the steps\n"
    "(flat for recurrent states, falling with the KV cache for attention), GPU memory in use and, of it,\n"
    "the decode state (KV caches or recurrent states).\n";

struct BenchRow {
  int64_t T, B, micro, tokens_per_step;
  double step_ms, tokens_per_s, mfu, mem_bytes, peak_bytes, loss;
  double median_ms, max_ms;  // of the timed steps (a few slow steps show as max above median)
  double doc_len;            // measured mean document length (0: stream packing)
  StepProfile profile;  // with --profile
};

struct BenchOptions {
  std::vector<int64_t> seq_lens;
  int64_t micro_tokens, step_tokens, steps, warmup;
  bool micro_tokens_given = false;  // else train.micro_batch x data.seq_len
  double doc_len = 0;  // > 0: document packing with this mean document length
  bool as_json, profile;
  bool graph = true;  // --no-graph: train.cuda_graph off
  std::string tune_path;  // --tune-gemms
  int64_t tune_steps = 32;
};

// What one rank runs: the model, its optimizer step and the device, as `linac train` builds them.
struct BenchRun {
  explicit BenchRun(const Config& c) : cfg(c) {}
  const Config& cfg;
  std::unique_ptr<Comm> comm;
  std::unique_ptr<GpuContext> gctx;
  Ctx ctx;
  bool gpu = false;
  size_t mem0 = 0;  // device memory in use before the model
  std::unique_ptr<Model> model;
  TrainConfig tc;
  std::unique_ptr<TrainStep> stepper;
};

// n_micro micro-batches of B x T random tokens (never zeros; each micro-batch and rank its own),
// uploaded once; with doc_len > 0 each token is the EOS with probability 1 / doc_len, and the
// micro-batches carry their document bounds.
struct RandomBatches {
  std::vector<OwnedTensor> tokens, targets;
  std::vector<DocBoundsBuffer> docs;
  std::vector<MicroBatch> micro;
  double doc_len = 0;  // measured
};

RandomBatches random_batches(const BenchRun& run, int64_t B, int64_t T, int64_t n_micro, double doc_len) {
  RandomBatches rb;
  const auto V = static_cast<uint64_t>(run.cfg.model.vocab_size);
  const int32_t eos = static_cast<int32_t>(std::min<int64_t>(kEosId, run.cfg.model.vocab_size - 1));
  const auto eos_below = doc_len > 0 ? static_cast<uint64_t>(std::llround(1e6 / doc_len)) : 0;
  int64_t n_docs = 0;
  for (int64_t i = 0; i < n_micro; ++i) {
    Rng rng{run.cfg.train.seed, 0xbe4c + static_cast<uint64_t>(run.comm->rank()), static_cast<uint64_t>(i)};
    std::vector<int32_t> seq(static_cast<size_t>(B * (T + 1)));
    for (int32_t& id : seq) {
      id = static_cast<int32_t>(rng.below(V));
      if (doc_len > 0) id = rng.below(1000000) < eos_below ? eos : id == eos ? (id + 1) % static_cast<int32_t>(V) : id;
    }
    OwnedTensor a(DType::I32, Device::CPU, {B, T}), b(DType::I32, Device::CPU, {B, T});
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        a->data<int32_t>()[r * T + t] = seq[static_cast<size_t>(r * (T + 1) + t)];
        b->data<int32_t>()[r * T + t] = seq[static_cast<size_t>(r * (T + 1) + t + 1)];
      }
    rb.tokens.push_back(to(a, run.ctx.device, DType::I32));
    rb.targets.push_back(to(b, run.ctx.device, DType::I32));
    Tensor docs;
    if (doc_len > 0) {
      rb.docs.emplace_back(run.ctx.device, B, T, eos);
      docs = rb.docs.back().compute(a->data<int32_t>(), B, T);
      n_docs += std::llround(static_cast<double>(B * T) / mean_doc_length(a->data<int32_t>(), B, T, eos));
    }
    rb.micro.push_back({rb.tokens.back().t, rb.targets.back().t, docs});
  }
  if (doc_len > 0) rb.doc_len = static_cast<double>(n_micro * B * T) / static_cast<double>(std::max<int64_t>(1, n_docs));
  return rb;
}

// Times o.steps steps at sequence length T after o.warmup: mean, median and slowest step, memory,
// and with --profile where the time goes.
BenchRow time_steps(BenchRun& run, const BenchOptions& o, int64_t T) {
  if (o.micro_tokens % T)
    throw UserError(
        o.micro_tokens_given
            ? "--micro-tokens (" + std::to_string(o.micro_tokens) + ") must be a multiple of T=" + std::to_string(T)
            : "--seq-lens " + std::to_string(T) +
                  ": the default micro-batch (train.micro_batch x data.seq_len = " + std::to_string(o.micro_tokens) +
                  " tokens) is no multiple of it; pass --micro-tokens N, a "
                  "multiple of every sequence length");
  const int64_t B = o.micro_tokens / T, n_micro = o.step_tokens / o.micro_tokens;
  // Every micro-batch of the step stays resident (int32 tokens and targets): a step whose batches
  // alone exceed the device's memory is refused before it is allocated piece by piece.
  const double batch_bytes = 8.0 * static_cast<double>(o.step_tokens);
  const double capacity =
      run.gpu ? static_cast<double>(gpu_info().total_bytes)
              : static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (batch_bytes > capacity)
    throw UserError("--tokens-per-step " + std::to_string(o.step_tokens) + ": the step's token batches alone take " +
                    fixed(batch_bytes / (1 << 30), 1) + " GiB, more than the " + fixed(capacity / (1 << 30), 1) +
                    " GiB of this " + (run.gpu ? "GPU" : "machine"));
  const int world = run.comm->world();
  reset_buffer_peak(run.ctx.device);
  run.model->reserve(B, T);
  const RandomBatches rb = random_batches(run, B, T, n_micro, o.doc_len);
  StepStats st;
  const int64_t global_tokens = o.step_tokens * world;
  for (int64_t i = 0; i < o.warmup; ++i) st = run.stepper->run(i, rb.micro, global_tokens);
  run.comm->barrier();
  Timer timer(run.ctx);
  timer.start();
  for (int64_t i = 0; i < o.steps; ++i) {
    st = run.stepper->run(o.warmup + i, rb.micro, global_tokens);
    timer.mark();
  }
  std::vector<double> laps = timer.laps_ms();
  const double ms = std::accumulate(laps.begin(), laps.end(), 0.0) / static_cast<double>(o.steps);
  std::sort(laps.begin(), laps.end());
  const double peak_tflops = run.gpu ? gpu_info().bf16_dense_tflops : 0.0;
  BenchRow r;
  r.T = T;
  r.B = B;
  r.micro = n_micro;
  r.tokens_per_step = global_tokens;
  r.step_ms = ms;
  r.median_ms = (laps[(laps.size() - 1) / 2] + laps[laps.size() / 2]) / 2;
  r.max_ms = laps.back();
  r.tokens_per_s = static_cast<double>(global_tokens) / (ms / 1e3);
  r.doc_len = rb.doc_len;
  r.mfu = peak_tflops > 0 && o.doc_len == 0 ? run.model->flops_per_token(T) * r.tokens_per_s / (peak_tflops * 1e12 * world) : 0.0;
  r.mem_bytes = run.gpu ? static_cast<double>(gpu_bytes_in_use() - run.mem0) : 0.0;
  r.peak_bytes = static_cast<double>(buffer_bytes_peak(run.ctx.device));
  r.loss = st.loss;
  if (o.profile)
    r.profile = profile_steps(*run.model, run.ctx, o.steps,
                              [&] { st = run.stepper->run(o.warmup + o.steps, rb.micro, global_tokens); });
  return r;
}

// --tune-gemms: o.tune_steps eager steps per sequence length with the GEMMs' candidates timed in
// turn (matmul_algos.h), by a step of its own so that run.stepper captures its graphs afterwards
// with the chosen algorithms; the table goes to o.tune_path before anything is timed.
void tune_gemms(BenchRun& run, const BenchOptions& o) {
  TrainConfig tc = run.tc;
  tc.cuda_graph = false;
  tc.steps = o.tune_steps;
  TrainStep tuner(*run.model, tc, run.comm.get());
  tuner.sync_weights();
  gemm_tuning_start();
  for (const int64_t T : o.seq_lens) {
    const int64_t B = o.micro_tokens / T, n_micro = o.step_tokens / o.micro_tokens;
    run.model->reserve(B, T);
    const RandomBatches rb = random_batches(run, B, T, n_micro, o.doc_len);
    for (int64_t i = 0; i < o.tune_steps; ++i) tuner.run(i, rb.micro, o.step_tokens);
  }
  const GemmAlgoTable table{gemm_algo_env(), gemm_tuning_finish()};
  write_gemm_algo_table(o.tune_path, table);
  int64_t changed = 0;
  double saved_us = 0;
  for (const GemmAlgoChoice& c : table.choices)
    if (c.candidate > 0) ++changed, saved_us += (c.heuristic_us - c.chosen_us) * static_cast<double>(c.calls);
  const double steps = static_cast<double>(o.tune_steps * static_cast<int64_t>(o.seq_lens.size()));
  std::fprintf(stderr,
               "tuned %zu GEMM problems over %lld eager steps per T: %lld run another algorithm than the heuristic's "
               "first (%.2f ms per eager step less by their timed calls); table written to %s\n",
               table.choices.size(), static_cast<long long>(o.tune_steps), static_cast<long long>(changed),
               saved_us / steps / 1e3, o.tune_path.c_str());
}

void print_json(const BenchRun& run, const std::string& path, const BenchOptions& o, const std::vector<BenchRow>& rows) {
  const GradReducer* red = run.stepper->reducer();
  json j = {{"config", path},
            {"device", run.gpu ? gpu_info().name : std::string("CPU")},
            {"precision", precision_in_effect(run.model->env().act)},
            {"packing", o.doc_len > 0 ? "document" : "stream"},
            {"ranks", run.comm->world()},
            {"overlap_comm", run.cfg.train.overlap_comm},
            {"reduce_dtype", run.cfg.train.reduce_dtype},
            {"logits_dtype", dtype_name(run.model->logit_dtype())},
            {"residual_dtype", dtype_name(run.model->env().resid)},
            {"recompute", run.cfg.train.recompute},
            {"cuda_graph_replays", run.stepper->graph_replays()},
            {"gemm_algos", o.tune_path.empty() ? run.cfg.train.gemm_algos : o.tune_path},
            {"zero", run.model->params().sharded() ? run.cfg.train.zero : 0},
            {"params", run.model->n_params()},
            {"buckets", red ? static_cast<int64_t>(red->buckets()) : 0},
            {"gradient_groups", red ? static_cast<int64_t>(red->groups()) : 0},
            {"bucket_starts", red ? json{{"windows", red->starts().windows},
                                         {"ready", red->starts().ready},
                                         {"after_backward", red->starts().finish}}
                                  : json()},
            {"rows", json::array()}};
  for (const auto& r : rows) {
    json row = {{"seq_len", r.T},         {"batch", r.B},          {"micro_batches", r.micro},
                {"tokens_per_step", r.tokens_per_step}, {"step_ms", r.step_ms}, {"step_ms_median", r.median_ms},
                {"step_ms_max", r.max_ms}, {"tokens_per_s", r.tokens_per_s}, {"mfu", r.mfu},
                {"memory_bytes", r.mem_bytes}, {"peak_bytes", r.peak_bytes}, {"loss", r.loss}};
    if (r.doc_len > 0) row["mean_doc_len"] = r.doc_len;
    if (o.profile) row["profile"] = step_profile_json(r.profile);
    j["rows"].push_back(row);
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void print_table(const BenchRun& run, const std::string& path, const BenchOptions& o, const std::vector<BenchRow>& rows) {
  const Config& cfg = run.cfg;
  const int world = run.comm->world();
  std::string dist;
  if (const GradReducer* red = run.stepper->reducer(); red && cfg.train.overlap_comm) {
    const auto n = red->starts();
    const std::string groups = red->groups() ? " (" + std::to_string(red->groups()) + " of them gradient groups)" : "";
    dist = ", " + std::string(run.comm->backend()) + ", overlapped (" + std::to_string(red->buckets()) + " buckets" +
           groups + ": " + std::to_string(n.windows) + " started in comm windows, " + std::to_string(n.ready) +
           " when ready, " + std::to_string(n.finish) + " after the backward)";
  } else if (world > 1) {
    dist = ", " + std::string(run.comm->backend()) + ", not overlapped";
  }
  if (world > 1 && cfg.train.reduce_dtype == "bf16") dist += ", gradients reduced in bf16";
  if (run.stepper->graph_replays() > 0) dist += ", micro-batches replayed from CUDA graphs";
  if (run.model->logit_dtype() == DType::BF16) dist += ", bf16 logits";
  if (run.model->env().resid == DType::BF16) dist += ", bf16 residual stream";
  if (!o.tune_path.empty() || !cfg.train.gemm_algos.empty())
    dist += ", GEMM algorithms from " + (o.tune_path.empty() ? cfg.train.gemm_algos : o.tune_path);
  std::printf("%s on %d x %s (%s, recompute %s%s%s), %s parameters, %lld timed steps after %lld warm-up%s\n",
              path.c_str(), world, run.gpu ? gpu_info().name.c_str() : "CPU", precision_in_effect(run.model->env().act),
              cfg.train.recompute.c_str(),
              o.doc_len > 0
                  ? (", document packing, mean document length " + std::to_string(std::llround(o.doc_len))).c_str()
                  : "",
              run.model->params().sharded() ? (", ZeRO-" + std::to_string(cfg.train.zero)).c_str() : "",
              human_count(static_cast<double>(run.model->n_params())).c_str(), static_cast<long long>(o.steps),
              static_cast<long long>(o.warmup), dist.c_str());
  // step ms is the mean over the timed steps (what tokens/s and MFU use); median and max show
  // whether a few slow steps (clock or power events, stragglers) weigh on it.
  std::printf("%8s %6s %6s %10s %10s %12s %7s %12s %12s %10s %10s\n", "T", "B", "micro", "tok/step", "step ms",
              "tokens/s", "MFU", "GPU memory", "peak", "median ms", "max ms");
  for (const auto& r : rows) {
    // No MFU on a CPU (no peak to divide by) or for documents (less work than the count assumes).
    const std::string mfu = r.mfu > 0 ? fixed(100.0 * r.mfu, 1) + "%" : "-";
    std::printf("%8lld %6lld %6lld %10lld %10.2f %12.0f %7s %12s %12s %10.2f %10.2f\n", static_cast<long long>(r.T),
                static_cast<long long>(r.B), static_cast<long long>(r.micro), static_cast<long long>(r.tokens_per_step),
                r.step_ms, r.tokens_per_s, mfu.c_str(), run.gpu ? human_bytes(r.mem_bytes).c_str() : "-",
                human_bytes(r.peak_bytes).c_str(), r.median_ms, r.max_ms);
  }
  if (o.profile)
    for (const auto& r : rows) {
      std::printf("\nT = %lld, ", static_cast<long long>(r.T));
      print_step_profile(r.profile, r.step_ms);
    }
}

int bench_config(Args& args, const std::string& path, const Config& cfg) {
  BenchOptions o;
  o.seq_lens = {cfg.data.seq_len};
  if (auto s = args.get("seq-lens")) o.seq_lens = parse_int_list(*s, "--seq-lens");
  o.micro_tokens_given = args.get("micro-tokens").has_value();
  o.micro_tokens = args.get_int("micro-tokens", cfg.train.micro_batch * cfg.data.seq_len);
  o.step_tokens = args.get_int("tokens-per-step", o.micro_tokens);
  o.steps = args.get_int("steps", 5);
  o.warmup = args.get_int("warmup", 2);
  o.as_json = args.flag("json");
  o.profile = args.flag("profile");
  o.graph = !args.flag("no-graph");
  if (auto t = args.get("tune-gemms")) o.tune_path = *t;
  if (args.get("tune-steps") && o.tune_path.empty()) throw UserError("--tune-steps needs --tune-gemms FILE");
  o.tune_steps = args.get_int("tune-steps", o.tune_steps);
  if (args.get("doc-len")) {
    o.doc_len = args.get_double("doc-len", 0);
    if (!(o.doc_len >= 1)) throw UserError("--doc-len must be at least 1 (a mean document length in tokens)");
  }
  args.finish();
  if (cfg.data.packing == "document" && o.doc_len == 0)
    throw UserError(path + ": data.packing is \"document\": pass --doc-len L, the mean document length to time");
  if (o.micro_tokens < 1 || o.step_tokens < 1)
    throw UserError("--micro-tokens and --tokens-per-step must be at least 1");
  if (o.step_tokens % o.micro_tokens)
    throw UserError("--tokens-per-step (" + std::to_string(o.step_tokens) + ") must be a multiple of --micro-tokens (" +
                    std::to_string(o.micro_tokens) + ")");
  if (o.steps < 1 || o.warmup < 0) throw UserError("--steps must be >= 1 and --warmup >= 0");
  if (o.tune_steps < 1) throw UserError("--tune-steps must be >= 1");
  if (!o.tune_path.empty()) {  // checked before the tuning steps, which may take minutes
    const std::filesystem::path t(o.tune_path), dir = t.has_parent_path() ? t.parent_path() : ".";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw UserError("--tune-gemms " + o.tune_path + ": no directory " + dir.string() + " to write the table in");
    if (std::filesystem::is_directory(t, ec))
      throw UserError("--tune-gemms " + o.tune_path + ": is a directory (expected a file name for the table)");
  }
  if (!o.tune_path.empty() && !cfg.train.gemm_algos.empty())
    throw UserError("--tune-gemms tunes from cuBLASLt's heuristic: drop train.gemm_algos (" + cfg.train.gemm_algos +
                    ") from " + path + " or its --set");

  BenchRun run(cfg);
  run.gpu = cfg.train.device == "cuda" || (cfg.train.device == "auto" && gpu_available());
  run.comm = Comm::create(run.gpu ? Device::CUDA : Device::CPU);
  if (!o.tune_path.empty() && (!run.gpu || run.comm->world() > 1))
    throw UserError("--tune-gemms runs on one GPU (the table it writes then serves every rank of a run)");
  const std::optional<GemmAlgoTable> table = use_gemm_algo_table(cfg.train.gemm_algos, run.gpu);
  if (run.gpu) {
    run.gctx = std::make_unique<GpuContext>();
    run.ctx = run.gctx->ctx();
  }
  run.mem0 = run.gpu ? gpu_bytes_in_use() : 0;
  ModelOptions mo = ModelOptions::for_training(cfg, run.comm->rank(), run.comm->world());
  mo.documents = o.doc_len > 0;
  run.model = std::make_unique<Model>(cfg.model, run.ctx, mo);
  if (o.doc_len > 0) run.model->check_documents();
  run.model->set_recompute(parse_recompute(cfg.train.recompute));
  run.model->init_params(cfg.train.seed);
  run.tc = cfg.train;
  run.tc.steps = o.warmup + o.steps;
  run.tc.cuda_graph = run.tc.cuda_graph && o.graph;
  if (!o.tune_path.empty()) tune_gemms(run, o);
  run.stepper = std::make_unique<TrainStep>(*run.model, run.tc, run.comm.get());
  run.stepper->sync_weights();

  std::vector<BenchRow> rows;
  for (const int64_t T : o.seq_lens) rows.push_back(time_steps(run, o, T));
  if (!run.comm->is_root()) return 0;
  if (table) {
    bool warning = false;
    const std::string line =
        describe_gemm_algo_coverage(cfg.train.gemm_algos, gemm_algo_coverage(*table, gemm_algos_in_use()), warning);
    std::fprintf(stderr, "%s%s\n", warning ? "warning: " : "", line.c_str());
  }
  if (o.as_json)
    print_json(run, path, o, rows);
  else
    print_table(run, path, o, rows);
  return 0;
}

int bench_model(Args& args, const std::string& path) {
  const Config cfg = load_config(path, args.get_all("set"));
  return blaming_sets(cfg, [&] { return bench_config(args, path, cfg); });
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json", "profile", "macchiato", "no-graph"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (auto op = args.get("op")) {
    require_one_process("linac bench --op");
    return bench_op(args, *op);
  }
  if (auto model = args.get("generate")) {
    require_one_process("linac bench --generate");
    return bench_generate(args, *model);
  }
  const auto pos = args.positionals();
  if (pos.size() != 1) throw UserError("expected CONFIG.json or --op NAME (see --help)");
  return bench_model(args, pos[0]);
}

}  // namespace linac::cli
