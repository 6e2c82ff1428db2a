// linac generate --checkpoint CKPT (--prompt TEXT | --prompt-file F | --prompt-ids IDS)
//                [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--batch B]
//                [--stop-at-eos] [--device auto|cpu|gpu] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/buffer.h"
#include "data/documents.h"
#include "generate/inference_model.h"
#include "generate/decode_graph.h"
#include "generate/sampler.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac generate --checkpoint CKPT (--prompt TEXT | --prompt-file F | --prompt-ids IDS)\n"
    "                      [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                      [--seed S] [--batch B] [--stop-at-eos] [--device auto|cpu|gpu] [--json]\n\n"
    "Tokenises the prompt with the checkpoint's SentencePiece model (after an end-of-document\n"
    "token, the boundary every training document follows), runs it through the model in one\n"
    "pass (prefill), then samples up to N new tokens (default 128) one at a time and streams the\n"
    "text of sequence 0 to stdout. --temperature 0 is greedy (default 1); --top-k keeps the K\n"
    "likeliest tokens (0: all); --top-p the smallest set reaching probability P (default 1).\n"
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

std::string read_prompt_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("--prompt-file: cannot read '" + path + "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// log softmax(l)[id], in double.
double log_prob(const std::vector<float>& l, size_t row, int64_t V, int32_t id) {
  const float* r = l.data() + row * static_cast<size_t>(V);
  const double mx = *std::max_element(r, r + V);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(r[v]) - mx);
  return static_cast<double>(r[id]) - mx - std::log(z);
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json", "stop-at-eos"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto ckpt = args.get("checkpoint");
  const auto prompt_arg = args.get("prompt");
  const auto prompt_file = args.get("prompt-file");
  const auto prompt_id_list = args.get("prompt-ids");
  const int64_t max_new = args.get_int("max-new-tokens", 128), B = args.get_int("batch", 1);
  SamplingOptions so;
  so.temperature = args.get_double("temperature", 1.0);
  so.top_k = args.get_int("top-k", 0);
  so.top_p = args.get_double("top-p", 1.0);
  const int64_t seed = args.get_int("seed", 0);
  const std::string device = args.get_or("device", "auto");
  const bool stop_at_eos = args.flag("stop-at-eos"), as_json = args.flag("json");
  args.finish();
  if (!ckpt) throw UserError("--checkpoint CKPT is required (see --help)");
  if (prompt_arg.has_value() + prompt_file.has_value() + prompt_id_list.has_value() != 1)
    throw UserError("give exactly one of --prompt, --prompt-file and --prompt-ids");
  if (max_new < 0) throw UserError("--max-new-tokens must be >= 0");
  if (B < 1) throw UserError("--batch must be >= 1");
  if (seed < 0) throw UserError("--seed must be >= 0");
  so.seed = static_cast<uint64_t>(seed);
  so.validate();
  const std::vector<int64_t> given_ids =
      prompt_id_list ? parse_int_list(*prompt_id_list, "--prompt-ids", 0) : std::vector<int64_t>{};
  const std::string prompt = prompt_arg ? *prompt_arg : prompt_file ? read_prompt_file(*prompt_file) : "";

  InferenceModel im = load_inference_checkpoint(*ckpt, device);
  const Tokenizer* tok = im.tokenizer ? &*im.tokenizer : nullptr;
  Model& model = *im.model;
  const int64_t V = im.cfg.model.vocab_size;
  const int32_t eos = tok ? tok->eos_id() : -1;
  if (!tok && stop_at_eos) throw UserError("--stop-at-eos: " + *ckpt + " has no tokenizer, so no end-of-document id");
  std::vector<int32_t> prompt_ids;
  if (prompt_id_list) {
    for (int64_t id : given_ids) {
      if (id >= V)
        throw UserError("--prompt-ids: id " + std::to_string(id) + " is outside the model's vocab of " +
                        std::to_string(V) + " (ids 0.." + std::to_string(V - 1) + ")");
      prompt_ids.push_back(static_cast<int32_t>(id));
    }
  } else {
    if (!tok)
      throw UserError(*ckpt +
                      ": the checkpoint has no embedded tokenizer to encode the prompt with (give --prompt-ids)");
    prompt_ids = tok->encode(prompt);
    if (eos >= 0) prompt_ids.insert(prompt_ids.begin(), eos);
    if (prompt_ids.empty())
      throw UserError("the prompt is empty and the tokenizer has no end-of-document token to start from");
    for (int32_t id : prompt_ids)
      if (id < 0 || id >= V)
        throw UserError(*ckpt + ": the tokenizer's id " + std::to_string(id) + " is outside the model's vocab of " +
                        std::to_string(V));
  }
  // Without a tokenizer the ids stand for the text; each new one appends to it, so it streams alike.
  const auto text_of = [&](const std::vector<int32_t>& ids) {
    if (tok) return tok->decode(ids);
    std::string t;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) t += ' ';
      t += std::to_string(ids[i]);
    }
    return t;
  };
  const int64_t T = static_cast<int64_t>(prompt_ids.size());

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
  Sampler sampler(so);
  Model::DecodeState st = model.init_decode(B, T + max_new);
  // Greedy decoding picks on the device, inside the step's CUDA graph (generate/decode_graph.h),
  // and brings back only the ids and their log-probabilities; sampling brings back the logits.
  const bool greedy = so.temperature == 0;
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
  const std::vector<float> prompt_logits(host_logits.begin(), host_logits.begin() + V);

  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  std::vector<std::vector<double>> logprobs(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  std::string shown;  // text of sequence 0 already streamed
  const bool stream = !as_json;
  for (int64_t i = 0; i < max_new; ++i) {
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
          logprobs[ub].push_back(picked_logprob[ub]);
        } else {
          next = sampler.sample(host_logits.data() + b * V, V, static_cast<uint64_t>(b), static_cast<uint64_t>(i));
          logprobs[ub].push_back(log_prob(host_logits, ub, V, next));
        }
        out[ub].push_back(next);
        if (stop_at_eos && next == eos) done[ub] = true;
      }
      host_step->data<int32_t>()[b] = next;
      all_done = all_done && done[ub];
    }
    if (stream && B == 1) {
      // SentencePiece joins pieces context-dependently: print what the whole text added.
      const std::string text = text_of(out[0]);
      if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
        std::fwrite(text.data() + shown.size(), 1, text.size() - shown.size(), stdout);
        std::fflush(stdout);
        shown = text;
      }
    }
    if (all_done) break;
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  int64_t generated = 0;
  for (const auto& o : out) generated += static_cast<int64_t>(o.size());

  if (as_json) {
    json seqs = json::array();
    for (size_t b = 0; b < out.size(); ++b)
      seqs.push_back(
          {{"tokens", out[b]}, {"text", tok ? json(tok->decode(out[b])) : json(nullptr)}, {"logprobs", logprobs[b]}});
    const json j = {{"checkpoint", *ckpt}, {"device", im.ctx.is_gpu() ? "gpu" : "cpu"},
                    {"prompt_tokens", prompt_ids}, {"prompt_last_logits", prompt_logits},
                    {"sequences", seqs}, {"prefill_seconds", prefill_s}, {"decode_seconds", decode_s}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (B == 1) {
    std::printf("%s\n", text_of(out[0]).substr(shown.size()).c_str());
  } else {
    for (size_t b = 0; b < out.size(); ++b) std::printf("[%zu] %s\n", b, text_of(out[b]).c_str());
  }
  std::fflush(stdout);  // the text before the timings, when both go to one place
  std::fprintf(stderr, "prompt %lld tokens in %.3f s | %lld new tokens in %.3f s (%.1f tokens/s)\n",
               static_cast<long long>(T), prefill_s, static_cast<long long>(generated), decode_s,
               decode_s > 0 ? static_cast<double>(generated) / decode_s : 0.0);
  return 0;
}

}  // namespace linac::cli
