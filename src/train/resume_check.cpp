#include "train/resume_check.h"

#include <algorithm>

#include "core/error.h"

namespace linac {

void check_resumable(const CheckpointData& meta, const std::string& path, const Config& cfg) {
  const json recorded = cfg.to_json();
  const json theirs = meta.config.value("model", json::object()), ours = recorded["model"];
  if (theirs != ours) {
    std::string fields;
    for (const json& d : json::diff(theirs, ours)) {
      std::string key = "model" + d.at("path").get<std::string>();  // a JSON pointer: model/mixer/kv_heads
      std::replace(key.begin(), key.end(), '/', '.');
      fields += (fields.empty() ? "" : ", ") + key;
    }
    throw UserError(path + ": the checkpoint's model config differs from " + cfg.source + "'s at " + fields +
                    " (written as given, so an option set to its default still differs from one left out); "
                    "refusing to resume");
  }
  if (meta.state.loader.empty()) throw UserError(path + ": no data loader state to resume from");
  // The loader's position counts sequences of the run's layout: with another length, packing or
  // kind of data the same position names other tokens, and the run would not continue its data.
  // (Checkpoints older than a key lack it; the path may differ: a dataset moved to another disk.)
  const json their_data = meta.config.value("data", json::object()), our_data = recorded["data"];
  for (const char* key : {"type", "seq_len", "packing", "mqar"})
    if (their_data.contains(key) && their_data[key] != our_data.value(key, json()))
      throw UserError(path + ": the checkpoint's data." + key + " (" + their_data[key].dump() + ") differs from " +
                      cfg.source + "'s (" + our_data.value(key, json()).dump() +
                      "), so the run cannot continue its data order; refusing to resume (train.init_from starts a "
                      "new run from its weights)");
  if (meta.state.step > cfg.train.steps)
    throw UserError(cfg.source + ": train.steps (" + std::to_string(cfg.train.steps) + ") is below the step of " +
                    path + " (" + std::to_string(meta.state.step) + "); raise it to train on from there");
}

}  // namespace linac
