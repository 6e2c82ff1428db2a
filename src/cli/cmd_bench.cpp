// linac bench: times full training steps (forward, backward, optimizer) on random tokens, or
// single ops (--op), with device events after warm-up. Every performance figure in README
// comes from here.
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "cli/args.h"
#include "cli/bench_generate.h"
#include "cli/bench_ops.h"
#include "cli/bench_profile.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "config/config.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "model/model.h"
#include "train/train_step.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac bench CONFIG.json [--seq-lens 2048,8192,...] [--tokens-per-step N] [--micro-tokens N]\n"
    "                   [--steps N] [--warmup N] [--profile] [--set key.path=value]... [--json]\n"
    "       linac bench --op attention|attention_decode|gla|latte|lightning|short_conv|taylor|vq_attn [--seq-lens ...]\n"
    "                   [--tokens N] [--heads H] [--head-dim D] [--dk Dk --dv Dv] [--feature-dim F] [--window W]\n"
    "                   [--latents L (latte, per head; default 16) --macchiato] [--codes S --block Lb (vq_attn)]\n"
    "                   [--channels C --width W] [--dtype bf16|fp32] [--iters N] [--json]\n"
    "       linac bench --generate CONFIG.json|CKPT.h5 [--batch 1,16,128] [--prompt-len 512,2048] [--gen-len 1024]\n"
    "                   [--device auto|cpu|gpu] [--set key.path=value]... [--json]\n\n"
    "Model mode: for each sequence length T, trains steps of --tokens-per-step tokens (default: one\n"
    "micro-batch of train.micro_batch x data.seq_len) split into micro-batches of --micro-tokens\n"
    "(default: the same), on random tokens, after --warmup steps (default 2); reports tokens/s, MFU\n"
    "(model FLOPs over the GPU's dense bf16 peak), GPU memory in use (device-wide) and peak memory (the\n"
    "most linac's own buffers held at once on this rank: parameters, gradients, optimizer state, saved\n"
    "activations, scratch; train.recompute and train.zero change it). On a CPU-only machine it times the\n"
    "CPU path, prints no MFU and reports peak host memory. --profile then runs --steps more steps\n"
    "with every phase (embedding, norms, each token mixer's forward and backward, channel mixers, LM\n"
    "head and loss, gradient all-reduce, optimizer) and op family (GEMM, attention, cross-entropy)\n"
    "timed by device events, and prints where a step's time goes.\n"
    "Under mpirun every rank runs --tokens-per-step tokens per step (weak scaling) and rank 0\n"
    "reports the job's total tokens/s; gradients are all-reduced as in training\n"
    "(--set train.overlap_comm=false to reduce after the backward instead of during it).\n"
    "Op mode: times one op's forward and backward at --tokens tokens per call (B = tokens / T);\n"
    "short_conv (memory bound) reports GB/s of activations moved instead of TFLOP/s; attention_decode\n"
    "times one query per sequence over a full cache of T slots (no backward) and reports GB/s of cache read;\n"
    "vq_attn defaults to Transformer-VQ's head (H 1, Dk 128, Dv 1536, S 512 codes, block 512).\n"
    "Generate mode: for each prompt length and batch, prefills random prompts in one pass and decodes\n"
    "--gen-len tokens one step at a time (a config's seeded initial weights, or a checkpoint's); reports\n"
    "prefill and decode tokens/s, decode tokens/s over the first and the last tenth of the steps\n"
    "(flat for recurrent states, falling with the KV cache for attention), GPU memory in use and, of it,\n"
    "the decode state (KV caches or recurrent states).\n";

struct BenchRow {
  int64_t T, B, micro, tokens_per_step;
  double step_ms, tokens_per_s, mfu, mem_bytes, peak_bytes, loss;
  double median_ms, max_ms;  // of the timed steps (a few slow steps show as max above median)
  StepProfile profile;  // with --profile
};

