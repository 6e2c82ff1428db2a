#include "model/layer_plan.h"

#include <map>
#include <set>

#include "config/json_reader.h"
#include "core/error.h"

namespace linac {

namespace {

bool is_kind(const std::string& name) {
  for (const auto& k : mixer_kinds())
    if (k.name == name) return true;
  return false;
}

std::string kind_list() {
  std::string list;
  for (const auto& k : mixer_kinds()) list += (list.empty() ? "" : ", ") + k.name;
  return list;
}

}  // namespace

std::vector<LayerSpec> resolve_layers(const ModelConfig& cfg, const std::string& file) {
  const ArchInfo& arch = find_architecture(cfg.arch, file);
  const bool legacy = cfg.mixer.is_object() && !cfg.mixer.empty();
  if (!cfg.layers.empty() && !cfg.layer_pattern.empty())
    throw UserError(file + ": model.layers and model.layer_pattern: give one of them, not both");

  // The named options blocks.
  std::map<std::string, LayerSpec> named;
  if (!cfg.mixers.is_null() && !cfg.mixers.is_object())
    throw UserError(file + ": model.mixers: expected an object of {name: options}, got " + cfg.mixers.dump());
  if (cfg.mixers.is_object())
    for (const auto& [name, block] : cfg.mixers.items()) {
      const std::string path = "model.mixers." + name;
      if (block.is_null()) continue;  // null reads as absent: the kind's defaults
      if (!block.is_object()) throw UserError(file + ": " + path + ": expected an object of options, got " + block.dump());
      LayerSpec s{name, name, block, path};
      if (block.contains("type")) {
        if (!block.at("type").is_string())
          throw UserError(file + ": " + path + ".type: expected a mixer kind name, got " + block.at("type").dump());
        s.kind = find_mixer_kind(block.at("type").get<std::string>(), path + ".type", file).name;
        s.options.erase("type");
        // A block named after a kind is that kind: "attention" meaning a GLA mixer misleads every reader.
        if (is_kind(name) && s.kind != name)
          throw UserError(file + ": " + path + ".type: a block named after the mixer kind '" + name +
                          "' must be that kind, got '" + s.kind + "' (give the " + s.kind +
                          " mixer a name of its own)");
      } else if (!is_kind(name)) {
        throw UserError(file + ": " + path + ": '" + name + "' is not a mixer kind (" + kind_list() +
                        "): name its kind with \"type\"");
      }
      if (legacy && s.kind == arch.primary && name == arch.primary)
        throw UserError(file + ": model.mixer and " + path + " both configure the '" + name +
                        "' mixer: use one of them");
      named.emplace(name, std::move(s));
    }

  // One name per layer.
  const bool explicit_list = !cfg.layers.empty();
  const std::vector<std::string>& names =
      explicit_list ? cfg.layers : (!cfg.layer_pattern.empty() ? cfg.layer_pattern : arch.pattern);
  const std::string list_key = explicit_list ? "model.layers" : "model.layer_pattern";
  if (explicit_list && static_cast<int64_t>(names.size()) != cfg.n_layers)
    throw UserError(file + ": model.layers: has " + std::to_string(names.size()) + " entries but model.n_layers is " +
                    std::to_string(cfg.n_layers) + " (use model.layer_pattern for a repeating pattern)");
  if (!explicit_list && !cfg.layer_pattern.empty() && static_cast<int64_t>(names.size()) > cfg.n_layers)
    throw UserError(file + ": model.layer_pattern: has " + std::to_string(names.size()) +
                    " entries but model.n_layers is " + std::to_string(cfg.n_layers) + ", so entries from [" +
                    std::to_string(cfg.n_layers) + "] on would name no layer");

  std::vector<LayerSpec> plan;
  std::set<std::string> used;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const size_t i = static_cast<size_t>(l) % names.size();
    const std::string& name = names[i];
    used.insert(name);
    if (auto it = named.find(name); it != named.end()) {
      plan.push_back(it->second);
    } else if (is_kind(name)) {
      if (legacy && name == arch.primary)
        plan.push_back({name, name, cfg.mixer, "model.mixer"});
      else
        plan.push_back({name, name, json::object(), "model.mixers." + name});
    } else {
      std::vector<std::string> candidates;
      for (const auto& k : mixer_kinds()) candidates.push_back(k.name);
      for (const auto& [n, s] : named) candidates.push_back(n);
      const std::string near = closest(name, candidates);
      throw UserError(file + ": " + list_key + "[" + std::to_string(i) + "]: unknown mixer '" + name +
                      "' (kinds: " + kind_list() + "; or define it in model.mixers)" +
                      (near.empty() ? "" : "; did you mean '" + near + "'?"));
    }
  }
  std::map<std::string, int> seen;
  for (LayerSpec& s : plan) s.kind_index = seen[s.kind]++;
  for (const auto& [name, s] : named)
    if (!used.count(name))
      throw UserError(file + ": " + s.path + ": no layer uses this mixer (the layers use " +
                      [&] {
                        std::string u;
                        for (const auto& n : used) u += (u.empty() ? "" : ", ") + n;
                        return u;
                      }() +
                      ")");
  if (legacy && !used.count(arch.primary))
    throw UserError(file + ": model.mixer: configures the '" + arch.primary +
                    "' mixer, which no layer uses (give each kind's options in model.mixers)");
  return plan;
}

void validate_layers(const ModelConfig& cfg, const std::string& file) {
  std::set<std::string> seen;
  for (const LayerSpec& s : resolve_layers(cfg, file))
    if (seen.insert(s.name).second) find_mixer_kind(s.kind, s.path, file).validate(s, cfg, file);
}

}  // namespace linac
