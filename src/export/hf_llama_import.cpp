#include "export/hf_llama_import.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "config/json_reader.h"
#include "data/tokenizer.h"
#include "export/hf_llama.h"
#include "model/mixers/attention.h"
#include "model/param_store.h"
#include "reduce/reduce.h"

namespace fs = std::filesystem;

namespace linac {

namespace {

constexpr int64_t kIntMax = int64_t(1) << 40;

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The RoPE options one block (rope_scaling or rope_parameters) gives on top of `mixer`.
json rope_block(JsonReader& r, const std::string& block, json mixer) {
  JsonReader s = r.child(block);
  if (s.has("rope_theta")) mixer["rope_base"] = s.get_double("rope_theta", 0, 1, 1e12);
  if (s.has("rope_type") && s.has("type") && s.get_string("rope_type", "") != s.get_string("type", ""))
    s.fail("type", "disagrees with rope_type ('" + s.get_string("type", "") + "' against '" +
                       s.get_string("rope_type", "") + "'); keep one of the two");
  const std::string key = s.has("rope_type") ? "rope_type" : "type";
  const std::string type = s.get_string(key, "default");
  if (type == "default") return mixer;
  if (type != "llama3") s.fail(key, "linac implements Llama 3's RoPE scaling (llama3) only, got '" + type + "'");
  json& scaling = mixer["rope_scaling"] = {{"type", "llama3"}};
  using O = AttentionMixerOptions;
  for (const char* f : {"factor", "low_freq_factor", "high_freq_factor"}) {
    if (!s.has(f)) s.fail(f, "is required for llama3 scaling");
    scaling[f] =
        s.get_double(f, 0, std::strcmp(f, "factor") == 0 ? O::kScalingFactorMin : O::kFreqFactorMin, O::kScalingMax);
  }
  if (!s.has("original_max_position_embeddings"))
    s.fail("original_max_position_embeddings", "is required for llama3 scaling");
  scaling["original_max_position_embeddings"] = s.get_int("original_max_position_embeddings", 0, 1, kIntMax);
  return mixer;
}

// The mixer's rope_base and rope_scaling. RoPE scaling is rope_scaling (transformers 4) or
// rope_parameters (transformers 5, which moved rope_theta into it too); "default" is plain RoPE.
// A folder with both is taken only when they say the same: each version of transformers reads
// one of them, so the model would differ by the version that loads it.
json rope_options_of(JsonReader& r) {
  const json base = {{"rope_base", r.get_double("rope_theta", 10000.0, 1, 1e12)}};
  const bool v4 = r.present("rope_scaling"), v5 = r.present("rope_parameters");
  const json mixer = v5 ? rope_block(r, "rope_parameters", base) : v4 ? rope_block(r, "rope_scaling", base) : base;
  if (v4 && v5 && rope_block(r, "rope_scaling", base) != mixer)
    r.fail("rope_scaling",
           "and rope_parameters describe different RoPE (transformers 4 reads the first, 5 the "
           "second); keep the one the model was trained with");
  return mixer;
}

// Compares a tensor of the folder with the model's view of it.
void check_shape(const SafetensorsSet& st, const std::string& name, const std::vector<int64_t>& want) {
  const SafetensorsSet::Located& at = st.tensors().at(name);
  if (at.entry->shape != want)
    throw UserError(at.file->path() + ": tensor '" + name + "': expected shape " + shape_text(want) +
                    " (from config.json), got " + shape_text(at.entry->shape));
}

// A weight holding inf or NaN is refused: the checkpoint would train and generate nothing but NaN.
void check_finite(const SafetensorsSet& st, const std::string& name, const Tensor& w) {
  OwnedTensor count(DType::F32, Device::CPU, {1});
  count_nonfinite(Ctx{}, w, count);
  if (const auto bad = static_cast<int64_t>(to_doubles(count)[0]); bad > 0)
    throw UserError(st.tensors().at(name).file->path() + ": tensor '" + name + "' holds " + std::to_string(bad) +
                    " non-finite value" + (bad > 1 ? "s" : "") + " (inf or NaN)");
}

std::string read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot read '" + path.string() + "'");
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

}  // namespace

Config hf_llama_import_config(const json& hf, const std::string& file) {
  JsonReader r(hf, "", file);
  const std::string model_type = r.require_string("model_type");
  if (model_type != "llama")
    r.fail("model_type", "linac imports Llama models (model_type 'llama') only, got '" + model_type + "'");
  for (const std::string& a : r.get_string_list("architectures", {"LlamaForCausalLM"}))
    if (a != "LlamaForCausalLM") r.fail("architectures", "expected [\"LlamaForCausalLM\"], got '" + a + "'");
  if (r.get_bool("attention_bias", false)) r.fail("attention_bias", "linac's attention has no biases");
  if (r.get_bool("mlp_bias", false)) r.fail("mlp_bias", "linac's SwiGLU has no biases");
  const std::string act = r.get_string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "linac's SwiGLU gates with silu, got '" + act + "'");

  // Defaults are transformers' LlamaConfig's, so a config.json that leaves a key out means here
  // what it means there.
  const int64_t d = r.get_int("hidden_size", 4096, 1, kIntMax);
  const int64_t H = r.get_int("num_attention_heads", 32, 1, kIntMax);
  if (d % H != 0)
    r.fail("num_attention_heads", "must divide hidden_size (" + std::to_string(d) + "), got " + std::to_string(H));
  if (r.has("head_dim") && r.get_int("head_dim", 0, 1, kIntMax) != d / H)
    r.fail("head_dim", "linac's heads have hidden_size / num_attention_heads = " + std::to_string(d / H) +
                           " channels, got " + hf["head_dim"].dump());
  const int64_t Hk = r.get_int("num_key_value_heads", H, 1, H);
  if (H % Hk != 0)
    r.fail("num_key_value_heads",
           "must divide num_attention_heads (" + std::to_string(H) + "), got " + std::to_string(Hk));

