// linac generate --checkpoint CKPT (--prompt TEXT | --prompt-file F | --prompt-ids IDS)
//                [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--batch B]
//                [--stop-at-eos] [--device auto|cpu|gpu] [--json]
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/buffer.h"
#include "data/corpus.h"
#include "data/documents.h"
#include "generate/decode_graph.h"
#include "generate/inference_model.h"
#include "generate/sampler.h"

namespace linac::cli {

namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: linac generate --checkpoint CKPT (--prompt TEXT | --prompt-file F | --prompt-ids IDS)\n"
    "                      [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                      [--seed S] [--batch B] [--stop-at-eos] [--device auto|cpu|gpu] [--json]\n\n"
    "Tokenises the prompt with the checkpoint's SentencePiece model (after an end-of-document\n"
    "token, the boundary every training document follows), runs it through the model in one\n"
    "pass (prefill), then samples up to N new tokens (default 128) one at a time and streams the\n"
    "text to stdout (with --batch B > 1, the B texts once done, each as `[i] TEXT`).\n"
    "--temperature 0 is greedy (default 1); --top-k keeps the K likeliest tokens (0: all);\n"
    "--top-p the smallest set reaching probability P (default 1).\n"
    "A fixed --seed (default 0) gives the same tokens on every run; the B sequences of --batch\n"
    "share the prompt and draw independently. --stop-at-eos ends a sequence at end-of-document.\n"
    "--json prints one object instead: the prompt's token ids, each sequence's ids and text,\n"
    "the log-probability of every generated token, the logits after the prompt (sequence 0)\n"
    "and timings.\n"
    "--prompt-ids 1,2,3 gives the prompt as token ids (comma-separated, below the model's\n"
    "vocab_size), used exactly as given (no end-of-document token added) and needing no tokenizer:\n"
    "for checkpoints without one (imported models with a tokenizer.json, runs on data prepared\n"
    "with --token-ids), or to compare logits with another implementation. Without a tokenizer\n"
    "the text printed is the generated ids separated by spaces, --json's \"text\" is null, and\n"
    "--stop-at-eos is refused.\n";

// The prompt as a text file: a directory or a binary file (a checkpoint given by mistake) is
// refused as prepare refuses one.
std::string read_prompt_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError("--prompt-file " + path + " is a directory, not a text file");
  // Read once: a pipe (--prompt-file /dev/stdin, <(...)) gives its bytes only once.
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("--prompt-file: cannot read '" + path + "': " + std::strerror(errno));
  std::string text = read_text_sample(f);
  check_text_sample(text, path, "--prompt-file");
  std::ostringstream rest;
  rest << f.rdbuf();
  return text + rest.str();
}

// log softmax(l)[id], in double.
double log_prob(const std::vector<float>& l, size_t row, int64_t V, int32_t id) {
  const float* r = l.data() + row * static_cast<size_t>(V);
  const double mx = *std::max_element(r, r + V);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(r[v]) - mx);
  return static_cast<double>(r[id]) - mx - std::log(z);
}

struct GenerateOptions {
  std::string ckpt;
  std::optional<std::string> prompt_text, prompt_file, prompt_ids;
  int64_t max_new = 128, batch = 1;
  SamplingOptions sampling;
  std::string device;
  bool stop_at_eos = false, as_json = false;
};

// The options, checked before the checkpoint is read.
GenerateOptions parse_options(Args& args) {
  GenerateOptions o;
  const auto ckpt = args.get("checkpoint");
  o.prompt_text = args.get("prompt");
  o.prompt_file = args.get("prompt-file");
  o.prompt_ids = args.get("prompt-ids");
  o.max_new = args.get_int("max-new-tokens", 128);
  o.batch = args.get_int("batch", 1);
  o.sampling.temperature = args.get_double("temperature", 1.0);
  o.sampling.top_k = args.get_int("top-k", 0);
  o.sampling.top_p = args.get_double("top-p", 1.0);
  const int64_t seed = args.get_int("seed", 0);
  o.device = args.get_or("device", "auto");
  o.stop_at_eos = args.flag("stop-at-eos");
  o.as_json = args.flag("json");
  args.finish();
  if (!ckpt) throw UserError("--checkpoint CKPT is required (see --help)");
  o.ckpt = *ckpt;
  if (o.prompt_text.has_value() + o.prompt_file.has_value() + o.prompt_ids.has_value() != 1)
    throw UserError("give exactly one of --prompt, --prompt-file and --prompt-ids");
  if (o.max_new < 0) throw UserError("--max-new-tokens must be >= 0");
  if (o.batch < 1) throw UserError("--batch must be >= 1");
  if (seed < 0) throw UserError("--seed must be >= 0");
  o.sampling.seed = static_cast<uint64_t>(seed);
  o.sampling.validate();
  // Greedy decoding draws nothing: the options of the draw would be ignored, so they are refused.
  if (o.sampling.temperature == 0)
    for (const char* name : {"top-k", "top-p", "seed"})
      if (args.get(name))
        throw UserError(std::string("--") + name + " applies to sampling, and --temperature 0 decodes greedily");
  return o;
}

