#include "export/hf_llama.h"

#include "model/layer_plan.h"
#include "model/mixers/attention.h"
#include "model/param_store.h"
#include "model/registry.h"

namespace linac {

namespace {

AttentionMixerOptions attention_options(const ModelConfig& cfg, const LayerSpec& l, const std::string& file) {
  return AttentionMixerOptions::parse(l.options, l.path, file, false, cfg.n_heads);
}

// The options every layer shares (check_hf_llama_exportable holds them to that).
AttentionMixerOptions shared_attention_options(const ModelConfig& cfg, const std::string& file) {
  return attention_options(cfg, resolve_layers(cfg, file).front(), file);
}

}  // namespace

void check_hf_llama_exportable(const ModelConfig& cfg, const std::string& file) {
  const std::string why = file + ": --format hf maps Transformer++ (model.arch transformer) to LlamaForCausalLM only";
  if (cfg.arch != "transformer") throw UserError(why + "; this model is '" + cfg.arch + "' (use --format safetensors)");
  const std::vector<LayerSpec> layers = resolve_layers(cfg, file);
  for (const LayerSpec& l : layers) {
    const bool windowed = l.options.contains("window") && l.options.at("window").get<int64_t>() != 0;
    if (l.kind != "attention" || windowed)
      throw UserError(why + "; layer kind '" + l.name + "' has no Llama equivalent (use --format safetensors)");
    if (l.options.contains("rope") && !l.options.at("rope").get<bool>())
      throw UserError(why + "; layer '" + l.name + "' has no RoPE (Llama always rotates)");
    const AttentionMixerOptions o = attention_options(cfg, l, file),
                                first = attention_options(cfg, layers.front(), file);
    if (!(o.rope_freqs == first.rope_freqs))
      throw UserError(why + "; its layers use different rope_base or rope_scaling values (layer '" + l.name + "')");
    if (o.key_value_heads(cfg.n_heads) != first.key_value_heads(cfg.n_heads))
      throw UserError(why + "; its layers use different kv_heads (layer '" + l.name + "')");
  }
  if (model_norm(cfg) != "rmsnorm" || model_channel_mixer(cfg) != "swiglu" || model_embed_scale(cfg) != 1.0)
    throw UserError(why + "; this one changes the norm, channel mixer or embedding scale");
  // Llama's head is norm, then an unbiased, unscaled projection.
  if (!cfg.final_norm || cfg.head_bias || cfg.logit_scale != 1.0)
    throw UserError(why + "; this one changes the LM head (model.final_norm, model.head_bias or model.logit_scale)");
}

json hf_llama_config(const Config& cfg, int32_t bos_id, int32_t eos_id) {
  const ModelConfig& m = cfg.model;
  const AttentionMixerOptions attn = shared_attention_options(m, cfg.source);
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", m.d_model},
            {"intermediate_size", m.ffn_dim()},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", attn.key_value_heads(m.n_heads)},
            {"head_dim", m.head_dim()},
            {"vocab_size", m.vocab_size},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", attn.rope_freqs.base},
            {"max_position_embeddings", cfg.data.seq_len},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"tie_word_embeddings", m.tie_embeddings},
            {"initializer_range", m.init_std},
            {"torch_dtype", "float32"}};
  const RopeFreqs& f = attn.rope_freqs;
  if (f.scaled())
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", f.factor},
                         {"low_freq_factor", f.low_freq_factor},
                         {"high_freq_factor", f.high_freq_factor},
                         {"original_max_position_embeddings", static_cast<int64_t>(f.original_context)}};
  if (bos_id >= 0) j["bos_token_id"] = bos_id;
  if (eos_id >= 0) j["eos_token_id"] = eos_id;
  return j;
}

std::vector<SafetensorsTensor> hf_llama_tensors(const Model& model) {
  const ParamStore& ps = model.params();
  const ModelConfig& m = model.config();
  const int64_t d = m.d_model, F = m.ffn_dim();
  const int64_t K = shared_attention_options(m, "config").key_value_heads(m.n_heads) * m.head_dim();
  auto get = [&](const std::string& name) {
    const int id = ps.find(name);
    LINAC_CHECK(id >= 0, "hf export: the model has no parameter " + name);
    const Tensor t = ps.master(id);
    LINAC_CHECK(t.device == Device::CPU, "hf export: parameters must be on the CPU");
    return t;
  };
  std::vector<SafetensorsTensor> out;
  out.push_back({"model.embed_tokens.weight", get("embed.weight")});
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const std::string ours = "layers." + std::to_string(l) + ".", hf = "model.layers." + std::to_string(l) + ".";
    const Tensor wqkv = get(ours + "attn.wqkv"), w13 = get(ours + "mlp.w13");
    out.push_back({hf + "input_layernorm.weight", get(ours + "norm1.weight")});
    out.push_back({hf + "self_attn.q_proj.weight", wqkv.slice0(0, d)});
    out.push_back({hf + "self_attn.k_proj.weight", wqkv.slice0(d, d + K)});
    out.push_back({hf + "self_attn.v_proj.weight", wqkv.slice0(d + K, d + 2 * K)});
    out.push_back({hf + "self_attn.o_proj.weight", get(ours + "attn.wo")});
    out.push_back({hf + "post_attention_layernorm.weight", get(ours + "norm2.weight")});
    out.push_back({hf + "mlp.gate_proj.weight", w13.slice0(0, F)});
    out.push_back({hf + "mlp.up_proj.weight", w13.slice0(F, 2 * F)});
    out.push_back({hf + "mlp.down_proj.weight", get(ours + "mlp.w2")});
  }
  out.push_back({"model.norm.weight", get("norm_f.weight")});
  if (!m.tie_embeddings) out.push_back({"lm_head.weight", get("head.weight")});
  return out;
}

}  // namespace linac