  json mixer = rope_options_of(r);
  if (Hk != H) mixer["kv_heads"] = Hk;
  const json model = {{"arch", "transformer"},
                      {"n_layers", r.get_int("num_hidden_layers", 32, 1, kIntMax)},
                      {"d_model", d},
                      {"n_heads", H},
                      {"vocab_size", r.get_int("vocab_size", 32000, 1, kIntMax)},
                      {"ffn_hidden", r.get_int("intermediate_size", 11008, 1, kIntMax)},
                      {"tie_embeddings", r.get_bool("tie_word_embeddings", false)},
                      {"norm_eps", r.get_double("rms_norm_eps", 1e-6, 0, 1)},
                      {"init_std", r.get_double("initializer_range", 0.02, 0, 1e6)},
                      {"mixer", mixer}};
  const int64_t seq_len = std::min(r.get_int("max_position_embeddings", 2048, 1, kIntMax), kHfImportMaxSeqLen);
  // The global batch: the default's size, rounded to whole micro-batches of this seq_len.
  const TrainConfig train;
  const int64_t micro_tokens = train.micro_batch * seq_len;
  const json j = {
      {"model", model},
      {"data", {{"seq_len", seq_len}}},
      {"train",
       {{"global_batch_tokens", micro_tokens * std::max<int64_t>(1, train.global_batch_tokens / micro_tokens)}}}};
  return Config::from_json(j, file + " (as a linac config)");
}

void hf_llama_import_tensors(const SafetensorsSet& st, Model& model, const std::string& dir) {
  const auto& found = st.tensors();
  for (const auto& [name, at] : found)
    if (name.ends_with(".bias"))
      throw UserError(at.file->path() + ": tensor '" + name + "': linac's Llama has no bias terms");
  std::vector<SafetensorsTensor> views = hf_llama_tensors(model);
  std::set<std::string> expected;
  int64_t filled = 0;
  for (const SafetensorsTensor& v : views) {
    if (!found.count(v.name))
      throw UserError(dir + ": tensor '" + v.name + "' (shape " + shape_text(v.data.dims()) + ") is missing");
    check_shape(st, v.name, v.data.dims());
    const OwnedTensor w = st.read_f32(v.name);
    check_finite(st, v.name, w);
    std::memcpy(v.data.ptr, w->ptr, v.data.nbytes());
    expected.insert(v.name);
    filled += v.data.numel();
  }
  const ParamStore& ps = model.params();
  LINAC_CHECK(filled == ps.total_numel() && ps.buffer_count() == 0,
              "hf import: the Llama tensors do not cover the model");

  // Tied: transformers ignores a stored lm_head, so it may be there when it is the embedding.
  const std::string head = "lm_head.weight", embed = "model.embed_tokens.weight";
  if (model.config().tie_embeddings && found.count(head)) {
    const Tensor e = ps.master(ps.find("embed.weight"));
    check_shape(st, head, e.dims());
    const OwnedTensor h = st.read_f32(head);
    if (std::memcmp(h->ptr, e.ptr, e.nbytes()) != 0)
      throw UserError(found.at(head).file->path() + ": tensor '" + head + "' differs from " + embed +
                      ", but config.json's tie_word_embeddings is true");
    expected.insert(head);
  }
  for (const auto& [name, at] : found)
    if (!expected.count(name) && !name.ends_with("rotary_emb.inv_freq"))
      throw UserError(at.file->path() + ": unexpected tensor '" + name +
                      "' (LlamaForCausalLM with this config.json has no such weight)");
}

HfLlamaImport import_hf_llama(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UserError("'" + dir + "' is not a directory (a Hugging Face model folder)");
  const fs::path config_path = fs::path(dir) / "config.json";
  if (!fs::exists(config_path, ec)) throw UserError(dir + ": no config.json (a Hugging Face model folder has one)");
  json hf;
  try {
    hf = json::parse(read_bytes(config_path));
  } catch (const json::parse_error& e) {
    throw UserError(config_path.string() + ": invalid JSON: " + e.what());
  }
  HfLlamaImport out;
  out.cfg = hf_llama_import_config(hf, config_path.string());
  const SafetensorsSet tensors(dir);
  out.model = std::make_unique<Model>(out.cfg.model, Ctx{}, ModelOptions{.precision = "fp32"});
  hf_llama_import_tensors(tensors, *out.model, dir);

  const fs::path sp = fs::path(dir) / "tokenizer.model";
  if (fs::exists(sp, ec)) {
    const Tokenizer tok = Tokenizer::from_file(sp.string());
    if (tok.vocab_size() > out.cfg.model.vocab_size)
      throw UserError(sp.string() + ": " + std::to_string(tok.vocab_size()) +
                      " pieces, more than config.json's vocab_size " + std::to_string(out.cfg.model.vocab_size));
    out.tokenizer = tok.model_bytes();
  } else {
    out.hf_tokenizer_only = fs::exists(fs::path(dir) / "tokenizer.json", ec);
  }
  return out;
}

}  // namespace linac
