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

// A mixer kind from its options parser and its constructor: the parser is the one place that
// reads the block, so validating, building and comparing two blocks all see the same options.
template <class Parse, class Make>
MixerKind kind_of(std::string name, std::string summary, Parse parse, Make make) {
  return {
      std::move(name), std::move(summary),
      [parse](const LayerSpec& s, const ModelConfig& cfg, const std::string& file) { parse(s, cfg, file); },
      [parse, make](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s) -> std::unique_ptr<Mixer> {
        return make(env, cfg, layer, s, parse(s, cfg, "config"));
      },
      [parse](const LayerSpec& a, const LayerSpec& b, const ModelConfig& cfg) {
        return parse(a, cfg, "config") == parse(b, cfg, "config");
      }};
}

auto attention_parser(bool sliding) {
  return [sliding](const LayerSpec& s, const ModelConfig& cfg, const std::string& file) {
    return AttentionMixerOptions::parse(s.options, s.path, file, sliding, cfg.n_heads);
  };
}

std::unique_ptr<AttentionMixer> make_attention(ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec&,
                                               const AttentionMixerOptions& o) {
  return std::make_unique<AttentionMixer>(env, cfg, layer, o);
}

auto latte_parser(bool macchiato) {
  return [macchiato](const LayerSpec& s, const ModelConfig&, const std::string& file) {
    return LatteMixerOptions::parse(s.options, s.path, file, macchiato);
  };
}

// The kinds whose parser needs only the block.
template <class Options>
auto block_parser() {
  return [](const LayerSpec& s, const ModelConfig&, const std::string& file) {
    return Options::parse(s.options, s.path, file);
  };
}

}  // namespace

const std::vector<MixerKind>& mixer_kinds() {
  static const std::vector<MixerKind> table = {
      kind_of("attention", "causal softmax attention with RoPE (optionally windowed)", attention_parser(false),
              make_attention),
      kind_of("sliding_window", "causal softmax attention with RoPE in a sliding window (default 64 keys)",
              attention_parser(true), make_attention),
      kind_of("gla", "gated linear attention, chunkwise (Yang et al. 2023)", block_parser<GlaMixerOptions>(),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const GlaMixerOptions& o) {
                return std::make_unique<GlaMixer>(env, cfg, layer, o, s.path);
              }),
      kind_of("taylor", "Based's linear attention with the 2nd-order Taylor feature map (Arora et al. 2024)",
              block_parser<TaylorMixerOptions>(),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const TaylorMixerOptions& o) {
                return std::make_unique<TaylorMixer>(env, cfg, layer, o, s.path);
              }),
      kind_of("lightning",
              "TransNormerLLM's token mixer: SiLU q/k, LRPE, Lightning Attention (decayed linear attention), SRMSNorm, "
              "output gate",
              block_parser<LightningMixerOptions>(),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const LightningMixerOptions& o) {
                return std::make_unique<LightningMixer>(env, cfg, layer, s.kind_index == 0, o, s.path);
              }),
      kind_of("vq_gau",
              "Transformer-VQ's gated attention unit: VQ-attention over quantized keys with a compressive cache "
              "(Lingle 2023)",
              block_parser<VqGauMixerOptions>(),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const VqGauMixerOptions& o) {
                return std::make_unique<VqGauMixer>(env, cfg, layer, o, s.path);
              }),
      kind_of("latte",
              "Latte: latent attention, per-token softmax over latents of causally normalised value summaries, VAPOR "
              "positions (Dolga et al. 2024)",
              latte_parser(false),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const LatteMixerOptions& o) {
                return std::make_unique<LatteMixer>(env, cfg, layer, o, false, s.path);
              }),
      kind_of("latte_macchiato",
              "Latte-Macchiato: Latte over a convolved stream mixed with sliding-window attention as a local state",
              latte_parser(true),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const LatteMixerOptions& o) {
                return std::make_unique<LatteMixer>(env, cfg, layer, o, true, s.path);
              }),
      kind_of("base_conv", "Based's gated short convolution (BaseConv)", block_parser<BaseConvMixerOptions>(),
              [](ModelEnv& env, const ModelConfig& cfg, int layer, const LayerSpec& s, const BaseConvMixerOptions& o) {
                return std::make_unique<BaseConvMixer>(env, cfg, layer, o, s.path);
              }),
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