// The prompt's token ids: --prompt-ids as given, or the text encoded after an end-of-document
// token (the boundary every training document follows). `given_ids` and `text` were read before
// the checkpoint, so that their errors come first.
std::vector<int32_t> prompt_token_ids(const GenerateOptions& o, const std::vector<int64_t>& given_ids,
                                      const std::string& text, const Tokenizer* tok, int64_t V) {
  std::vector<int32_t> ids;
  if (o.prompt_ids) {
    for (int64_t id : given_ids) {
      if (id >= V)
        throw UserError("--prompt-ids: id " + std::to_string(id) + " is outside the model's vocab of " +
                        std::to_string(V) + " (ids 0.." + std::to_string(V - 1) + ")");
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  }
  if (!tok)
    throw UserError(o.ckpt +
                    ": the checkpoint has no embedded tokenizer to encode the prompt with (give --prompt-ids)");
  ids = tok->encode(text);
  if (tok->eos_id() >= 0) ids.insert(ids.begin(), tok->eos_id());
  if (ids.empty()) throw UserError("the prompt is empty and the tokenizer has no end-of-document token to start from");
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      throw UserError(o.ckpt + ": the tokenizer's id " + std::to_string(id) + " is outside the model's vocab of " +
                      std::to_string(V));
  return ids;
}

// Without a tokenizer the ids stand for the text; each new one appends to it, so it streams alike.
std::string text_of(const Tokenizer* tok, const std::vector<int32_t>& ids) {
  if (tok) return tok->decode(ids);
  std::string t;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) t += ' ';
    t += std::to_string(ids[i]);
  }
  return t;
}

// Sequence 0's text to stdout as it grows. SentencePiece joins pieces context-dependently, so each
// step prints what the whole text added.
class TextStream {
 public:
  explicit TextStream(const Tokenizer* tok) : tok_(tok) {}
  void update(const std::vector<int32_t>& ids) {
    const std::string text = text_of(tok_, ids);
    if (text.size() > shown_.size() && text.compare(0, shown_.size(), shown_) == 0) {
      std::fwrite(text.data() + shown_.size(), 1, text.size() - shown_.size(), stdout);
      std::fflush(stdout);
      shown_ = text;
    }
  }
  const std::string& shown() const { return shown_; }

 private:
  const Tokenizer* tok_;
  std::string shown_;
};

struct Generation {
  std::vector<float> prompt_logits;  // sequence 0's logits after the prompt
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<double>> logprobs;  // of each generated token
  double prefill_s = 0, decode_s = 0;
};

// Prefill of the prompt (the same for every sequence), then up to max_new tokens per sequence,
// one step at a time; `stream` (optional) gets sequence 0's tokens after each step.
Generation generate(InferenceModel& im, const GenerateOptions& o, const std::vector<int32_t>& prompt_ids,
                    TextStream* stream) {
  Model& model = *im.model;
  const Tokenizer* tok = im.tokenizer ? &*im.tokenizer : nullptr;
  const int64_t V = im.cfg.model.vocab_size, B = o.batch, T = static_cast<int64_t>(prompt_ids.size());
  const int32_t eos = tok ? tok->eos_id() : -1;
  const Device dev = im.ctx.is_gpu() ? Device::CUDA : Device::CPU;
  OwnedTensor host_tokens(DType::I32, Device::CPU, {B, T});
  for (int64_t b = 0; b < B; ++b) std::copy(prompt_ids.begin(), prompt_ids.end(), host_tokens->data<int32_t>() + b * T);
  OwnedTensor tokens = to(host_tokens, dev, DType::I32);
  OwnedTensor logits(im.logits_dtype(), dev, {B, V});
  OwnedTensor step_tokens(DType::I32, dev, {B}), host_step(DType::I32, Device::CPU, {B});
  std::vector<float> host_logits(static_cast<size_t>(B * V));
  auto fetch_logits = [&] {
    const std::vector<double> l = to_doubles(logits);
    std::transform(l.begin(), l.end(), host_logits.begin(), [](double x) { return static_cast<float>(x); });
  };

  // A checkpoint trained with document packing decodes as it trained: the prompt's documents apart,
  // and a new document after every EOS it samples (docs/data.md "Packing").
  const bool documents = im.cfg.data.packing == "document" && eos >= 0;
  OwnedTensor docs;
  if (documents) {
    OwnedTensor host_docs(DType::I32, Device::CPU, {2, B, T});
    doc_bounds_from_tokens(host_tokens->data<int32_t>(), B, T, eos, host_docs->data<int32_t>());
    docs = to(host_docs, dev, DType::I32);
  }
  Sampler sampler(o.sampling);
  Model::DecodeState st = model.init_decode(B, T + o.max_new);
  // Greedy decoding picks on the device, inside the step's CUDA graph (generate/decode_graph.h),
  // and brings back only the ids and their log-probabilities; sampling brings back the logits.
  const bool greedy = o.sampling.temperature == 0;
  OwnedTensor pick_logprob(DType::F64, dev, {B});
  DecodeGraph steps(model, st, step_tokens, logits, {.greedy = greedy}, greedy ? pick_logprob.t : Tensor());
  std::vector<double> picked, picked_logprob;
  auto fetch_picks = [&] {
    picked = to_doubles(step_tokens);
    picked_logprob = to_doubles(pick_logprob);
  };
  const auto t0 = std::chrono::steady_clock::now();
  model.prefill(st, tokens, logits, documents ? docs.t : Tensor());
  fetch_logits();
  if (greedy) {
    steps.pick();
    fetch_picks();
  }
  const auto t1 = std::chrono::steady_clock::now();
  Generation g;
  g.prompt_logits.assign(host_logits.begin(), host_logits.begin() + V);
  g.tokens.resize(static_cast<size_t>(B));
  g.logprobs.resize(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  for (int64_t i = 0; i < o.max_new; ++i) {
    if (i > 0) {
      if (documents)
        for (int64_t b = 0; b < B; ++b)
          if (host_step->data<int32_t>()[b] == eos) model.start_document(st, b);
      if (greedy) {
        steps.step();
        fetch_picks();
      } else {
        copy_tensor(step_tokens, host_step);
        steps.step();
        fetch_logits();
      }
    }
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      const size_t ub = static_cast<size_t>(b);
      int32_t next = eos >= 0 ? eos : 0;
      if (!done[ub]) {
        if (greedy) {
          next = static_cast<int32_t>(picked[ub]);
          g.logprobs[ub].push_back(picked_logprob[ub]);
        } else {
          next = sampler.sample(host_logits.data() + b * V, V, static_cast<uint64_t>(b), static_cast<uint64_t>(i));
          g.logprobs[ub].push_back(log_prob(host_logits, ub, V, next));
        }
        g.tokens[ub].push_back(next);
        if (o.stop_at_eos && next == eos) done[ub] = true;
      }
      host_step->data<int32_t>()[b] = next;
      all_done = all_done && done[ub];
    }
    if (stream) stream->update(g.tokens[0]);
    if (all_done) break;
  }
  const auto t2 = std::chrono::steady_clock::now();
  g.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  g.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return g;
}