int bench_model(Args& args, const std::string& path) {
  const auto sets = args.get_all("set");
  const Config cfg = load_config(path, sets);
  std::vector<int64_t> seq_lens = {cfg.data.seq_len};
  if (auto s = args.get("seq-lens")) seq_lens = parse_int_list(*s, "--seq-lens");
  const int64_t micro_default = cfg.train.micro_batch * cfg.data.seq_len;
  const int64_t micro_tokens = args.get_int("micro-tokens", micro_default);
  const int64_t step_tokens = args.get_int("tokens-per-step", micro_tokens);
  const int64_t steps = args.get_int("steps", 5), warmup = args.get_int("warmup", 2);
  const bool as_json = args.flag("json"), profile = args.flag("profile");
  args.finish();
  if (step_tokens % micro_tokens) throw UserError("--tokens-per-step must be a multiple of --micro-tokens");
  if (steps < 1 || warmup < 0) throw UserError("--steps must be >= 1 and --warmup >= 0");

  const bool gpu = cfg.train.device == "cuda" || (cfg.train.device == "auto" && gpu_available());
  auto comm = Comm::create(gpu ? Device::CUDA : Device::CPU);
  const int world = comm->world();
  std::unique_ptr<GpuContext> gctx;
  Ctx ctx;
  if (gpu) {
    gctx = std::make_unique<GpuContext>();
    ctx = gctx->ctx();
  }
  const size_t mem0 = gpu ? gpu_bytes_in_use() : 0;
  const double peak_tflops = gpu ? gpu_info().bf16_dense_tflops : 0.0;
  const std::string device_desc = gpu ? gpu_info().name : std::string("CPU");

  Model model(cfg.model, ctx, cfg.train.precision, true, true, cfg.train.zero && world > 1 ? world : 1, comm->rank(),
              cfg.train.zero == 2);
  model.set_recompute(parse_recompute(cfg.train.recompute));
  model.init_params(cfg.train.seed);
  TrainConfig tc = cfg.train;
  tc.steps = warmup + steps;
  TrainStep stepper(model, tc, comm.get());
  stepper.sync_weights();

  std::vector<BenchRow> rows;
  for (const int64_t T : seq_lens) {
    if (micro_tokens % T) throw UserError("--micro-tokens (" + std::to_string(micro_tokens) + ") must be a multiple of T=" + std::to_string(T));
    const int64_t B = micro_tokens / T, n_micro = step_tokens / micro_tokens;
    reset_buffer_peak(ctx.device);
    model.reserve(B, T);
    // Random tokens (never zeros), a different batch per micro-step, uploaded once.
    std::vector<OwnedTensor> tok, tgt;
    std::vector<MicroBatch> micro;
    for (int64_t i = 0; i < n_micro; ++i) {
      OwnedTensor h(DType::I32, Device::CPU, {B, T + 1});
      Rng rng{cfg.train.seed, 0xbe4c + static_cast<uint64_t>(comm->rank()), static_cast<uint64_t>(i)};
      for (int64_t j = 0; j < B * (T + 1); ++j)
        h->data<int32_t>()[j] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.model.vocab_size)));
      OwnedTensor a(DType::I32, Device::CPU, {B, T}), b(DType::I32, Device::CPU, {B, T});
      for (int64_t r = 0; r < B; ++r)
        for (int64_t t = 0; t < T; ++t) {
          a->data<int32_t>()[r * T + t] = h->data<int32_t>()[r * (T + 1) + t];
          b->data<int32_t>()[r * T + t] = h->data<int32_t>()[r * (T + 1) + t + 1];
        }
      tok.push_back(to(a, ctx.device, DType::I32));
      tgt.push_back(to(b, ctx.device, DType::I32));
      micro.push_back({tok.back().t, tgt.back().t});
    }
    StepStats st;
    const int64_t global_tokens = step_tokens * world;
    for (int64_t i = 0; i < warmup; ++i) st = stepper.run(i, micro, global_tokens);
    comm->barrier();
    Timer timer(ctx);
    timer.start();
    for (int64_t i = 0; i < steps; ++i) {
      st = stepper.run(warmup + i, micro, global_tokens);
      timer.mark();
    }
    std::vector<double> laps = timer.laps_ms();
    const double ms = std::accumulate(laps.begin(), laps.end(), 0.0) / static_cast<double>(steps);
    std::sort(laps.begin(), laps.end());
    BenchRow r;
    r.T = T;
    r.B = B;
    r.micro = n_micro;
    r.tokens_per_step = global_tokens;
    r.step_ms = ms;
    r.median_ms = (laps[(laps.size() - 1) / 2] + laps[laps.size() / 2]) / 2;
    r.max_ms = laps.back();
    r.tokens_per_s = static_cast<double>(global_tokens) / (ms / 1e3);
    r.mfu = peak_tflops > 0 ? model.flops_per_token(T) * r.tokens_per_s / (peak_tflops * 1e12 * world) : 0.0;
    r.mem_bytes = gpu ? static_cast<double>(gpu_bytes_in_use() - mem0) : 0.0;
    r.peak_bytes = static_cast<double>(buffer_bytes_peak(ctx.device));
    r.loss = st.loss;
    if (profile)
      r.profile = profile_steps(model, ctx, steps, [&] { st = stepper.run(warmup + steps, micro, global_tokens); });
    rows.push_back(r);
  }

  if (!comm->is_root()) return 0;
  if (as_json) {
    json j = {{"config", path},
              {"device", device_desc},
              {"precision", cfg.train.precision},
              {"ranks", world},
              {"overlap_comm", cfg.train.overlap_comm},
              {"recompute", cfg.train.recompute},
              {"zero", model.params().sharded() ? cfg.train.zero : 0},
              {"params", model.n_params()},
              {"buckets", stepper.reducer() ? static_cast<int64_t>(stepper.reducer()->buckets()) : 0},
              {"gradient_groups", stepper.reducer() ? static_cast<int64_t>(stepper.reducer()->groups()) : 0},
              {"bucket_starts", stepper.reducer() ? json{{"windows", stepper.reducer()->starts().windows},
                                                         {"ready", stepper.reducer()->starts().ready},
                                                         {"after_backward", stepper.reducer()->starts().finish}}
                                                  : json()},
              {"rows", json::array()}};
    for (const auto& r : rows)
      j["rows"].push_back({{"seq_len", r.T},
                           {"batch", r.B},
                           {"micro_batches", r.micro},
                           {"tokens_per_step", r.tokens_per_step},
                           {"step_ms", r.step_ms},
                           {"step_ms_median", r.median_ms},
                           {"step_ms_max", r.max_ms},
                           {"tokens_per_s", r.tokens_per_s},
                           {"mfu", r.mfu},
                           {"memory_bytes", r.mem_bytes},
                           {"peak_bytes", r.peak_bytes},
                           {"loss", r.loss}});
    if (profile)
      for (size_t i = 0; i < rows.size(); ++i) j["rows"][i]["profile"] = step_profile_json(rows[i].profile);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::string dist;
  if (const GradReducer* red = stepper.reducer(); red && cfg.train.overlap_comm) {
    const auto n = red->starts();
    const std::string groups = red->groups() ? " (" + std::to_string(red->groups()) + " of them gradient groups)" : "";
    dist = ", " + std::string(comm->backend()) + ", overlapped (" + std::to_string(red->buckets()) + " buckets" +
           groups + ": " + std::to_string(n.windows) + " started in comm windows, " + std::to_string(n.ready) +
           " when ready, " + std::to_string(n.finish) + " after the backward)";
  } else if (world > 1) {
    dist = ", " + std::string(comm->backend()) + ", not overlapped";
  }
  std::printf("%s on %d x %s (%s, recompute %s%s), %s parameters, %lld timed steps after %lld warm-up%s\n",
              path.c_str(), world, device_desc.c_str(), cfg.train.precision.c_str(), cfg.train.recompute.c_str(),
              model.params().sharded() ? (", ZeRO-" + std::to_string(cfg.train.zero)).c_str() : "",
              human_count(static_cast<double>(model.n_params())).c_str(), static_cast<long long>(steps),
              static_cast<long long>(warmup), dist.c_str());
  // step ms is the mean over the timed steps (what tokens/s and MFU use); median and max show
  // whether a few slow steps (clock or power events, stragglers) weigh on it.
  std::printf("%8s %6s %6s %10s %10s %12s %7s %12s %12s %10s %10s\n", "T", "B", "micro", "tok/step", "step ms",
              "tokens/s", "MFU", "GPU memory", "peak", "median ms", "max ms");
  for (const auto& r : rows)
    std::printf("%8lld %6lld %6lld %10lld %10.2f %12.0f %6.1f%% %12s %12s %10.2f %10.2f\n", static_cast<long long>(r.T),
                static_cast<long long>(r.B), static_cast<long long>(r.micro), static_cast<long long>(r.tokens_per_step),
                r.step_ms, r.tokens_per_s, 100.0 * r.mfu, gpu ? human_bytes(r.mem_bytes).c_str() : "-",
                human_bytes(r.peak_bytes).c_str(), r.median_ms, r.max_ms);
  if (profile)
    for (const auto& r : rows) {
      std::printf("\nT = %lld, ", static_cast<long long>(r.T));
      print_step_profile(r.profile, r.step_ms);
    }
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json", "profile", "macchiato"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (auto op = args.get("op")) return bench_op(args, *op);
  if (auto model = args.get("generate")) return bench_generate(args, *model);
  const auto pos = args.positionals();
  if (pos.size() != 1) throw UserError("expected CONFIG.json or --op NAME (see --help)");
  return bench_model(args, pos[0]);
}

}  // namespace linac::cli
