// The architecture registry: `model.arch` -> how to validate its `model.mixer` options and
// how to build one layer's token mixer. Adding an architecture = a kernels/ family, a mixer in
// src/model/mixers/, one entry in registry.cpp, a config and tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

struct ArchInfo {
  std::string name;
  std::string summary;
  // Throws UserError for bad options (naming `model.mixer.<key>` in `file`).
  std::function<void(const json& options, const std::string& file)> validate;
  std::function<std::unique_ptr<Mixer>(ModelEnv& env, const ModelConfig& cfg, int layer)> make_mixer;
};

const std::vector<ArchInfo>& architectures();
// UserError naming `file` and model.arch (with a did-you-mean) when unknown.
const ArchInfo& find_architecture(const std::string& name, const std::string& file);

}  // namespace linac
