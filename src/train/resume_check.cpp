#include "train/resume_check.h"

#include <algorithm>

#include "core/error.h"
#include "model/layer_plan.h"
#include "model/registry.h"

namespace linac {

namespace {

// The keys where two records differ, under `prefix` ("model.mixer.kv_heads, model.layers").
std::string differing_keys(const json& theirs, const json& ours, const std::string& prefix) {
  std::string fields;
  for (const json& d : json::diff(theirs, ours)) {
    std::string key = prefix + d.at("path").get<std::string>();  // a JSON pointer: /mixer/kv_heads
    std::replace(key.begin(), key.end(), '/', '.');
    fields += (fields.empty() ? "" : ", ") + key;
  }
  return fields;
}

// Where the checkpoint's model differs from the config's ("" when it is the same model). The
// mixer blocks as written (model.mixer, mixers, layers, layer_pattern) may differ if they resolve
// to the same stack: each layer the same kind with the same options, defaults filled in. The
// other model keys are recorded resolved and compare as they are.
std::string model_difference(const json& theirs, const json& ours, const std::string& path, const Config& cfg) {
  if (theirs == ours) return "";
  json a = theirs, b = ours;
  for (const char* key : {"mixer", "mixers", "layers", "layer_pattern"}) {
    a.erase(key);
    b.erase(key);
  }
  if (a != b) return differing_keys(a, b, "model");
  ModelConfig their_model;
  try {
    their_model = Config::from_json(json{{"model", theirs}}, path).model;
  } catch (const UserError&) {
    return differing_keys(theirs, ours, "model");  // a record this version no longer reads: compared as written
  }
  const std::vector<LayerSpec> pa = resolve_layers(their_model, path), pb = resolve_layers(cfg.model, cfg.source);
  for (size_t l = 0; l < pa.size() && l < pb.size(); ++l) {
    const std::string layer = "layer " + std::to_string(l);
    if (pa[l].kind != pb[l].kind)
      return layer + "'s mixer (" + pa[l].kind + " in the checkpoint, " + pb[l].kind + " here)";
    if (find_mixer_kind(pa[l].kind, pa[l].path, path).same_options(pa[l], pb[l], cfg.model)) continue;
    return differing_keys(pa[l].options, pb[l].options, pb[l].path) + " (" + layer + ", " + pb[l].kind + ")";
  }
  return "";
}

}  // namespace

void check_resumable(const CheckpointData& meta, const std::string& path, const Config& cfg) {
  const json recorded = cfg.to_json();
  if (const std::string where =
          model_difference(meta.config.value("model", json::object()), recorded["model"], path, cfg);
      !where.empty())
    throw UserError(path + ": the checkpoint's model config differs at " + where + " from the one " + cfg.given(where) +
                    "; refusing to resume");
  if (meta.state.loader.empty()) throw UserError(path + ": no data loader state to resume from");
  // The loader's position counts sequences of the run's layout: with another length, packing or
  // kind of data the same position names other tokens, and the run would not continue its data.
  // (Checkpoints older than a key lack it; the path may differ: a dataset moved to another disk.)
  const json their_data = meta.config.value("data", json::object()), our_data = recorded["data"];
  for (const char* key : {"type", "seq_len", "packing", "mqar"})
    if (their_data.contains(key) && their_data[key] != our_data.value(key, json()))
      throw UserError(path + ": the checkpoint's data." + key + " (" + their_data[key].dump() + ") differs from the " +
                      our_data.value(key, json()).dump() + " " + cfg.given(std::string("data.") + key) +
                      ", so the run cannot continue its data order; refusing to resume (train.init_from starts a "
                      "new run from its weights)");
  if (meta.state.step > cfg.train.steps)
    throw UserError(cfg.source + ": train.steps: " + std::to_string(cfg.train.steps) + " is below the step of " + path +
                    " (" + std::to_string(meta.state.step) + "); raise it to train on from there");
}

}  // namespace linac
