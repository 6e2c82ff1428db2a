#include "train/trainer.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <omp.h>

#include "data/loader.h"
#include "data/mqar.h"
#include "dist/comm.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/train_step.h"
#include "train/zero_gather.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Routes SIGINT/SIGTERM to on_stop_signal while alive; the previous handlers come back however
// the run ends (a UserError from a failed checkpoint write included).
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    prev_int_ = std::signal(SIGINT, on_stop_signal);
    prev_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, prev_int_);
    std::signal(SIGTERM, prev_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*prev_int_)(int) = SIG_DFL;
  void (*prev_term_)(int) = SIG_DFL;
};

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

// FNV-1a over what every rank holds identically (ParamStore::replica: the master weights, or
// under ZeRO-1 the compute weights and the replicated masters): ranks of one job must agree.
int64_t params_hash(const ParamStore& ps) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : ps.replica()) {
    OwnedTensor host(t.dtype, Device::CPU, t.dims());
    copy_tensor(host.t, t);
    const auto* p = static_cast<const unsigned char*>(host->ptr);
    for (size_t i = 0; i < host->nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

// The data order of a resumed run: the loader state {seed, epoch, cursor} counts global samples,
// the same on every rank, so a run continues exactly at any world size (each step still reads
// the next global_batch_tokens / seq_len samples; rank r takes its rows of them). Only rows that
// disagree (a file not written by this loader) make exactness impossible.
LoaderState resume_loader_state(const CheckpointReader& ckpt) {
  const auto& rows = ckpt.data().state.loader;
  for (size_t r = 1; r < rows.size(); ++r)
    if (rows[r] != rows[0])
      throw UserError(ckpt.path() + ": the data loader states of ranks 0 and " + std::to_string(r) +
                      " differ, so the data order cannot be continued exactly; refusing to resume");
  return LoaderState::from_vector(rows.at(0));
}

}  // namespace

int run_training(const Config& cfg, const std::string& resume) {
  const TrainConfig& tc = cfg.train;
  const bool mqar = cfg.data.type == "mqar";
  if (!mqar && cfg.data.path.empty())
    throw UserError(cfg.source + ": data.path: is required (a token file from `linac prepare`)");
  if (tc.device == "cuda" && !gpu_available()) throw UserError(cfg.source + ": train.device: 'cuda' but no CUDA device is available");
  const bool gpu = tc.device == "cuda" || (tc.device == "auto" && gpu_available());
  auto comm = Comm::create(gpu ? Device::CUDA : Device::CPU);
  const int rank = comm->rank(), world = comm->world();
  const bool root = comm->is_root();

  const int64_t B = tc.micro_batch, T = cfg.data.seq_len;
  if (tc.global_batch_tokens % (B * T * world) != 0)
    throw UserError(cfg.source + ": train.global_batch_tokens (" + std::to_string(tc.global_batch_tokens) +
                    ") must be a multiple of micro_batch * seq_len * ranks = " + std::to_string(B * T * world));
  const int64_t n_micro = tc.global_batch_tokens / (B * T * world);
  // The data: token windows of a `linac prepare` file, or MQAR's generated train and test sets.
  std::unique_ptr<TokenDataset> ds;
  std::unique_ptr<MqarSet> mqar_train, mqar_test;
  if (mqar) {
    mqar_train = std::make_unique<MqarSet>(MqarSet::train(cfg));
    mqar_test = std::make_unique<MqarSet>(MqarSet::test(cfg));
  } else {
    ds = std::make_unique<TokenDataset>(cfg.data.path);
    check_dataset_vocab(*ds, cfg.model.vocab_size);
  }

  // Resolve what to resume from before touching the run directory.
  std::unique_ptr<CheckpointReader> ckpt;
  std::vector<std::string> skipped;
  if (resume == "auto") {
    ckpt = newest_intact_checkpoint(tc.out_dir, [&](const std::string& w) { skipped.push_back(w); });
  } else if (!resume.empty()) {
    ckpt = std::make_unique<CheckpointReader>(resume);
  } else if (has_checkpoints(tc.out_dir)) {
    throw UserError("train.out_dir '" + tc.out_dir +
                    "' already holds checkpoints: pass --resume auto to continue that run, or choose another out_dir");
  }
  if (ckpt) {
    const CheckpointData& meta = ckpt->data();
    if (meta.config.value("model", json::object()) != cfg.to_json()["model"])
      throw UserError(ckpt->path() + ": the checkpoint's model config differs from " + cfg.source +
                      "'s (compare with its /config); refusing to resume");
    if (meta.state.loader.empty()) throw UserError(ckpt->path() + ": no data loader state to resume from");
  }

  std::shared_ptr<spdlog::logger> log;
  if (root) {
    std::error_code ec;
    fs::create_directories(tc.out_dir, ec);
    if (ec) throw UserError("train.out_dir: cannot create '" + tc.out_dir + "': " + ec.message());
    const fs::path cfg_out = fs::path(tc.out_dir) / "config.json";
    std::ofstream cfg_file(cfg_out);
    cfg_file << cfg.to_json().dump(2) << "\n" << std::flush;
    if (!cfg_file) throw UserError("cannot write " + cfg_out.string() + ": " + std::strerror(errno));
    try {
      log = make_logger((fs::path(tc.out_dir) / "train.log").string());
    } catch (const spdlog::spdlog_ex& e) {
      throw UserError(std::string("cannot open the training log: ") + e.what());
    }
  } else {
    // Other ranks report only warnings and errors, tagged with their rank.
    log = std::make_shared<spdlog::logger>("linac", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    log->set_pattern("[%Y-%m-%d %H:%M:%S] rank " + std::to_string(rank) + ": %v");
    log->set_level(spdlog::level::warn);
  }
  for (const std::string& w : skipped) log->warn("{}", w);

  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));
  std::unique_ptr<GpuContext> gctx;
  Ctx ctx;
  if (gpu) {
    gctx = std::make_unique<GpuContext>();
    ctx = gctx->ctx();
  }
  const double peak_tflops = gpu ? gpu_info().bf16_dense_tflops : 0.0;

  const int zero_world = tc.zero && world > 1 ? world : 1;
  Model model(cfg.model, ctx, tc.precision, true, true, zero_world, rank, tc.zero == 2);
  model.set_recompute(parse_recompute(tc.recompute));
  // MQAR's test slices may be longer than the padded training length.
  model.reserve(B, mqar ? std::max(T, mqar_test->max_seq_len()) : T);
  TrainStep stepper(model, tc, comm.get());
  std::unique_ptr<TrainBatches> loader;
  if (mqar)
    loader = std::make_unique<MqarLoader>(*mqar_train, B, T, rank, world, tc.seed);
  else
    loader = std::make_unique<TrainLoader>(*ds, Split::Train, B, T, rank, world, tc.seed);

  int64_t step = 0, tokens_seen = 0;
  if (!ckpt) {
    model.init_params(tc.seed);
    stepper.sync_weights();
    log->info(
        "fresh run: {} parameters on {}{} ({} compute), {} rank(s) via {}{}, {} micro-batch(es) of {}x{} per rank per "
        "step{}",
        model.n_params(), gpu ? gpu_info().name : "CPU", world > 1 ? " per rank" : "", dtype_name(model.env().act),
        world, comm->backend(), zero_world > 1 ? " with ZeRO-" + std::to_string(tc.zero) : std::string(), n_micro, B, T,
        tc.recompute != "none" ? ", recompute " + tc.recompute : std::string());
  } else {
    ckpt->load_params(model.params(), true);
    stepper.sync_weights();
    const TrainState& st = ckpt->data().state;
    step = st.step;
    tokens_seen = st.tokens_seen;
    stepper.set_updates(st.updates);
    loader->set_state(resume_loader_state(*ckpt));
    log->info("resumed from {} at step {}{}", ckpt->path(), step,
              st.world_size != world ? fmt::format(" (written by {} rank(s), continued on {}: same data order)",
                                                   st.world_size, world)
                                     : std::string());
    ckpt.reset();
  }

  std::unique_ptr<EvalLoader> eval_loader;
  if (ds && tc.eval_every > 0 && ds->size(Split::Val) > 1)
    eval_loader = std::make_unique<EvalLoader>(*ds, Split::Val, B, T, rank, world, static_cast<uint64_t>(tc.eval_tokens));
  const bool eval_mqar = mqar && tc.eval_every > 0;

  auto save = [&](int64_t at_step) {
    CheckpointData d;
    d.config = cfg.to_json();
    d.state.step = at_step;
    d.state.updates = stepper.updates();
    d.state.tokens_seen = tokens_seen;
    d.state.world_size = world;
    d.state.seed = tc.seed;
    d.state.loader = comm->allgather(loader->state().to_vector());
    if (ds) d.tokenizer = ds->tokenizer_bytes();
    ctx_synchronize(ctx);
    if (world > 1) {
      const auto hashes = comm->allgather({params_hash(model.params())});
      for (int r = 1; r < world; ++r)
        if (hashes[static_cast<size_t>(r)] != hashes[0])
          throw Error("rank " + std::to_string(r) + "'s parameters differ from rank 0's at step " + std::to_string(at_step) +
                      " (data-parallel ranks diverged)");
    }
    // Under ZeRO-1 rank 0 gathers the shards first: the file holds whole tensors either way.
    const ParamStore gathered = model.params().sharded() ? gather_sharded_state(model.params(), *comm) : ParamStore();
    if (root) {
      const std::string path = checkpoint_path(tc.out_dir, at_step);
      save_checkpoint(path, model.params().sharded() ? gathered : model.params(), d);
      publish_checkpoint(tc.out_dir, path, tc.keep_last);
      log->info("checkpoint {}{}", path, world > 1 ? " (all ranks hold identical parameters)" : "");
    }
    comm->barrier();
  };

  std::ofstream metrics;
  const fs::path metrics_path = fs::path(tc.out_dir) / "metrics.jsonl";
  if (root) {
    metrics.open(metrics_path, std::ios::app);
    if (!metrics) throw UserError("cannot open " + metrics_path.string() + " for appending");
  }
  // Metrics are a convenience: a failed write (a full disk) is reported once and training goes
  // on; checkpoints have their own checks.
  bool metrics_warned = false;
  auto check_metrics = [&] {
    if (root && !metrics && !metrics_warned) {
      log->warn("writing {} failed (disk full?); training continues without metrics", metrics_path.string());
      metrics_warned = true;
    }
  };
  std::vector<OwnedTensor> tok_d, tgt_d;
  std::vector<MicroBatch> micro;
  for (int64_t i = 0; i < n_micro; ++i) {
    tok_d.emplace_back(DType::I32, ctx.device, std::vector<int64_t>{B, T});
    tgt_d.emplace_back(DType::I32, ctx.device, std::vector<int64_t>{B, T});
    micro.push_back({tok_d.back().t, tgt_d.back().t});
  }
  OwnedTensor tok_h(DType::I32, Device::CPU, {B, T}), tgt_h(DType::I32, Device::CPU, {B, T});

  const StopSignals stop_signals;

  using clock = std::chrono::steady_clock;
  auto t_log = clock::now();
  const auto t_start = clock::now();
  auto seconds_since_start = [&] { return std::chrono::duration<double>(clock::now() - t_start).count(); };
  const int64_t first_step = step;
  int64_t tokens_since_log = 0, bad_in_row = 0;
  double loss_acc = 0;
  int64_t loss_n = 0;
  int status = 0;
  while (step < tc.steps) {
    int64_t scored = 0;  // over every rank's micro-batches: the step's gradient is that of the mean
    for (int64_t i = 0; i < n_micro; ++i) {
      scored += loader->next(tok_h->data<int32_t>(), tgt_h->data<int32_t>());
      copy_tensor(micro[static_cast<size_t>(i)].tokens, tok_h);
      copy_tensor(micro[static_cast<size_t>(i)].targets, tgt_h);
    }
    const StepStats st = stepper.run(step, micro, scored);
    ++step;
    tokens_seen += tc.global_batch_tokens;
    tokens_since_log += tc.global_batch_tokens;
    if (st.skipped) {
      ++bad_in_row;
      log->warn("step {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} in a row)", step, st.loss,
                st.grad_norm, bad_in_row);
      if (root)
        metrics << json{{"step", step}, {"skipped", true}, {"loss", std::isfinite(st.loss) ? json(st.loss) : json(nullptr)}}.dump()
                << "\n";
      check_metrics();
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
      const double mfu = peak_tflops > 0 ? model.flops_per_token(T) * tps / (peak_tflops * 1e12 * world) : 0.0;
      const double elapsed = seconds_since_start();
      const double remaining = elapsed / static_cast<double>(step - first_step) * static_cast<double>(tc.steps - step);
      const double mean_loss = loss_n ? loss_acc / static_cast<double>(loss_n) : st.loss;
      rec = {{"step", step}, {"loss", mean_loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps},
             {"tokens_seen", tokens_seen}, {"mfu", mfu}, {"mem", gpu ? static_cast<int64_t>(gpu_bytes_in_use()) : 0},
             {"time_s", elapsed}};
      if (st.aux_loss != 0) rec["aux_loss"] = st.aux_loss;
      log->info("step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{} | ETA {}", step, tc.steps,
                mean_loss, st.aux_loss != 0 ? fmt::format(" (aux {:.5f})", st.aux_loss) : "", st.lr, st.grad_norm, tps,
                peak_tflops > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", eta(remaining));
      t_log = clock::now();
      tokens_since_log = 0;
      loss_acc = 0;
      loss_n = 0;
    }
    if (eval_mqar && (step % tc.eval_every == 0 || step == tc.steps)) {
      MqarResult res = evaluate_mqar(model, *mqar_test, B, rank, world);
      res.reduce([&](double x) { return comm->sum(x); });
      const MqarScore all = res.pooled();
      if (rec.is_null()) rec = {{"step", step}, {"tokens_seen", tokens_seen}, {"time_s", seconds_since_start()}};
      rec["val_loss"] = all.mean_loss();
      rec["val_accuracy"] = all.accuracy();
      json slices = json::array();
      std::string per_slice;
      for (size_t i = 0; i < res.slices.size(); ++i) {
        const MqarSlice& sl = res.slices[i];
        slices.push_back({{"seq_len", sl.seq_len}, {"pairs", sl.pairs}, {"accuracy", res.scores[i].accuracy()}});
        per_slice += fmt::format(" {}x{}:{:.3f}", sl.seq_len, sl.pairs, res.scores[i].accuracy());
      }
      rec["val_slices"] = slices;
      log->info("step {} | val loss {:.4f} | val accuracy {:.4f} ({} queries) | by L x P:{}", step, all.mean_loss(),
                all.accuracy(), all.targets, per_slice);
    }
    if (eval_loader && (step % tc.eval_every == 0 || step == tc.steps)) {
      const EvalResult local = evaluate(model, *eval_loader);
      const double loss_sum = comm->sum(local.loss_sum);
      const double count = comm->sum(static_cast<double>(local.targets));
      const double val = count > 0 ? loss_sum / count : 0.0;
      if (rec.is_null()) rec = {{"step", step}, {"tokens_seen", tokens_seen}, {"time_s", seconds_since_start()}};
      rec["val_loss"] = val;
      rec["val_ppl"] = std::exp(val);
      const double val_aux = count > 0 ? comm->sum(local.aux_sum) / count : 0.0;
      if (val_aux != 0) rec["val_aux_loss"] = val_aux;
      log->info("step {} | val loss {:.4f} | val ppl {:.2f}{} ({} tokens)", step, val, std::exp(val),
                val_aux != 0 ? fmt::format(" | val aux {:.5f}", val_aux) : "", static_cast<int64_t>(count));
    }
    if (root && !rec.is_null()) metrics << rec.dump() << "\n" << std::flush;
    check_metrics();

    // Every rank stops at the same step when any of them was signalled.
    const int64_t sig = comm->max(g_stop_signal.load());
    if (sig) {
      log->info("signal {} received: checkpointing at step {} and stopping", sig, step);
      save(step);
      break;
    }
    if (step == tc.steps || (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0)) save(step);
  }
  if (status == 0 && step >= tc.steps) log->info("done: {} steps, outputs in {}", step, tc.out_dir);
  spdlog::drop("linac");
  return status;
}

}  // namespace linac
