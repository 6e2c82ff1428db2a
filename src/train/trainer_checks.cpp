// What ends a run before a checkpoint can carry a fault: the weights must be finite, every rank
// must run the same configuration and hold the same replicated parameters; and the message of a
// run that ends that way (Trainer::diverged), which names the last checkpoint worth resuming.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "comm/comm.h"
#include "reduce/reduce.h"
#include "train/checkpoint_writer.h"
#include "train/content_hash.h"
#include "train/finite_check.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

// A hash of what every rank holds identically (ParamStore::replica: the master weights, or under
// ZeRO-1 the compute weights and the replicated masters): ranks of one job must agree. Hashed
// where it lives (hash_words). Before, copying it to the host and hashing it there stalled every
// multi-rank checkpoint of a 1.3B model 1.1 s (2.7 GB per rank, 2 x H200, 2026-12-01).
int64_t params_hash(const Ctx& ctx, const ParamStore& ps) {
  uint64_t h = 0;
  for (const Tensor& t : ps.replica()) h = hash_words(ctx, t, h);
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

// Inf or NaN in the weights, the AdamW moments or the buffers ends the run before a
// checkpoint can hold it.
void Trainer::check_finite() {
  if (finite_at_ == step_) return;  // a logged step that also checkpoints: checked once
  const NonFiniteReport bad = find_nonfinite(ctx_, model_->params(), comm_.get());
  if (bad.ok()) {
    finite_at_ = step_;
    return;
  }
  std::string where;
  for (size_t i = 0; i < bad.tensors.size() && i < 4; ++i) where += (i ? ", " : "") + bad.tensors[i];
  if (bad.tensors.size() > 4) where += ", ...";
  throw diverged(std::to_string(step_) + ": " + std::to_string(bad.count) +
                     " weight or optimizer values are not finite" + (where.empty() ? "" : " (" + where + ")") +
                     ", so no checkpoint was written",
                 step_);
}

// Every rank of a job must run the same configuration (file and --set overrides): a rank with
// another seed would start from other weights, one with another lr or schedule would drift from
// the others, one with another step count would wait at a collective the others never reach. The
// ranks compare a hash of each setting (leaves of Config::to_json, whose keys are the same on
// every rank when the counts agree) and name the first that differs.
void Trainer::check_configs_agree() {
  if (world_ == 1) return;
  const json flat = cfg_.to_json().flatten();
  std::vector<int64_t> hashes;
  for (const auto& [key, value] : flat.items())
    hashes.push_back(static_cast<int64_t>(content_hash(key + "=" + value.dump()) >> 1));
  const auto all =
      comm_->allgather({static_cast<int64_t>(hashes.size()), static_cast<int64_t>(content_hash(flat.dump()) >> 1)});
  int other = 0;
  for (int r = 1; r < world_ && !other; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) other = r;
  if (!other) return;
  // Optional settings (model.layers, a mixer's keys) make the key lists differ: then no key-by-key
  // comparison (allgather needs one length).
  if (all[static_cast<size_t>(other)][0] != all[0][0])
    throw UserError(cfg_.source + ": rank 0 and rank " + std::to_string(other) +
                    " set different settings: every rank of a job must run the same configuration and --set overrides");
  const auto per_key = comm_->allgather(hashes);
  auto it = flat.items().begin();
  for (size_t i = 0; i < hashes.size(); ++i, ++it)
    if (per_key[static_cast<size_t>(other)][i] != per_key[0][i]) {
      std::string key = it.key().substr(1);
      std::replace(key.begin(), key.end(), '/', '.');
      throw UserError(cfg_.source + ": " + key + " differs between rank 0 and rank " + std::to_string(other) +
                      ": every rank of a job must run the same configuration and --set overrides");
    }
  throw UserError(cfg_.source + ": the configurations of rank 0 and rank " + std::to_string(other) + " differ");
}

// The parameters every rank holds alike (params_hash) must agree: when the run starts (after
// init or resume: ranks resumed from different checkpoints, or initialised from different files
// at one path on different hosts) and at every checkpoint (ranks that drifted apart), where a
// mismatch ends the run before anything is written.
void Trainer::check_replicas_agree(bool at_start) {
  if (world_ == 1) return;
  ctx_synchronize(ctx_);
  const auto hashes = comm_->allgather({params_hash(ctx_, model_->params())});
  for (int r = 1; r < world_; ++r) {
    if (hashes[static_cast<size_t>(r)] == hashes[0]) continue;
    const std::string what = "rank " + std::to_string(r) + "'s parameters differ from rank 0's";
    if (at_start)
      throw UserError(what + " when the run starts (step " + std::to_string(step_) +
                      "): every rank must start from the same weights (the same init_from or --resume checkpoint)");
    // Every rank sees the same hashes, so all of them end here, after the checkpoint in flight
    // (its ranks agreed when it was taken).
    throw diverged(
        std::to_string(step_) + ": " + what + " (data-parallel ranks drifted apart), so no checkpoint was written",
        step_, "where the ranks agreed", "", "; a drift that recurs points at a faulty GPU or a bug");
  }
}

Diverged Trainer::diverged(const std::string& why, int64_t good_step, const std::string& good,
                           const std::string& remedy, const std::string& note) {
  writer_->wait();  // every rank gets here at the same step: the checkpoint in flight is published
  std::string last = saved_.empty() ? "none: no checkpoint was written"
                                    : "none: the checkpoints this run wrote or resumed from are of later steps";
  bool usable = false;
  if (const auto it = std::find_if(saved_.rbegin(), saved_.rend(), [&](const Saved& s) { return s.step <= good_step; });
      it != saved_.rend()) {
    std::error_code ec;
    usable = fs::exists(it->path, ec);
    last = usable ? it->path + " (step " + std::to_string(it->step) + ")"
                  : "none left: " + it->path + " (step " + std::to_string(it->step) +
                        ") was removed to keep train.keep_last (" + std::to_string(tc_.keep_last) + ") newer ones";
  }
  const std::string then = usable           ? "resume from it"
                           : saved_.empty() ? "start over"
                                            : "resume from an earlier one or start over";
  const std::string msg = "training diverged at step " + why + "; the last checkpoint " + good + " is " + last + " (" +
                          (remedy.empty() ? then : remedy + ", then " + then) + note + ")";
  // The console gets it once, as the command's error line; train.log keeps why the run ended.
  for (const spdlog::sink_ptr& sink : log_->sinks())
    if (std::dynamic_pointer_cast<spdlog::sinks::basic_file_sink_mt>(sink)) {
      spdlog::logger file_only("linac", sink);
      file_only.error("{}", msg);
      file_only.flush();
    }
  return Diverged(msg);
}

}  // namespace linac
