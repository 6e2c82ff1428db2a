#include "train/trainer.h"

#include <omp.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/comm.h"
#include "core/duration_text.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/finite_check.h"
#include "train/gemm_algo_table.h"
#include "train/metrics_log.h"
#include "train/resume_check.h"
#include "train/run_lock.h"

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

// Rank 0 logs to the console and out_dir/train.log; the other ranks report only warnings and
// errors, tagged with their rank.
std::shared_ptr<spdlog::logger> make_logger(const std::string& out_dir, bool root, int rank) {
  if (!root) {
    auto log = std::make_shared<spdlog::logger>("linac", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    log->set_pattern("[%Y-%m-%d %H:%M:%S] rank " + std::to_string(rank) + ": %v");
    log->set_level(spdlog::level::warn);
    return log;
  }
  try {
    auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>((fs::path(out_dir) / "train.log").string(), false);
    auto log = std::make_shared<spdlog::logger>("linac", spdlog::sinks_init_list{console, file});
    log->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
    log->flush_on(spdlog::level::info);
    // A log line that cannot be written (a full disk under train.log, a closed console pipe) is
    // said once, instead of spdlog's "[*** LOG ERROR #n ***]" line at every message.
    log->set_error_handler(
        [path = (fs::path(out_dir) / "train.log").string(), said = false](const std::string& msg) mutable {
          if (said) return;
          said = true;
          std::fprintf(stderr, "warning: a log line could not be written (%s); %s or the console may miss lines\n",
                       msg.c_str(), path.c_str());
        });
    return log;
  } catch (const spdlog::spdlog_ex& e) {
    throw UserError(std::string("cannot open the training log: ") + e.what());
  }
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
  // From before the run sets up (a 1.3B model initialises for seconds): a signal then stops the
  // run after its first step, with a checkpoint, as one during training does.
  const StopSignals stop_signals;
  Trainer trainer(cfg, resume);
  trainer.run();
  return 0;
}

Trainer::Trainer(const Config& cfg, const std::string& resume) : cfg_(cfg), tc_(cfg_.train) {
  open_ranks();
  gemm_table_ = use_gemm_algo_table(tc_.gemm_algos, gpu_);  // before anything is written to out_dir
  data_ = TrainData::open(cfg_);
  check_configs_agree();
  check_out_dir();
  const std::unique_ptr<CheckpointReader> ckpt = open_run_dir(resume);
  build_model();
  if (ckpt)
    restore(*ckpt);
  else
    init_fresh();
  check_replicas_agree(true);
  if (const char* d = std::getenv("LINAC_TEST_DRIFT_AT_STEP")) drift_at_step_ = std::atoll(d);
  writer_ = std::make_unique<CheckpointWriter>(
      model_->params(), *comm_,
      CheckpointWriter::Options{.out_dir = tc_.out_dir, .keep_last = tc_.keep_last, .async = tc_.checkpoint_async},
      [this](const std::string& line) { log_->info("{}", line); });
  validation_ = std::make_unique<Validation>(data_, tc_, B_, T_, rank_, world_);
  if (root_ && tc_.eval_every > 0 && !validation_->enabled())
    log_->warn(
        "{}'s val split has {} token(s), so train.eval_every ({}) validates nothing; `linac prepare "
        "--val-fraction F` holds documents out for it, train.eval_every 0 silences this",
        cfg_.data.path, data_.tokens->size(Split::Val), tc_.eval_every);
  metrics_ =
      std::make_unique<MetricsLog>(tc_.out_dir, root_, step_, [this](const std::string& w) { log_->warn("{}", w); });
  report_dropped_metrics();
  started();
}

// What opening metrics.jsonl dropped: records this run writes again, a killed writer's last line,
// and (a warning) lines that were no step's record, by number so they can be looked for.
void Trainer::report_dropped_metrics() {
  const MetricsLog::Dropped& d = metrics_->dropped();
  if (d.later > 0)
    log_->info("{}: dropped {} record(s) of steps after {}, which this run writes again", metrics_->path(), d.later,
               step_);
  if (d.unfinished) log_->info("{}: dropped its last line, which a killed run left unfinished", metrics_->path());
  if (d.unreadable.empty()) return;
  std::string lines;
  for (size_t i = 0; i < std::min<size_t>(d.unreadable.size(), 8); ++i)
    lines += (i ? ", " : "") + std::to_string(d.unreadable[i]);
  if (d.unreadable.size() > 8) lines += ", ...";
  log_->warn("{}: dropped {} line(s) that were no step's JSON record (line {})", metrics_->path(), d.unreadable.size(),
             lines);
}

// train.out_dir is given (other commands read configs without one). CONFIG may be
// out_dir/config.json itself when it is what a run recorded there (a resume with it, --set or
// not, records the config again): a record is its own resolved form. Any other file at that
// place, the user's own with its comments, layout and defaults left out, would be replaced by
// the resolved config: refused before anything is written.
void Trainer::check_out_dir() const {
  if (tc_.out_dir.empty())
    throw UserError(cfg_.source + ": train.out_dir: is empty; give the run's directory (\".\" for this one)");
  const fs::path record = fs::path(tc_.out_dir) / "config.json";
  std::error_code ec;
  if (!fs::equivalent(record, cfg_.source, ec)) return;
  std::ifstream f(record, std::ios::binary);
  const json on_disk = json::parse(f, nullptr, false, /*ignore_comments=*/true);
  try {
    if (Config::from_json(on_disk, cfg_.source).to_json() == on_disk) return;
  } catch (const UserError&) {
    // Not a config without the --set overrides: not a record either.
  }
  throw UserError(cfg_.source + " is train.out_dir's config.json, where the run records the config it resolves " +
                  "(every key, no comments), so training would overwrite it: keep the config outside train.out_dir");
}

// The run is set up: its config is recorded, and the directory stays. Until here a refused run
// leaves an existing run's config.json as it was, and a directory it created is removed.
void Trainer::started() {
  if (!root_) return;
  const fs::path cfg_out = fs::path(tc_.out_dir) / "config.json";
  std::ofstream cfg_file(cfg_out);
  cfg_file << cfg_.to_json().dump(2) << "\n" << std::flush;
  if (!cfg_file) throw UserError("cannot write " + cfg_out.string() + ": " + std::strerror(errno));
  lock_->keep();
}

Trainer::~Trainer() = default;

void Trainer::run() {
  t_start_ = window_.start = std::chrono::steady_clock::now();
  first_step_ = step_;
  while (step_ < tc_.steps) {
    json rec = account(train_step());
    if (gemm_table_ && step_ == first_step_ + 1) {
      bool warning = false;
      const std::string line =
          describe_gemm_algo_coverage(tc_.gemm_algos, gemm_algo_coverage(*gemm_table_, gemm_algos_in_use()), warning);
      if (warning)
        log_->warn("{}", line);
      else
        log_->info("{}", line);
    }
    if (validation_->enabled() && due(tc_.eval_every)) {
      if (rec.is_null()) rec = {{"step", step_}, {"tokens_seen", tokens_seen_}, {"time_s", seconds_since_start()}};
      log_->info("step {} | {}", step_, validation_->run(*model_, *comm_, rec));
    }
    metrics_->write(rec);
    // Every rank stops at the same step when any of them was signalled; a checkpoint still being
    // written is finished first.
    if (const int64_t sig = comm_->max(g_stop_signal.load())) {
      log_->info("signal {} received: checkpointing at step {} and stopping", sig, step_);
      save();
      writer_->wait();
      return;
    }
    if (step_ == tc_.steps || due(tc_.checkpoint_every)) save();
    writer_->poll();
  }
  writer_->wait();
  log_->info("done: {} steps, outputs in {}", step_, tc_.out_dir);
}

// The device, the ranks and the batch geometry: micro-batches of B x T per rank, n_micro of
// them per step over `world` ranks.
void Trainer::open_ranks() {
  if (tc_.device == "cuda" && !gpu_available())
    throw UserError(cfg_.source + ": train.device: 'cuda' but no CUDA device is available");
  gpu_ = tc_.device == "cuda" || (tc_.device == "auto" && gpu_available());
  comm_ = Comm::create(gpu_ ? Device::CUDA : Device::CPU);
  rank_ = comm_->rank();
  world_ = comm_->world();
  root_ = comm_->is_root();
  B_ = tc_.micro_batch;
  T_ = cfg_.data.seq_len;
  if (tc_.global_batch_tokens % (B_ * T_ * world_) != 0)
    throw UserError(cfg_.source + ": train.global_batch_tokens (" + std::to_string(tc_.global_batch_tokens) +
                    ") must be a multiple of micro_batch * seq_len * ranks = " + std::to_string(B_ * T_ * world_));
  n_micro_ = tc_.global_batch_tokens / (B_ * T_ * world_);
}

// One run per directory: rank 0 holds out_dir's lock from before it looks for checkpoints
// until the run ends, so a second run (fresh or --resume) into it is refused whatever the first
// has written yet. With the lock held, temp files there are a killed writer's. Then the resume
// point and the log.
std::unique_ptr<CheckpointReader> Trainer::open_run_dir(const std::string& resume) {
  std::vector<Note> notes;
  if (root_) {
    lock_ = std::make_unique<RunLock>(tc_.out_dir, cfg_.source + ": train.out_dir");
    // Every checkpoint renames a new ckpt/latest over it: found out at the first one otherwise.
    const fs::path latest = fs::path(tc_.out_dir) / "ckpt" / "latest";
    std::error_code ec;
    if (const fs::file_status st = fs::status(latest, ec); fs::exists(st) && !fs::is_regular_file(st))
      throw UserError(latest.string() +
                      " is not a regular file; the run rewrites it at every checkpoint: move it away");
    for (const StaleFile& f : remove_stale_temp_files(tc_.out_dir)) {
      const bool ckpt = fs::path(f.path).parent_path().filename() == "ckpt";
      notes.push_back({false, "removed " + f.path + " (" + std::to_string(f.bytes) +
                                  " bytes): a temp file of a run killed while writing " +
                                  (ckpt ? "a checkpoint" : "metrics.jsonl")});
    }
  }
  comm_->barrier();

  std::unique_ptr<CheckpointReader> ckpt;
  if (resume == "auto") {
    ckpt = newest_intact_checkpoint(tc_.out_dir, [&](const std::string& w) { notes.push_back({true, w}); },
                                    [&](const std::string& path) { return open_checkpoint(path); });
  } else if (!resume.empty()) {
    // A checkpoint from elsewhere into a directory with its own run would mix the two runs'
    // metrics and prune that run's checkpoints (train.keep_last).
    std::error_code ec;
    fs::path own = fs::weakly_canonical(tc_.out_dir, ec);
    if (!own.has_filename()) own = own.parent_path();  // runs/x/ as runs/x
    const fs::path from = fs::weakly_canonical(resume, ec);
    const bool inside = std::mismatch(own.begin(), own.end(), from.begin(), from.end()).first == own.end();
    if (has_checkpoints(tc_.out_dir) && !inside)
      throw UserError("train.out_dir '" + tc_.out_dir + "' holds checkpoints of its own run, and --resume " + resume +
                      " is outside it: --resume auto continues that run; to continue " + resume +
                      ", choose another out_dir");
    ckpt = open_checkpoint(resume);
  } else if (has_checkpoints(tc_.out_dir)) {
    throw UserError("train.out_dir '" + tc_.out_dir +
                    "' already holds checkpoints: pass --resume auto to continue that run, or choose another out_dir");
  }
  if (ckpt) {
    check_resumable(ckpt->data(), ckpt->path(), cfg_);
    check_same_tokenizer(*ckpt, "--resume: ");
  }
  if (tc_.warmup_steps > tc_.steps)
    notes.push_back({true, "train.warmup_steps (" + std::to_string(tc_.warmup_steps) + ") exceeds train.steps (" +
                               std::to_string(tc_.steps) + "): the learning rate never reaches train.lr"});
  // Settings of the ranks' reduction are kept (the same config serves one GPU and an mpirun job),
  // but a run of one rank says they do nothing here.
  if (world_ == 1 && (tc_.zero > 0 || tc_.reduce_dtype != "f32")) {
    std::string which = tc_.zero > 0 ? "train.zero (" + std::to_string(tc_.zero) + ")" : "";
    if (tc_.reduce_dtype != "f32")
      which += (which.empty() ? "" : " and ") + ("train.reduce_dtype (" + tc_.reduce_dtype + ")");
    notes.push_back({false, "on one rank nothing changes for " + which + ", settings for the ranks of an mpirun job"});
  }
  open_log(notes);
  return ckpt;
}

// Every rank opens the checkpoint; the ranks share the reading of its tensors to verify them and
// agree on the outcome, so all of them resume from the same one or all skip it.
std::unique_ptr<CheckpointReader> Trainer::open_checkpoint(const std::string& path) {
  std::unique_ptr<CheckpointReader> reader;
  std::string error;
  try {
    reader = std::make_unique<CheckpointReader>(path, world_ == 1);
    if (world_ > 1) reader->verify_tensors(rank_, world_);
  } catch (const UserError& e) {
    error = e.what();
  }
  const int64_t failed = world_ > 1 ? comm_->max(error.empty() ? 0 : rank_ + 1) : (error.empty() ? 0 : 1);
  if (failed == 0) return reader;
  if (!error.empty()) throw UserError(error);
  throw UserError(path + ": rank " + std::to_string(failed - 1) + " found it damaged (see its warnings)");
}

void Trainer::open_log(const std::vector<Note>& notes) {
  log_ = make_logger(tc_.out_dir, root_, rank_);
  for (const Note& n : notes) {
    if (n.warning)
      log_->warn("{}", n.text);
    else
      log_->info("{}", n.text);
  }
}

void Trainer::build_model() {
  // The data's checks (a split shorter than a sequence, ...) before the model's buffers are sized.
  batches_ = data_.train_batches(B_, T_, rank_, world_, tc_.seed);
  if (tc_.threads > 0) omp_set_num_threads(static_cast<int>(tc_.threads));
  if (gpu_) {
    gctx_ = std::make_unique<GpuContext>();
    ctx_ = gctx_->ctx();
  }
  if (!tc_.gemm_algos.empty())
    log_->info("GEMM algorithms from {}{}", tc_.gemm_algos, gpu_ ? "" : " (read, not used on the CPU)");
  model_ = std::make_unique<Model>(cfg_.model, ctx_, ModelOptions::for_training(cfg_, rank_, world_));
  model_->set_recompute(parse_recompute(tc_.recompute));
  model_->reserve(B_, data_.max_seq_len(T_));
  stepper_ = std::make_unique<TrainStep>(*model_, tc_, comm_.get());
  for (int64_t i = 0; i < n_micro_; ++i) {
    tokens_d_.emplace_back(DType::I32, ctx_.device, std::vector<int64_t>{B_, T_});
    targets_d_.emplace_back(DType::I32, ctx_.device, std::vector<int64_t>{B_, T_});
    micro_.push_back({tokens_d_.back().t, targets_d_.back().t, Tensor()});
    if (data_.documents) docs_.emplace_back(ctx_.device, B_, T_, data_.eos());
  }
  tokens_h_ = OwnedTensor(DType::I32, Device::CPU, {B_, T_});
  targets_h_ = OwnedTensor(DType::I32, Device::CPU, {B_, T_});
}

void Trainer::init_fresh() {
  if (!tc_.init_from.empty())
    init_from_checkpoint();
  else
    model_->init_params(tc_.seed);
  stepper_->sync_weights();
  const bool zero = model_->params().sharded();
  log_->info(
      "fresh run: {} parameters on {}{} ({} compute), {} rank(s) via {}{}{}, {} micro-batch(es) of {}x{} per rank per "
      "step{}",
      model_->n_params(), gpu_ ? gpu_info().name : "CPU", world_ > 1 ? " per rank" : "", dtype_name(model_->env().act),
      world_, comm_->backend(), zero ? " with ZeRO-" + std::to_string(tc_.zero) : std::string(),
      world_ > 1 && tc_.reduce_dtype == "bf16" ? ", gradients reduced in bf16" : "", n_micro_, B_, T_,
      tc_.recompute != "none" ? ", recompute " + tc_.recompute : std::string());
}

// A checkpoint's tokenizer other than the data's would give the ids other meanings.
void Trainer::check_same_tokenizer(const CheckpointReader& ckpt, const std::string& where) const {
  const std::string data_tok = data_.tokenizer_bytes(), ckpt_tok = ckpt.data().tokenizer;
  if (!data_tok.empty() && !ckpt_tok.empty() && data_tok != ckpt_tok)
    throw UserError(where + ckpt.path() + " has another SentencePiece model than data.path '" + cfg_.data.path +
                    "': prepare the data with its tokenizer (linac export writes it as tokenizer.model; linac prepare "
                    "--tokenizer FILE)");
}

// The weights must fit this model (load_params names a parameter whose name or shape differs).
// Model settings without weights (norm_eps, rope_base, rope_scaling, ...) may differ on purpose,
// a longer context's RoPE for one: each difference is logged. The tokenizer must be the data's.
void Trainer::init_from_checkpoint() {
  const std::string where = cfg_.source + ": train.init_from: ";
  std::error_code ec;
  if (!fs::exists(tc_.init_from, ec) || !is_checkpoint_path(tc_.init_from))
    throw UserError(where + "'" + tc_.init_from + "' is not a checkpoint (a .h5 file or a sharded checkpoint directory)");
  const CheckpointReader ckpt(tc_.init_from);
  const json theirs = ckpt.data().config.value("model", json::object()), ours = cfg_.to_json()["model"];
  check_same_tokenizer(ckpt, where);
  try {
    ckpt.load_params(model_->params(), false);
  } catch (const UserError& e) {
    throw UserError(where + e.what());
  }
  if (const NonFiniteReport bad = find_nonfinite(ctx_, model_->params(), comm_.get()); !bad.ok())
    throw UserError(where + ckpt.path() + " holds " + std::to_string(bad.count) + " non-finite weights");
  auto at = [](const json& j, const json::json_pointer& p) { return j.contains(p) ? j.at(p).dump() : "absent"; };
  for (const json& d : json::diff(theirs, ours)) {
    const json::json_pointer p(d.at("path").get<std::string>());
    log_->info("train.init_from: model{} is {} here, {} in the checkpoint (kept as configured)", p.to_string(),
               at(ours, p), at(theirs, p));
  }
  log_->info("initialised from {} (its step {}): weights only; optimizer, schedule and data order start fresh",
             ckpt.path(), ckpt.data().state.step);
}

void Trainer::restore(const CheckpointReader& ckpt) {
  const auto t0 = std::chrono::steady_clock::now();
  ckpt.load_params(model_->params(), true);
  if (const NonFiniteReport bad = find_nonfinite(ctx_, model_->params(), comm_.get()); !bad.ok())
    throw UserError(ckpt.path() + ": holds " + std::to_string(bad.count) +
                    " non-finite weight or optimizer values; resume from an earlier checkpoint with --resume PATH");
  stepper_->sync_weights();
  const TrainState& st = ckpt.data().state;
  step_ = st.step;
  tokens_seen_ = st.tokens_seen;
  stepper_->set_updates(st.updates);
  const LoaderState loader = resume_loader_state(ckpt);
  batches_->set_state(loader);
  log_->info("resumed from {} at step {} (loaded in {:.2f} s){}", ckpt.path(), step_,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             st.world_size != world_
                 ? fmt::format(" (written by {} rank(s), continued on {}: same data order)", st.world_size, world_)
                 : std::string());
  saved_.push_back({ckpt.path(), step_});
  // The data order continues from the checkpoint, whatever train.seed says now; the seed in
  // effect is the one recorded (config.json, the next checkpoints).
  if (loader.seed != tc_.seed) {
    if (root_)
      log_->warn(
          "train.seed is {} in {} but {} was written with seed {}: the resumed run continues that seed's "
          "data order, and records seed {}",
          tc_.seed, cfg_.source, ckpt.path(), loader.seed, loader.seed);
    cfg_.train.seed = loader.seed;
  }
}

StepStats Trainer::train_step() {
  int64_t scored = 0;  // over every rank's micro-batches: the step's gradient is that of the mean
  for (size_t i = 0; i < micro_.size(); ++i) {
    MicroBatch& mb = micro_[i];
    scored += batches_->next(tokens_h_->data<int32_t>(), targets_h_->data<int32_t>());
    copy_tensor(mb.tokens, tokens_h_);
    copy_tensor(mb.targets, targets_h_);
    if (!docs_.empty()) mb.docs = docs_[i].compute(tokens_h_->data<int32_t>(), B_, T_);
  }
  const StepStats st = stepper_->run(step_, micro_, scored);
  ++step_;
  tokens_seen_ += tc_.global_batch_tokens;
  window_.tokens += tc_.global_batch_tokens;
  return st;
}

// Counts the step into the log window; a skipped step is logged (and ends the run after
// train.max_bad_steps in a row). At a log step: the finiteness check, the log line and its
// metrics record (null otherwise, or the skipped-step record).
json Trainer::account(const StepStats& st) {
  json rec;
  if (st.skipped) {
    ++bad_in_row_;
    log_->warn("step {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} in a row)", step_, st.loss,
               st.grad_norm, bad_in_row_);
    metrics_->write({{"step", step_}, {"skipped", true}, {"loss", std::isfinite(st.loss) ? json(st.loss) : json(nullptr)}});
    // The weights the first of these steps started from gave it the non-finite values, and a
    // resume replays it bit for bit, whatever the lr: the checkpoint to go back to is older.
    if (bad_in_row_ >= tc_.max_bad_steps)
      throw diverged(std::to_string(step_) + ": " + std::to_string(bad_in_row_) +
                         " steps in a row had a non-finite loss or gradient norm (train.max_bad_steps)",
                     step_ - bad_in_row_ - 1, "before them");
  } else {
    bad_in_row_ = 0;
    window_.loss_sum += st.loss;
    ++window_.losses;
  }
  if (!(step_ % tc_.log_every == 0 || step_ == tc_.steps)) return rec;
  check_finite();
  const auto now = std::chrono::steady_clock::now();
  const double tps = static_cast<double>(window_.tokens) / std::max(std::chrono::duration<double>(now - window_.start).count(), 1e-9);
  const double peak_tflops = gpu_ ? gpu_info().bf16_dense_tflops : 0.0;
  const double mfu = peak_tflops > 0 ? model_->flops_per_token(T_) * tps / (peak_tflops * 1e12 * world_) : 0.0;
  const double elapsed = seconds_since_start();
  const double remaining = elapsed / static_cast<double>(step_ - first_step_) * static_cast<double>(tc_.steps - step_);
  const double mean_loss = window_.losses ? window_.loss_sum / static_cast<double>(window_.losses) : st.loss;
  rec = {{"step", step_}, {"loss", mean_loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps},
         {"tokens_seen", tokens_seen_}, {"mfu", mfu}, {"mem", gpu_ ? static_cast<int64_t>(gpu_bytes_in_use()) : 0},
         {"time_s", elapsed}};
  if (st.aux_loss != 0) rec["aux_loss"] = st.aux_loss;
  log_->info("step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{} | ETA {}", step_, tc_.steps,
             mean_loss, st.aux_loss != 0 ? fmt::format(" (aux {:.5f})", st.aux_loss) : "", st.lr, st.grad_norm, tps,
             peak_tflops > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", duration_text(remaining));
  window_ = LogWindow{now};
  return rec;
}

void Trainer::save() {
  check_finite();
  CheckpointData d;
  d.config = cfg_.to_json();
  d.state.step = step_;
  d.state.updates = stepper_->updates();
  d.state.tokens_seen = tokens_seen_;
  d.state.world_size = world_;
  d.state.seed = tc_.seed;
  d.state.loader = comm_->allgather(batches_->state().to_vector());
  d.tokenizer = data_.tokenizer_bytes();
  ctx_synchronize(ctx_);
  if (step_ == drift_at_step_)  // for tests only: this rank's replica drifts, the check must catch it
    zero_tensor(ctx_, model_->params().replica().front());
  check_replicas_agree(false);
  const ParamStore& ps = model_->params();
  // Each rank writes its piece (under ZeRO the shard it owns) from a host copy, in the background.
  const std::string path = writer_->start(ps, d);
  saved_.push_back({path, step_});
}

double Trainer::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
}

}  // namespace linac
