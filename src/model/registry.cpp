#include "model/registry.h"

#include "config/json_reader.h"
#include "model/mixers/gla.h"
#include "model/mixers/transformer.h"

namespace linac {

const std::vector<ArchInfo>& architectures() {
  static const std::vector<ArchInfo> table = {
      {"transformer", "Transformer++: causal softmax attention with RoPE (LLaMA-style)",
       [](const json& o, const std::string& file) { AttentionMixerOptions::parse(o, file); },
       [](ModelEnv& env, const ModelConfig& cfg, int layer) -> std::unique_ptr<Mixer> {
         return std::make_unique<AttentionMixer>(env, cfg, layer);
       }},
      {"gla", "GLA: gated linear attention, chunkwise (Yang et al. 2023), with a SwiGLU MLP",
       [](const json& o, const std::string& file) { GlaMixerOptions::parse(o, file); },
       [](ModelEnv& env, const ModelConfig& cfg, int layer) -> std::unique_ptr<Mixer> {
         return std::make_unique<GlaMixer>(env, cfg, layer);
       }},
  };
  return table;
}

const ArchInfo& find_architecture(const std::string& name, const std::string& file) {
  std::vector<std::string> names;
  for (const auto& a : architectures()) {
    if (a.name == name) return a;
    names.push_back(a.name);
  }
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string near = closest(name, names);
  throw UserError(file + ": model.arch: '" + name + "' is not one of " + list +
                  (near.empty() ? "" : " (did you mean '" + near + "'?)"));
}

}  // namespace linac