void print_json(const GenerateOptions& o, const InferenceModel& im, const std::vector<int32_t>& prompt_ids,
                const Generation& g) {
  const Tokenizer* tok = im.tokenizer ? &*im.tokenizer : nullptr;
  json seqs = json::array();
  for (size_t b = 0; b < g.tokens.size(); ++b)
    seqs.push_back({{"tokens", g.tokens[b]},
                    {"text", tok ? json(tok->decode(g.tokens[b])) : json(nullptr)},
                    {"logprobs", g.logprobs[b]}});
  const json j = {{"checkpoint", o.ckpt},        {"device", im.ctx.is_gpu() ? "gpu" : "cpu"},
                  {"prompt_tokens", prompt_ids}, {"prompt_last_logits", g.prompt_logits},
                  {"sequences", seqs},           {"prefill_seconds", g.prefill_s},
                  {"decode_seconds", g.decode_s}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json", "stop-at-eos"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const GenerateOptions o = parse_options(args);
  const std::vector<int64_t> given_ids =
      o.prompt_ids ? parse_int_list(*o.prompt_ids, "--prompt-ids", 0) : std::vector<int64_t>{};
  const std::string text = o.prompt_text ? *o.prompt_text : o.prompt_file ? read_prompt_file(*o.prompt_file) : "";

  InferenceModel im = load_inference_checkpoint(o.ckpt, o.device);
  const Tokenizer* tok = im.tokenizer ? &*im.tokenizer : nullptr;
  if (!tok && o.stop_at_eos)
    throw UserError("--stop-at-eos: " + o.ckpt + " has no tokenizer, so no end-of-document id");
  const std::vector<int32_t> prompt_ids = prompt_token_ids(o, given_ids, text, tok, im.cfg.model.vocab_size);

  TextStream stream(tok);
  const bool streaming = !o.as_json && o.batch == 1;
  const Generation g = generate(im, o, prompt_ids, streaming ? &stream : nullptr);
  if (o.as_json) {
    print_json(o, im, prompt_ids, g);
    return 0;
  }
  if (o.batch == 1) {
    std::printf("%s\n", text_of(tok, g.tokens[0]).substr(stream.shown().size()).c_str());
  } else {
    for (size_t b = 0; b < g.tokens.size(); ++b) std::printf("[%zu] %s\n", b, text_of(tok, g.tokens[b]).c_str());
  }
  int64_t generated = 0;
  for (const auto& t : g.tokens) generated += static_cast<int64_t>(t.size());
  std::fflush(stdout);  // the text before the timings, when both go to one place
  std::fprintf(stderr, "prompt %lld tokens in %.3f s | %lld new tokens in %.3f s (%.1f tokens/s)\n",
               static_cast<long long>(prompt_ids.size()), g.prefill_s, static_cast<long long>(generated), g.decode_s,
               g.decode_s > 0 ? static_cast<double>(generated) / g.decode_s : 0.0);
  return 0;
}

}  // namespace linac::cli
