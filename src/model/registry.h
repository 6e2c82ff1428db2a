// The registries: mixer kinds (what a layer's token mixer can be) and architectures (what
// `model.arch` names: a default layer pattern over those kinds).
//
// A mixer kind validates its options block and builds one layer's mixer from it. An
// architecture names its primary kind (the one `model.mixer` configures) and the layer pattern
// used when the config gives neither `model.layers` nor `model.layer_pattern`
// (model/layer_plan.h resolves a config into one LayerSpec per layer).
//
// Adding a token mixer = a kernels/ family, a mixer in src/model/mixers/, one MixerKind entry in
// registry.cpp, tests. Adding an architecture = one ArchInfo entry, a config and tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

// One layer's token mixer as the config chose it.
struct LayerSpec {
  std::string name;  // the name the layer list used (a kind, or a key of model.mixers)
  std::string kind;  // the MixerKind
  json options;      // the kind's options block (without "type")
  std::string path;  // JSON path of the options block, for messages ("model.mixers.swa")
  int kind_index = 0;  // how many earlier layers of the stack have the same kind (resolve_layers)
};

struct MixerKind {
  std::string name;
  std::string summary;
  // Throws UserError for bad options, naming `<spec.path>.<key>` in `file`.
  std::function<void(const LayerSpec& spec, const ModelConfig& cfg, const std::string& file)> validate;
  std::function<std::unique_ptr<Mixer>(ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& spec)> make;
  // Whether two valid options blocks of this kind configure the same mixer, defaults filled in
  // ({} and {"rope": true} do; a resume compares a checkpoint's stack with the config's by it).
  std::function<bool(const LayerSpec& a, const LayerSpec& b, const ModelConfig& cfg)> same_options;
};

struct ArchInfo {
  std::string name;
  std::string summary;
  std::string primary;               // the mixer kind `model.mixer` configures
  std::vector<std::string> pattern;  // default layer kinds, repeated over n_layers
  // Defaults of the shared block parts (ModelConfig::norm, channel_mixer, embed_scale).
  std::string norm = "rmsnorm";
  std::string channel_mixer = "swiglu";
  bool sqrt_d_embed_scale = false;   // embed_scale sqrt(d_model) instead of 1
};

const std::vector<MixerKind>& mixer_kinds();
// UserError naming `file` and `path` (with a did-you-mean) when unknown.
const MixerKind& find_mixer_kind(const std::string& name, const std::string& path, const std::string& file);

const std::vector<ArchInfo>& architectures();
// UserError naming `file` and model.arch (with a did-you-mean) when unknown.
const ArchInfo& find_architecture(const std::string& name, const std::string& file);

// The block parts a config resolves to (its own value, else its architecture's default).
std::string model_norm(const ModelConfig& cfg);
std::string model_channel_mixer(const ModelConfig& cfg);
double model_embed_scale(const ModelConfig& cfg);

}  // namespace linac
