#include "cli/bench_generate.h"

#include <cstdio>

#include "cli/format.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "generate/decode_graph.h"
#include "generate/inference_model.h"
#include "train/checkpoint.h"

namespace linac::cli {

namespace {

struct GenRow {
  int64_t batch, prompt, gen;
  double prefill_ms, decode_ms, first_ms, last_ms;  // first/last: the first and the last decode steps
  int64_t segment, last_steps;  // how many steps first_ms and last_ms time
  double mem_bytes;
  double state_bytes;  // the decode state alone (KV caches or recurrent states) at the last step
  bool graph;  // the steps replayed a CUDA graph
};

// Random token ids (never all one id) on the model's device.
OwnedTensor random_ids(const std::vector<int64_t>& dims, int64_t vocab, uint64_t stream, Device dev) {
  OwnedTensor h(DType::I32, Device::CPU, dims);
  Rng rng{1234, stream, 0};
  for (int64_t i = 0; i < h->numel(); ++i) h->data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return to(h, dev, DType::I32);
}

}  // namespace

int bench_generate(Args& args, const std::string& path) {
  std::vector<int64_t> batches = {1, 16, 128}, prompts = {512};
  if (auto s = args.get("batch")) batches = parse_int_list(*s, "--batch");
  if (auto s = args.get("prompt-len")) prompts = parse_int_list(*s, "--prompt-len");
  const int64_t gen = args.get_int("gen-len", 1024);
  const std::string device = args.get_or("device", "auto");
  const auto sets = args.get_all("set");
  const bool as_json = args.flag("json"), graph = !args.flag("no-graph");
  args.finish();
  if (gen < 1) throw UserError("--gen-len must be >= 1");
  if (is_checkpoint_path(path) && !sets.empty()) throw UserError("--set applies to a CONFIG, not to a checkpoint");

  const size_t mem0 = gpu_available() ? gpu_bytes_in_use() : 0;
  const auto init_config = [&] {
    const Config cfg = load_config(path, sets);
    return blaming_sets(cfg, [&] { return init_inference_config(cfg, device, 1); });
  };
  InferenceModel im = is_checkpoint_path(path) ? load_inference_checkpoint(path, device) : init_config();
  const bool gpu = im.ctx.is_gpu();
  Model& model = *im.model;
  const int64_t V = im.cfg.model.vocab_size;
  const Device dev = gpu ? Device::CUDA : Device::CPU;
  const std::string device_desc = gpu ? gpu_info().name : std::string("CPU");
  const int64_t segment = std::min<int64_t>(gen, std::max<int64_t>(1, gen / 10));

  std::vector<GenRow> rows;
  for (const int64_t P : prompts)
    for (const int64_t B : batches) {
      // Exactly this shape's activations, so the memory column is this row's.
      model.reserve(B, P);
      // Greedy decoding, each step's ids picked on the device and fed to the next (DecodeGraph).
      OwnedTensor prompt = random_ids({B, P}, V, 1, dev), tokens(DType::I32, dev, {B});
      OwnedTensor logits(im.logits_dtype(), dev, {B, V});
      const DecodeGraph::Options opt{.greedy = true, .graph = graph};
      {  // warm-up: kernels, cuBLASLt heuristics, the scratch pool at this shape, a graph's capture
        Model::DecodeState warm = model.init_decode(B, P + gen);
        DecodeGraph steps(model, warm, tokens, logits, opt);
        model.prefill(warm, prompt, logits);
        steps.pick();
        for (int64_t i = 0; i < std::min<int64_t>(gen, 4); ++i) steps.step();
      }
      GenRow r{B, P, gen, 0, 0, 0, 0, segment, 0, 0, 0, false};
      const size_t mem_before_state = gpu ? gpu_bytes_in_use() : 0;
      Model::DecodeState st = model.init_decode(B, P + gen);
      DecodeGraph steps(model, st, tokens, logits, opt);
      r.graph = steps.graphs();
      Timer timer(im.ctx);
      timer.start();
      model.prefill(st, prompt, logits);
      steps.pick();
      r.prefill_ms = timer.stop_ms();
      auto run_steps = [&](int64_t from, int64_t to) {
        timer.start();
        for (int64_t i = from; i < to; ++i) steps.step();
        return timer.stop_ms();
      };
      const int64_t last_from = std::max(segment, gen - segment);
      r.first_ms = run_steps(0, segment);
      r.decode_ms = r.first_ms + run_steps(segment, last_from);
      r.last_ms = run_steps(last_from, gen);
      r.decode_ms += r.last_ms;
      r.last_steps = gen - last_from;
      const size_t mem_end = gpu ? gpu_bytes_in_use() : 0;
      r.mem_bytes = static_cast<double>(mem_end - mem0);
      r.state_bytes = static_cast<double>(mem_end - mem_before_state);
      rows.push_back(r);
    }

  auto tps = [](int64_t tokens, double ms) { return ms > 0 ? static_cast<double>(tokens) / (ms / 1e3) : 0.0; };
  if (as_json) {
    json j = {{"model", path},
              {"device", device_desc},
              {"precision", precision_in_effect(model.env().act)},
              {"params", model.n_params()},
              {"rows", json::array()}};
    for (const auto& r : rows)
      j["rows"].push_back({{"batch", r.batch}, {"prompt_len", r.prompt}, {"gen_len", r.gen},
                           {"prefill_ms", r.prefill_ms}, {"prefill_tokens_per_s", tps(r.batch * r.prompt, r.prefill_ms)},
                           {"decode_ms", r.decode_ms}, {"decode_tokens_per_s", tps(r.batch * r.gen, r.decode_ms)},
                           {"decode_first_tokens_per_s", tps(r.batch * r.segment, r.first_ms)},
                           {"decode_last_tokens_per_s", tps(r.batch * r.last_steps, r.last_ms)},
                           {"segment_steps", r.segment}, {"memory_bytes", r.mem_bytes}, {"cuda_graph", r.graph},
                           {"decode_state_bytes", r.state_bytes}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s on %s (%s), %s parameters: prefill in one pass, then %lld greedy decode steps%s\n", path.c_str(),
              device_desc.c_str(), precision_in_effect(model.env().act),
              human_count(static_cast<double>(model.n_params())).c_str(), static_cast<long long>(gen),
              rows.empty()    ? ""
              : rows[0].graph ? " (CUDA graph)"
                              : " (eager)");
  std::printf("%6s %7s %14s %14s %14s %14s %12s %14s\n", "B", "prompt", "prefill tok/s", "decode tok/s", "first steps",
              "last steps", "GPU memory", "of it: state");
  for (const auto& r : rows) {
    std::printf("%6lld %7lld %14.0f %14.0f %14.0f %14.0f %12s %14s\n", static_cast<long long>(r.batch),
                static_cast<long long>(r.prompt), tps(r.batch * r.prompt, r.prefill_ms), tps(r.batch * r.gen, r.decode_ms),
                tps(r.batch * r.segment, r.first_ms), tps(r.batch * r.last_steps, r.last_ms),
                gpu ? human_bytes(r.mem_bytes).c_str() : "-", gpu ? human_bytes(r.state_bytes).c_str() : "-");
  }
  std::printf("(first/last steps: decode tokens/s over the first and the last %lld steps; GPU memory: weights,\n"
              " activations reserved for the prompt and the decode state; of it: state: KV caches or recurrent states)\n",
              static_cast<long long>(segment));
  return 0;
}

}  // namespace linac::cli
