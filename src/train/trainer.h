// The training loop behind `linac train`: run directory, logging, metrics, periodic
// validation, checkpoints, exact resume and clean stops on SIGINT/SIGTERM.
//
// Run directory (train.out_dir, held by rank 0's RunLock for the whole run): config.json (the
// resolved config), train.log, metrics.jsonl (one JSON object per logged step),
// ckpt/step_NNNNNN.h5 (one rank) or the directories ckpt/step_NNNNNN/ (several ranks, one file per rank;
// train/checkpoint.h), ckpt/latest, .lock. Checkpoints are written in the background
// (train/checkpoint_writer.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/gpu.h"
#include "data/documents.h"
#include "train/gemm_algo_table.h"
#include "train/train_data.h"
#include "train/train_step.h"

namespace spdlog {
class logger;
}

namespace linac {

class CheckpointReader;
class CheckpointWriter;
class Comm;
class RunLock;
class MetricsLog;

// resume: "" (fresh run; refused if out_dir already holds checkpoints), "auto" (the newest
// checkpoint of out_dir, or a fresh start when there is none) or a checkpoint path.
// Returns the process exit status (0); throws UserError for bad input and Diverged when the
// run's numbers stop being finite.
int run_training(const Config& cfg, const std::string& resume);

class Trainer {
 public:
  // Opens the run: devices and ranks, the data, the run directory (lock, resume point,
  // config.json, log), the model, fresh or restored.
  Trainer(const Config& cfg, const std::string& resume);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to train.steps, or to the step a stop signal arrives at (then checkpoints).
  void run();

 private:
  // What is logged as one line: the steps since the last logged one.
  struct LogWindow {
    std::chrono::steady_clock::time_point start;
    int64_t tokens = 0, losses = 0;
    double loss_sum = 0;
  };

  // What opening the run found before the log existed (stale files removed, checkpoints skipped).
  struct Note {
    bool warning;
    std::string text;
  };

  void open_ranks();
  std::unique_ptr<CheckpointReader> open_run_dir(const std::string& resume);
  std::unique_ptr<CheckpointReader> open_checkpoint(const std::string& path);
  void open_log(const std::vector<Note>& notes);
  void started();
  void check_same_tokenizer(const CheckpointReader& ckpt, const std::string& where) const;
  void build_model();
  void init_fresh();
  // init_fresh's start from train.init_from's weights.
  void init_from_checkpoint();
  void restore(const CheckpointReader& ckpt);

  StepStats train_step();
  json account(const StepStats& st);
  void check_configs_agree();
  void check_out_dir() const;
  void report_dropped_metrics();
  void check_replicas_agree(bool at_start);
  void check_finite();
  void save();
  bool due(int64_t every) const { return every > 0 && (step_ % every == 0 || step_ == tc_.steps); }
  // The run's end when training cannot go on: the checkpoint in flight finished, the message names
  // the newest checkpoint of at most step `good_step` (the last one a resume can go on from),
  // `good` says what makes it good ("with finite values"), `remedy` what to change before
  // resuming from it (or starting over, without one), `note` anything to add.
  Diverged diverged(const std::string& why, int64_t good_step, const std::string& good = "with finite values",
                    const std::string& remedy = "lower train.lr or raise train.adam_eps", const std::string& note = "");
  double seconds_since_start() const;

  // The run's own copy: a resumed run takes the checkpoint's train.seed (restore), and config.json
  // and the checkpoints record the settings in effect.
  Config cfg_;
  const TrainConfig& tc_;
  std::unique_ptr<Comm> comm_;
  int rank_ = 0, world_ = 1;
  bool root_ = true, gpu_ = false;
  int64_t B_ = 0, T_ = 0, n_micro_ = 0;
  int64_t drift_at_step_ = -1;  // LINAC_TEST_DRIFT_AT_STEP (docs/cli.md)
  TrainData data_;
  std::unique_ptr<RunLock> lock_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<GpuContext> gctx_;
  Ctx ctx_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<TrainStep> stepper_;
  std::unique_ptr<TrainBatches> batches_;
  std::unique_ptr<Validation> validation_;
  std::optional<GemmAlgoTable> gemm_table_;  // train.gemm_algos, installed (on the GPU)
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<OwnedTensor> tokens_d_, targets_d_;
  std::vector<MicroBatch> micro_;
  std::vector<DocBoundsBuffer> docs_;  // one per micro-batch (data.packing "document")
  OwnedTensor tokens_h_, targets_h_;

  int64_t step_ = 0, first_step_ = 0, tokens_seen_ = 0, bad_in_row_ = 0;
  int64_t finite_at_ = -1;  // the step whose weights check_finite last found finite
  // This run's checkpoints and the one it resumed from, oldest first: what a diverged run points
  // back to (each held finite values when written).
  struct Saved {
    std::string path;
    int64_t step;
  };
  std::vector<Saved> saved_;
  std::chrono::steady_clock::time_point t_start_;
  LogWindow window_;
};

}  // namespace linac
