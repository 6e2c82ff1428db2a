#include "export/hf_llama.h"

#include "model/layer_plan.h"
#include "model/param_store.h"
#include "model/registry.h"

namespace linac {

namespace {

double rope_base_of(const LayerSpec& spec) {
  return spec.options.contains("rope_base") ? spec.options.at("rope_base").get<double>() : 10000.0;
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
    if (rope_base_of(l) != rope_base_of(layers.front()))
      throw UserError(why + "; its layers use different rope_base values");
  }
  if (model_norm(cfg) != "rmsnorm" || model_channel_mixer(cfg) != "swiglu" || model_embed_scale(cfg) != 1.0)
    throw UserError(why + "; this one changes the norm, channel mixer or embedding scale");
}

json hf_llama_config(const Config& cfg, int32_t bos_id, int32_t eos_id) {
  const ModelConfig& m = cfg.model;
  const std::vector<LayerSpec> layers = resolve_layers(m, cfg.source);
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", m.d_model},
            {"intermediate_size", m.ffn_dim()},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", m.n_heads},
            {"head_dim", m.head_dim()},
            {"vocab_size", m.vocab_size},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", rope_base_of(layers.front())},
            {"max_position_embeddings", cfg.data.seq_len},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"tie_word_embeddings", m.tie_embeddings},
            {"initializer_range", m.init_std},
            {"torch_dtype", "float32"}};
  if (bos_id >= 0) j["bos_token_id"] = bos_id;
  if (eos_id >= 0) j["eos_token_id"] = eos_id;
  return j;
}

std::vector<SafetensorsTensor> hf_llama_tensors(const Model& model) {
  const ParamStore& ps = model.params();
  const ModelConfig& m = model.config();
  const int64_t d = m.d_model, F = m.ffn_dim();
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
    out.push_back({hf + "self_attn.k_proj.weight", wqkv.slice0(d, 2 * d)});
    out.push_back({hf + "self_attn.v_proj.weight", wqkv.slice0(2 * d, 3 * d)});
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
