#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "config/json_reader.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/mqar.h"
#include "model/layer_plan.h"
#include "model/registry.h"

namespace linac {

namespace {
constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// data.mqar: slices checked against the vocabulary, training slices against data.seq_len.
void read_mqar(JsonReader m, MqarConfig& c, int64_t vocab, int64_t seq_len) {
  for (const char* key : {"train", "test"}) {
    auto list = m.object_list(key);
    if (!list) continue;
    if (list->empty()) m.fail(key, "must list at least one {seq_len, pairs, count} slice");
    auto& slices = std::string(key) == "train" ? c.train : c.test;
    slices.clear();
    for (JsonReader& r : *list) {
      MqarSlice s;
      s.seq_len = r.require_int("seq_len", 4, int64_t(1) << 24);
      s.pairs = r.require_int("pairs", 1, int64_t(1) << 22);
      s.count = r.require_int("count", 1, int64_t(1) << 40);
      r.finish();
      slices.push_back(s);
    }
  }
  c.train_seed = static_cast<uint64_t>(m.get_int("train_seed", static_cast<int64_t>(c.train_seed), 0, kMaxI));
  c.test_seed = static_cast<uint64_t>(m.get_int("test_seed", static_cast<int64_t>(c.test_seed), 0, kMaxI));
  c.power_a = m.get_double("power_a", c.power_a, 1e-6, 1);
  c.random_non_queries = m.get_bool("random_non_queries", c.random_non_queries);
  m.finish();
  if (c.train_seed == c.test_seed) m.fail("test_seed", "must differ from train_seed (the test set must be new sequences)");
  for (const char* key : {"train", "test"}) {
    const auto& slices = std::string(key) == "train" ? c.train : c.test;
    for (size_t i = 0; i < slices.size(); ++i) {
      const std::string at = m.path_of(key) + "[" + std::to_string(i) + "]";
      check_mqar_slice(slices[i], vocab, m.file() + ": " + at);
      if (std::string(key) == "train" && slices[i].seq_len > seq_len)
        throw UserError(m.file() + ": " + at + ": seq_len " + std::to_string(slices[i].seq_len) +
                        " is longer than data.seq_len (" + std::to_string(seq_len) +
                        "), the padded training length");
    }
  }
}
}  // namespace

int64_t ModelConfig::ffn_dim() const {
  if (ffn_hidden > 0) return ffn_hidden;
  const int64_t h = 8 * d_model / 3;
  return (h + 255) / 256 * 256;
}

json Config::to_json() const {
  json j;
  j["model"] = {{"arch", model.arch},
                {"n_layers", model.n_layers},
                {"d_model", model.d_model},
                {"n_heads", model.n_heads},
                {"vocab_size", model.vocab_size},
                {"ffn_hidden", model.ffn_dim()},
                {"tie_embeddings", model.tie_embeddings},
                {"norm_eps", model.norm_eps},
                {"init_std", model.init_std},
                {"norm", model_norm(model)},
                {"channel_mixer", model_channel_mixer(model)},
                {"embed_scale", model_embed_scale(model)},
                {"embed_init_std", model.embed_init_std > 0 ? model.embed_init_std : model.init_std},
                {"final_norm", model.final_norm},
                {"head_bias", model.head_bias},
                {"logit_scale", model.logit_scale},
                {"mixer", model.mixer}};
  if (!model.layers.empty()) j["model"]["layers"] = model.layers;
  if (!model.layer_pattern.empty()) j["model"]["layer_pattern"] = model.layer_pattern;
  if (!model.mixers.empty()) j["model"]["mixers"] = model.mixers;
  j["data"] = {{"type", data.type}, {"path", data.path}, {"seq_len", data.seq_len}, {"packing", data.packing}};
  if (data.type == "mqar") {
    auto slices = [](const std::vector<MqarSlice>& v) {
      json a = json::array();
      for (const auto& s : v) a.push_back({{"seq_len", s.seq_len}, {"pairs", s.pairs}, {"count", s.count}});
      return a;
    };
    const MqarConfig& m = data.mqar;
    j["data"]["mqar"] = {{"train", slices(m.train)},         {"test", slices(m.test)},
                         {"train_seed", m.train_seed},       {"test_seed", m.test_seed},
                         {"power_a", m.power_a},             {"random_non_queries", m.random_non_queries}};
  }
  j["train"] = {{"steps", train.steps},
                {"global_batch_tokens", train.global_batch_tokens},
                {"micro_batch", train.micro_batch},
                {"lr", train.lr},
                {"min_lr", train.min_lr},
                {"warmup_steps", train.warmup_steps},
                {"schedule", train.schedule},
                {"weight_decay", train.weight_decay},
                {"decay_norms_and_embeddings", train.decay_norms_and_embeddings},
                {"beta1", train.beta1},
                {"beta2", train.beta2},
                {"adam_eps", train.adam_eps},
                {"grad_clip", train.grad_clip},
                {"seed", train.seed},
                {"precision", train.precision},
                {"device", train.device},
                {"eval_every", train.eval_every},
                {"eval_tokens", train.eval_tokens},
                {"log_every", train.log_every},
                {"checkpoint_every", train.checkpoint_every},
                {"keep_last", train.keep_last},
                {"checkpoint_async", train.checkpoint_async},
                {"out_dir", train.out_dir},
                {"init_from", train.init_from},
                {"max_bad_steps", train.max_bad_steps},
                {"cuda_graph", train.cuda_graph},
                {"gemm_algos", train.gemm_algos},
                {"overlap_comm", train.overlap_comm},
                {"bucket_mb", train.bucket_mb},
                {"reduce_dtype", train.reduce_dtype},
                {"logits_dtype", train.logits_dtype},
                {"residual_dtype", train.residual_dtype},
                {"recompute", train.recompute},
                {"zero", train.zero},
                {"threads", train.threads}};
  return j;
}

Config Config::from_json(const json& j, const std::string& source) {
  Config c;
  c.source = source;
  c.model.source = source;
  JsonReader root(j, "", source);

  JsonReader m = root.child("model");
  c.model.arch = m.get_string("arch", c.model.arch);
  find_architecture(c.model.arch, source);
  c.model.n_layers = m.get_int("n_layers", c.model.n_layers, 1, 1024);
  c.model.d_model = m.get_int("d_model", c.model.d_model, 8, 65536);
  c.model.n_heads = m.get_int("n_heads", c.model.n_heads, 1, 1024);
  c.model.vocab_size = m.get_int("vocab_size", c.model.vocab_size, 2, int64_t(1) << 31);
  c.model.ffn_hidden = m.get_int("ffn_hidden", 0, 0, int64_t(1) << 20);
  c.model.tie_embeddings = m.get_bool("tie_embeddings", c.model.tie_embeddings);
  c.model.norm_eps = m.get_double("norm_eps", c.model.norm_eps, 0, 1);
  c.model.init_std = m.get_double("init_std", c.model.init_std, 1e-6, 10);
  if (m.present("norm")) c.model.norm = m.get_choice("norm", "", {"rmsnorm", "srmsnorm"});
  if (m.present("channel_mixer")) c.model.channel_mixer = m.get_choice("channel_mixer", "", {"swiglu", "sglu", "none"});
  c.model.embed_scale = m.get_double("embed_scale", 0, 0, 1e6);
  c.model.embed_init_std = m.get_double("embed_init_std", 0, 0, 100);
  c.model.final_norm = m.get_bool("final_norm", c.model.final_norm);
  c.model.head_bias = m.get_bool("head_bias", c.model.head_bias);
  c.model.logit_scale = m.get_double("logit_scale", c.model.logit_scale, 1e-6, 1e6);
  c.model.mixer = m.get_object("mixer");
  for (const char* key : {"layers", "layer_pattern"}) {
    if (!m.present(key)) continue;  // absent or null: the architecture's stack
    auto& names = std::string(key) == "layers" ? c.model.layers : c.model.layer_pattern;
    names = m.get_string_list(key, {});
    if (names.empty()) m.fail(key, "must name at least one mixer");
  }
  c.model.mixers = m.get_object("mixers");
  m.finish();
  if (c.model.d_model % c.model.n_heads != 0)
    m.fail("n_heads", "must divide model.d_model (" + std::to_string(c.model.d_model) + "), got " +
                          std::to_string(c.model.n_heads));
  validate_layers(c.model, source);

  JsonReader d = root.child("data");
  c.data.type = d.get_choice("type", c.data.type, {"hdf5", "mqar"});
  c.data.path = d.get_string("path", "");
  c.data.seq_len = d.get_int("seq_len", c.data.seq_len, 1, int64_t(1) << 24);
  if (c.data.type == "mqar") {
    if (!c.data.path.empty()) d.fail("path", "does not apply to data.type 'mqar' (its sequences are generated)");
    read_mqar(d.child("mqar"), c.data.mqar, c.model.vocab_size, c.data.seq_len);
  } else if (d.present("mqar")) {
    d.fail("mqar", "applies to data.type 'mqar' only (this config's data.type is '" + c.data.type + "')");
  }
  c.data.packing = d.get_choice("packing", c.data.packing, {"stream", "document"});
  if (c.data.type == "mqar" && c.data.packing != "stream")
    d.fail("packing", "does not apply to data.type 'mqar' (each example is one sequence)");
  d.finish();

  JsonReader t = root.child("train");
  auto& tr = c.train;
  tr.steps = t.get_int("steps", tr.steps, 1, kMaxI);
  tr.global_batch_tokens = t.get_int("global_batch_tokens", tr.global_batch_tokens, 1, kMaxI);
  tr.micro_batch = t.get_int("micro_batch", tr.micro_batch, 1, 1 << 20);
  tr.lr = t.get_double("lr", tr.lr, 0, 10);
  tr.min_lr = t.get_double("min_lr", tr.min_lr, 0, 10);
  tr.warmup_steps = t.get_int("warmup_steps", tr.warmup_steps, 0, kMaxI);
  tr.schedule = t.get_choice("schedule", tr.schedule, {"cosine", "linear", "constant"});
  tr.weight_decay = t.get_double("weight_decay", tr.weight_decay, 0, 10);
  tr.decay_norms_and_embeddings = t.get_bool("decay_norms_and_embeddings", tr.decay_norms_and_embeddings);
  tr.beta1 = t.get_double("beta1", tr.beta1, 0, 0.999999);
  tr.beta2 = t.get_double("beta2", tr.beta2, 0, 0.999999999);
  tr.adam_eps = t.get_double("adam_eps", tr.adam_eps, 0, 1);
  tr.grad_clip = t.get_double("grad_clip", tr.grad_clip, 0, kInf);
  tr.seed = static_cast<uint64_t>(t.get_int("seed", static_cast<int64_t>(tr.seed), 0, kMaxI));
  tr.precision = t.get_choice("precision", tr.precision, {"bf16", "fp32", "fp64"});
  tr.device = t.get_choice("device", tr.device, {"auto", "cpu", "cuda"});
  tr.eval_every = t.get_int("eval_every", tr.eval_every, 0, kMaxI);
  tr.eval_tokens = t.get_int("eval_tokens", tr.eval_tokens, 0, kMaxI);
  tr.log_every = t.get_int("log_every", tr.log_every, 1, kMaxI);
  tr.checkpoint_every = t.get_int("checkpoint_every", tr.checkpoint_every, 0, kMaxI);
  tr.keep_last = t.get_int("keep_last", tr.keep_last, 1, 1 << 20);
  tr.checkpoint_async = t.get_bool("checkpoint_async", tr.checkpoint_async);
  tr.out_dir = t.get_string("out_dir", tr.out_dir);
  tr.init_from = t.get_string("init_from", tr.init_from);
  tr.max_bad_steps = t.get_int("max_bad_steps", tr.max_bad_steps, 1, kMaxI);
  tr.cuda_graph = t.get_bool("cuda_graph", tr.cuda_graph);
  tr.gemm_algos = t.get_string("gemm_algos", tr.gemm_algos);
  tr.overlap_comm = t.get_bool("overlap_comm", tr.overlap_comm);
  tr.bucket_mb = t.get_double("bucket_mb", tr.bucket_mb, 0.01, 1 << 16);
  tr.reduce_dtype = t.get_choice("reduce_dtype", tr.reduce_dtype, {"f32", "bf16"});
  tr.logits_dtype = t.get_choice("logits_dtype", tr.logits_dtype, {"auto", "f32", "bf16"});
  tr.residual_dtype = t.get_choice("residual_dtype", tr.residual_dtype, {"auto", "f32", "bf16"});
  tr.recompute = t.get_choice("recompute", tr.recompute, {"none", "mixer", "block"});
  tr.zero = t.get_int("zero", tr.zero, 0, 2);
  tr.threads = t.get_int("threads", tr.threads, 0, 4096);
  t.finish();
  if (!(tr.lr > 0)) t.fail("lr", "must be > 0 (with 0 no step changes a weight; linac eval scores a checkpoint)");
  if (tr.min_lr > tr.lr) t.fail("min_lr", "must not exceed train.lr");
  if (tr.logits_dtype == "bf16" && tr.precision != "bf16")
    t.fail("logits_dtype", "bf16 needs train.precision bf16, got " + tr.precision);
  if (tr.residual_dtype == "bf16" && tr.precision != "bf16")
    t.fail("residual_dtype", "bf16 needs train.precision bf16, got " + tr.precision);
  // AdamW divides by sqrt(v) + eps: with eps 0 a gradient that is exactly zero (an unseen
  // embedding row, the layout's padding) makes 0/0. Its step |m| / sqrt(v) is bounded only when
  // beta1^2 < beta2 (Cauchy-Schwarz over the two moving averages); otherwise a gradient that
  // fades lets m outlive v and the step grows as (beta1 / sqrt(beta2))^t until only eps bounds it.
  if (!(tr.adam_eps > 0))
    t.fail("adam_eps", "must be > 0 (AdamW divides by sqrt(v) + adam_eps, and v is 0 wherever a gradient is 0)");
  if (tr.beta1 > 0 && tr.beta1 * tr.beta1 >= tr.beta2) {
    char bound[64];
    std::snprintf(bound, sizeof bound, "%.6g (got %.6g)", tr.beta1 * tr.beta1, tr.beta2);
    t.fail("beta2", std::string("must exceed train.beta1^2 = ") + bound +
                        ": otherwise AdamW's step m / sqrt(v) is unbounded for a parameter whose gradient fades");
  }
  const int64_t micro_tokens = tr.micro_batch * c.data.seq_len;
  if (tr.global_batch_tokens % micro_tokens != 0)
    t.fail("global_batch_tokens", "must be a multiple of micro_batch * data.seq_len = " +
                                      std::to_string(micro_tokens) + ", got " + std::to_string(tr.global_batch_tokens));
  root.finish();
  return c;
}

namespace {

// Deeper than any config goes by far; deeper values overflowed the stack when a message quoted them.
constexpr int kMaxJsonDepth = 32;

// The JSON text of a config or a --set value, comments allowed. Nesting deeper than
// kMaxJsonDepth and a key given twice in one object (the parser would keep the last silently)
// are UserErrors naming `what`; malformed text throws json::exception.
json parse_config_json(const std::string& text, const std::string& what) {
  std::vector<std::set<std::string>> keys;  // one per object being read
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw UserError(what + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second) {
      throw UserError(what + ": key '" + parsed.get<std::string>() + "' appears twice in one object");
    }
    return true;
  };
  return json::parse(text, check, /*allow_exceptions=*/true, /*ignore_comments=*/true);
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string parse_error_text(const json::exception& e) {
  const std::string s = e.what();
  const size_t close = s.find("] ");
  return close == std::string::npos ? s : s.substr(close + 2);
}

// A path's characters, as messages quote key paths ("model.mixers.taylor.heads", "x[2].y").
bool path_char(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '[' || ch == ']';
}

// `inner` lies inside the object `outer` names.
bool inside(const std::string& inner, const std::string& outer) {
  return inner.size() > outer.size() && inner.rfind(outer, 0) == 0 &&
         (inner[outer.size()] == '.' || inner[outer.size()] == '[');
}

// The config's key paths a text names ("model.d_model"; sentence dots dropped), from `from` on.
std::vector<std::string> keys_named(const std::string& text, size_t from) {
  std::vector<std::string> keys;
  for (size_t i = from; i < text.size();) {
    if (!path_char(text[i]) || (i > 0 && path_char(text[i - 1]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && path_char(text[j])) ++j;
    std::string word = text.substr(i, j - i);
    while (!word.empty() && word.back() == '.') word.pop_back();
    for (const char* section : {"model.", "data.", "train."})
      if (word.rfind(section, 0) == 0 && word.size() > std::strlen(section)) keys.push_back(word);
    i = j;
  }
  return keys;
}

}  // namespace

// Where the values of `keys` came from: the --set assignments that gave them (the key, or an
// object holding it; setting a key inside the object `at` names counts for `at`, not for keys
// named in passing), in the keys' order, and whether any came from the file.
Config::Sources Config::sources(const std::vector<std::string>& keys, const std::string& at) const {
  Sources s;
  for (const std::string& key : keys) {
    std::string by;
    for (auto o = overrides.rbegin(); o != overrides.rend() && by.empty(); ++o) {  // the last one wins
      const std::string set = o->substr(0, o->find('='));
      if (set == key || inside(key, set) || (key == at && inside(set, key))) by = set;
    }
    if (by.empty())
      s.file = true;
    else if (std::find(s.sets.begin(), s.sets.end(), by) == s.sets.end())
      s.sets.push_back(by);
  }
  return s;
}

std::string Config::Sources::text(const std::string& source) const {
  std::string t = file ? source + (sets.empty() ? "" : " with ") : "";
  for (size_t i = 0; i < sets.size(); ++i) t += (i ? ", --set " : "--set ") + sets[i];
  return t;
}

std::string Config::given(const std::string& text) const {
  const Sources s = sources(keys_named(text, 0), "");
  return (s.sets.empty() || s.file ? "in " : "given by ") + s.text(source);
}

// A message about the config names the file it blames ("cfg.json: model.n_heads: ..."): the key
// it is about, then perhaps other keys the check read ("must divide model.d_model (760)"). A key
// a --set gave was never in the file, so the message names that --set: "--set model.n_heads: ..."
// when its keys all came from one --set, else the file "with --set model.d_model" (and any
// others), so a check across keys names every place its values came from.
std::string Config::blame(const std::string& message) const {
  if (overrides.empty() || message.rfind(source + ": ", 0) != 0) return message;
  const std::string rest = message.substr(source.size() + 2);
  std::string at;  // the key path the message is about
  if (const std::string unknown = "unknown key '"; rest.rfind(unknown, 0) == 0) {
    at = rest.substr(unknown.size(), rest.find('\'', unknown.size()) - unknown.size());
  } else {
    at = rest.substr(0, rest.find(": "));
    if (at.empty() || !std::all_of(at.begin(), at.end(), path_char)) return message;
  }
  std::vector<std::string> keys =
      keys_named(rest, rest.find(": ") == std::string::npos ? rest.size() : rest.find(": "));
  keys.insert(keys.begin(), at);
  const Sources s = sources(keys, at);
  if (s.sets.empty()) return message;
  if (!s.file && s.sets.size() == 1 && s.sets[0] == at && rest.rfind(at + ": ", 0) == 0) return "--set " + rest;
  return s.text(source) + ": " + rest;
}

Config Config::from_json_with_sets(json doc, const std::string& source, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(doc, o);
  Config c;
  c.source = source;
  c.overrides = overrides;
  try {
    c = from_json(doc, source);
  } catch (const UserError& e) {
    throw UserError(c.blame(e.what()));
  }
  c.overrides = overrides;
  return c;
}

void apply_override(json& doc, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("--set expects key.path=value, got '" + assignment + "'");
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  // A config holds UTF-8 text only: the run records it as JSON.
  if (std::string copy = assignment; sanitize_utf8(copy) > 0)
    throw UserError("--set " + path + ": the value is not UTF-8 text");
  json value;
  try {
    value = parse_config_json(text, "--set " + path);
  } catch (const json::out_of_range&) {
    throw UserError("--set " + path + ": " + text + " is a number too large for a double");
  } catch (const json::exception&) {
    value = text;  // a bare word is a string: --set train.out_dir=runs/x
  }
  json* node = &doc;
  // Every component, the empty ones at either end included ("train.lr." is refused).
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) throw UserError("--set: empty component in '" + path + "'");
    // Missing intermediate objects are created; unknown keys are still refused by validation.
    if (node->is_null()) *node = json::object();
    if (!node->is_object()) {
      std::string prefix;
      for (size_t k = 0; k < i; ++k) prefix += (k ? "." : "") + parts[k];
      throw UserError("--set " + path + ": '" + prefix + "' is " + node->type_name() + ", not an object");
    }
    if (i + 1 == parts.size())
      (*node)[parts[i]] = value;
    else
      node = &(*node)[parts[i]];
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw UserError("config '" + path + "' is a directory, not a JSON file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot open config file '" + path + "'");
  // A checkpoint or dataset given for the config: say so, not what the JSON parser read.
  char magic[8] = {};
  f.read(magic, sizeof magic);
  if (f.gcount() == sizeof magic && std::memcmp(magic, "\x89HDF\r\n\x1a\n", sizeof magic) == 0)
    throw UserError(path + ": an HDF5 file (a checkpoint or a token dataset), not a JSON config");
  f.clear();
  f.seekg(0);
  std::stringstream text;
  text << f.rdbuf();
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos)
    throw UserError(path + ": empty, not a JSON config");
  // The parser would end the text at a NUL and read no further.
  if (text.str().find('\0') != std::string::npos) throw UserError(path + ": holds a NUL byte, not a JSON config");
  json doc;
  try {
    doc = parse_config_json(text.str(), path);
  } catch (const json::exception& e) {
    throw UserError(path + ": invalid JSON: " + parse_error_text(e));
  }
  return Config::from_json_with_sets(std::move(doc), path, overrides);
}

}  // namespace linac
