#include "train/trainer.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>

#include <omp.h>

#include "data/loader.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/train_step.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

std::string eta(double seconds) {
  const long s = static_cast<long>(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

std::shared_ptr<spdlog::logger> make_logger(const std::string& log_path) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path, false);
  auto log = std::make_shared<spdlog::logger>("linac", spdlog::sinks_init_list{console, file});
  log->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
  log->flush_on(spdlog::level::info);
  return log;
}

// Host batch rows (B, T+1) -> device tokens/targets (B, T).
void upload_rows(const std::vector<int32_t>& rows, int64_t B, int64_t T, OwnedTensor& tok_h, OwnedTensor& tgt_h,
                 const MicroBatch& mb) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      tok_h->data<int32_t>()[b * T + t] = rows[static_cast<size_t>(b * (T + 1) + t)];
      tgt_h->data<int32_t>()[b * T + t] = rows[static_cast<size_t>(b * (T + 1) + t + 1)];
    }
  copy_tensor(mb.tokens, tok_h);
  copy_tensor(mb.targets, tgt_h);
}

}  // namespace

int run_training(const Config& cfg, const std::string& resume) {
  const TrainConfig& tc = cfg.train;
  if (cfg.data.path.empty()) throw UserError(cfg.source + ": data.path: is required (a token file from `linac prepare`)");
  TokenDataset ds(cfg.data.path);
  check_dataset_vocab(ds, cfg.model.vocab_size);

  // Resolve what to resume from before touching the run directory.
  std::string ckpt;
  if (resume == "auto") {
    ckpt = latest_checkpoint(tc.out_dir);
  } else if (!resume.empty()) {
    ckpt = resume;
  } else if (!latest_checkpoint(tc.out_dir).empty()) {
    throw UserError("train.out_dir '" + tc.out_dir +
                    "' already holds checkpoints: pass --resume auto to continue that run, or choose another out_dir");
  }
  CheckpointData meta;
  if (!ckpt.empty()) {
    meta = read_checkpoint_meta(ckpt);
    if (meta.config.value("model", json::object()) != cfg.to_json()["model"])
      throw UserError(ckpt + ": the checkpoint's model config differs from " + cfg.source +
                      "'s (compare with its /config); refusing to resume");
    if (meta.state.world_size != 1)
      throw UserError(ckpt + ": written by " + std::to_string(meta.state.world_size) +
                      " ranks; resume it with the same number of ranks");
  }

  fs::create_directories(tc.out_dir);
  {
    std::ofstream f(fs::path(tc.out_dir) / "config.json");
    f << cfg.to_json().dump(2) << "\n";
  }
  auto log = make_logger((fs::path(tc.out_dir) / "train.log").string());

  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));
  const bool gpu = tc.device == "cuda" || (tc.device == "auto" && gpu_available());
  if (tc.device == "cuda" && !gpu_available()) throw UserError(cfg.source + ": train.device: 'cuda' but no CUDA device is available");
  std::unique_ptr<GpuContext> gctx;
  Ctx ctx;
  if (gpu) {
    gctx = std::make_unique<GpuContext>();
    ctx = gctx->ctx();
  }
  const double peak_tflops = gpu ? gpu_info().bf16_dense_tflops : 0.0;

  const int64_t B = tc.micro_batch, T = cfg.data.seq_len;
  const int64_t n_micro = tc.global_batch_tokens / (B * T);
  Model model(cfg.model, ctx, tc.precision, true);
  model.reserve(B, T);
  TrainStep stepper(model, tc);
  TrainLoader loader(ds, Split::Train, B, T, 0, 1, tc.seed);

  int64_t step = 0, tokens_seen = 0;
  if (ckpt.empty()) {
    model.init_params(tc.seed);
    log->info("fresh run: {} parameters on {} ({} compute), {} micro-batch(es) of {}x{} per step", model.n_params(),
              gpu ? gpu_info().name : "CPU", dtype_name(model.env().act), n_micro, B, T);
  } else {
    load_checkpoint_params(ckpt, model.params(), true);
    model.params().refresh_compute(ctx);
    step = meta.state.step;
    tokens_seen = meta.state.tokens_seen;
    stepper.set_updates(meta.state.updates);
    if (!meta.state.loader.empty()) loader.set_state(LoaderState::from_vector(meta.state.loader[0]));
    log->info("resumed from {} at step {}", ckpt, step);
  }

  const int64_t val_tokens = static_cast<int64_t>(ds.size(Split::Val));
  std::unique_ptr<EvalLoader> eval_loader;
  if (tc.eval_every > 0 && val_tokens > 1)
    eval_loader = std::make_unique<EvalLoader>(ds, Split::Val, B, T, 0, 1, static_cast<uint64_t>(tc.eval_tokens));

  auto save = [&](int64_t at_step) {
    CheckpointData d;
    d.config = cfg.to_json();
    d.state.step = at_step;
    d.state.updates = stepper.updates();
    d.state.tokens_seen = tokens_seen;
    d.state.world_size = 1;
    d.state.seed = tc.seed;
    d.state.loader = {loader.state().to_vector()};
    d.tokenizer = ds.tokenizer_bytes();
    ctx_synchronize(ctx);
    const std::string path = checkpoint_path(tc.out_dir, at_step);
    save_checkpoint(path, model.params(), d);
    publish_checkpoint(tc.out_dir, path, tc.keep_last);
    log->info("checkpoint {}", path);
  };

  std::ofstream metrics(fs::path(tc.out_dir) / "metrics.jsonl", std::ios::app);
  std::vector<OwnedTensor> tok_d, tgt_d;
  std::vector<MicroBatch> micro;
  for (int64_t i = 0; i < n_micro; ++i) {
    tok_d.emplace_back(DType::I32, ctx.device, std::vector<int64_t>{B, T});
    tgt_d.emplace_back(DType::I32, ctx.device, std::vector<int64_t>{B, T});
    micro.push_back({tok_d.back().t, tgt_d.back().t});
  }
  OwnedTensor tok_h(DType::I32, Device::CPU, {B, T}), tgt_h(DType::I32, Device::CPU, {B, T});
  std::vector<int32_t> rows(loader.batch_elems());

  g_stop_signal.store(0);
  auto prev_int = std::signal(SIGINT, on_stop_signal);
  auto prev_term = std::signal(SIGTERM, on_stop_signal);

  using clock = std::chrono::steady_clock;
  auto t_log = clock::now();
  const auto t_start = clock::now();
  const int64_t first_step = step;
  int64_t tokens_since_log = 0, bad_in_row = 0;
  double loss_acc = 0;
  int64_t loss_n = 0;
  int status = 0;
  while (step < tc.steps) {
    for (int64_t i = 0; i < n_micro; ++i) {
      loader.next(rows.data());
      upload_rows(rows, B, T, tok_h, tgt_h, micro[static_cast<size_t>(i)]);
    }
    const StepStats st = stepper.run(step, micro, tc.global_batch_tokens);
    ++step;
    tokens_seen += tc.global_batch_tokens;
    tokens_since_log += tc.global_batch_tokens;
    if (st.skipped) {
      ++bad_in_row;
      log->warn("step {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} in a row)", step, st.loss,
                st.grad_norm, bad_in_row);
      metrics << json{{"step", step}, {"skipped", true}, {"loss", std::isfinite(st.loss) ? json(st.loss) : json(nullptr)}}.dump()
              << "\n";
      if (bad_in_row >= tc.max_bad_steps) {
        log->error("aborting: {} consecutive non-finite steps (train.max_bad_steps); the last checkpoint is intact",
                   bad_in_row);
        status = 1;
        break;
      }
    } else {
      bad_in_row = 0;
      loss_acc += st.loss;
      ++loss_n;
    }

    json rec;
    if (step % tc.log_every == 0 || step == tc.steps) {
      const double secs = std::chrono::duration<double>(clock::now() - t_log).count();
      const double tps = static_cast<double>(tokens_since_log) / std::max(secs, 1e-9);
      const double mfu = peak_tflops > 0 ? model.flops_per_token(T) * tps / (peak_tflops * 1e12) : 0.0;
      const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
      const double remaining = elapsed / static_cast<double>(step - first_step) * static_cast<double>(tc.steps - step);
      const double mean_loss = loss_n ? loss_acc / static_cast<double>(loss_n) : st.loss;
      rec = {{"step", step}, {"loss", mean_loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps},
             {"tokens_seen", tokens_seen}, {"mfu", mfu}, {"mem", gpu ? static_cast<int64_t>(gpu_bytes_in_use()) : 0}};
      log->info("step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{} | ETA {}", step, tc.steps,
                mean_loss, st.lr, st.grad_norm, tps, peak_tflops > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "",
                eta(remaining));
      t_log = clock::now();
      tokens_since_log = 0;
      loss_acc = 0;
      loss_n = 0;
    }
    if (eval_loader && (step % tc.eval_every == 0 || step == tc.steps)) {
      const EvalResult ev = evaluate(model, *eval_loader);
      if (rec.is_null()) rec = {{"step", step}};
      rec["val_loss"] = ev.mean_loss();
      rec["val_ppl"] = std::exp(ev.mean_loss());
      log->info("step {} | val loss {:.4f} | val ppl {:.2f} ({} tokens)", step, ev.mean_loss(), std::exp(ev.mean_loss()),
                ev.targets);
    }
    if (!rec.is_null()) metrics << rec.dump() << "\n" << std::flush;

    const int sig = g_stop_signal.load();
    if (sig) {
      log->info("signal {} received: checkpointing at step {} and stopping", sig, step);
      save(step);
      break;
    }
    if (step == tc.steps || (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0)) save(step);
  }
  std::signal(SIGINT, prev_int);
  std::signal(SIGTERM, prev_term);
  if (status == 0 && step >= tc.steps) log->info("done: {} steps, outputs in {}", step, tc.out_dir);
  spdlog::drop("linac");
  return status;
}

}  // namespace linac
