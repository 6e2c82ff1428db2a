#include "model/registry.h"

#include <cmath>

#include "config/json_reader.h"
#include "model/mixers/base_conv.h"
#include "model/mixers/gla.h"
#include "model/mixers/latte.h"
#include "model/mixers/taylor.h"
#include "model/mixers/lightning.h"
#include "model/mixers/attention.h"
#include "model/mixers/vq_gau.h"

namespace linac {

namespace {

std::string names_of(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

}  // namespace

const std::vector<MixerKind>& mixer_kinds() {
  static const std::vector<MixerKind> table = {
      {"attention", "causal softmax attention with RoPE (optionally windowed)",
       [](const LayerSpec& s, const ModelConfig& cfg, const std::string& file) {
         AttentionMixerOptions::parse(s.options, s.path, file, false, cfg.n_heads);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<AttentionMixer>(
             env, cfg, layer, AttentionMixerOptions::parse(s.options, s.path, "config", false, cfg.n_heads));
       }},
      {"sliding_window", "causal softmax attention with RoPE in a sliding window (default 64 keys)",
       [](const LayerSpec& s, const ModelConfig& cfg, const std::string& file) {
         AttentionMixerOptions::parse(s.options, s.path, file, true, cfg.n_heads);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<AttentionMixer>(
             env, cfg, layer, AttentionMixerOptions::parse(s.options, s.path, "config", true, cfg.n_heads));
       }},
      {"gla", "gated linear attention, chunkwise (Yang et al. 2023)",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         GlaMixerOptions::parse(s.options, s.path, file);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<GlaMixer>(env, cfg, layer, GlaMixerOptions::parse(s.options, s.path, "config"), s.path);
       }},
      {"taylor", "Based's linear attention with the 2nd-order Taylor feature map (Arora et al. 2024)",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         TaylorMixerOptions::parse(s.options, s.path, file);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<TaylorMixer>(env, cfg, layer, TaylorMixerOptions::parse(s.options, s.path, "config"),
                                              s.path);
       }},
      {"lightning",
       "TransNormerLLM's token mixer: SiLU q/k, LRPE, Lightning Attention (decayed linear attention), SRMSNorm, output "
       "gate",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         LightningMixerOptions::parse(s.options, s.path, file);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<LightningMixer>(env, cfg, layer, s.kind_index == 0,
                                                 LightningMixerOptions::parse(s.options, s.path, "config"), s.path);
       }},
      {"vq_gau",
       "Transformer-VQ's gated attention unit: VQ-attention over quantized keys with a compressive cache (Lingle 2023)",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         VqGauMixerOptions::parse(s.options, s.path, file);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<VqGauMixer>(env, cfg, layer, VqGauMixerOptions::parse(s.options, s.path, "config"), s.path);
       }},
      {"latte",
       "Latte: latent attention, per-token softmax over latents of causally normalised value summaries, VAPOR "
       "positions (Dolga et al. 2024)",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         LatteMixerOptions::parse(s.options, s.path, file, false);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<LatteMixer>(env, cfg, layer, LatteMixerOptions::parse(s.options, s.path, "config", false),
                                             false, s.path);
       }},
      {"latte_macchiato",
       "Latte-Macchiato: Latte over a convolved stream mixed with sliding-window attention as a local state",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         LatteMixerOptions::parse(s.options, s.path, file, true);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<LatteMixer>(env, cfg, layer, LatteMixerOptions::parse(s.options, s.path, "config", true),
                                             true, s.path);
       }},
      {"base_conv", "Based's gated short convolution (BaseConv)",
       [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
         BaseConvMixerOptions::parse(s.options, s.path, file);
       },
       [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
         return std::make_unique<BaseConvMixer>(env, cfg, layer, BaseConvMixerOptions::parse(s.options, s.path, "config"),
                                                s.path);
       }},
  };
  return table;
}

const MixerKind& find_mixer_kind(const std::string& name, const std::string& path, const std::string& file) {
  std::vector<std::string> names;
  for (const auto& k : mixer_kinds()) {
    if (k.name == name) return k;
    names.push_back(k.name);
  }
  const std::string near = closest(name, names);
  throw UserError(file + ": " + path + ": '" + name + "' is not a mixer kind (" + names_of(names) + ")" +
                  (near.empty() ? "" : "; did you mean '" + near + "'?"));
}

const std::vector<ArchInfo>& architectures() {
  static const std::vector<ArchInfo> table = {
      {"transformer", "Transformer++: causal softmax attention with RoPE (LLaMA-style)", "attention", {"attention"}},
      {"gla", "GLA: gated linear attention, chunkwise (Yang et al. 2023), with a SwiGLU MLP", "gla", {"gla"}},
      {"based", "Based: Taylor linear attention, sliding-window attention and BaseConv layers (Arora et al. 2024)",
       "taylor", {"base_conv", "taylor", "sliding_window", "base_conv", "base_conv"}},
      {"transnormer", "TransNormerLLM: Lightning Attention token mixer, SRMSNorm, SGLU (Qin et al. 2024)", "lightning",
       {"lightning"}, "srmsnorm", "sglu", true},
      {"transformer_vq", "Transformer-VQ: gated attention units with VQ-attention, no separate MLP (Lingle 2023)", "vq_gau",
       {"vq_gau"}, "rmsnorm", "none"},
      {"latte", "Latte++: latent attention with VAPOR, RMSNorm, SwiGLU (Dolga et al. 2024)", "latte", {"latte"}},
      {"latte_macchiato", "Latte-Macchiato (Latte-Conv-SWA++): latent attention plus a sliding-window local state (Dolga et al. 2024)",
       "latte_macchiato", {"latte_macchiato"}},
  };
  return table;
}

const ArchInfo& find_architecture(const std::string& name, const std::string& file) {
  std::vector<std::string> names;
  for (const auto& a : architectures()) {
    if (a.name == name) return a;
    names.push_back(a.name);
  }
  const std::string near = closest(name, names);
  throw UserError(file + ": model.arch: '" + name + "' is not one of " + names_of(names) +
                  (near.empty() ? "" : " (did you mean '" + near + "'?)"));
}

std::string model_norm(const ModelConfig& cfg) {
  return cfg.norm.empty() ? find_architecture(cfg.arch, "config").norm : cfg.norm;
}

std::string model_channel_mixer(const ModelConfig& cfg) {
  return cfg.channel_mixer.empty() ? find_architecture(cfg.arch, "config").channel_mixer : cfg.channel_mixer;
}

double model_embed_scale(const ModelConfig& cfg) {
  if (cfg.embed_scale > 0) return cfg.embed_scale;
  return find_architecture(cfg.arch, "config").sqrt_d_embed_scale ? std::sqrt(static_cast<double>(cfg.d_model)) : 1.0;
}

}  // namespace linac
