// linac eval --checkpoint PATH [--data FILE.h5] [--split val|train] [--seq-len T] [--max-tokens N]
//            [--packing stream|document] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "config/config.h"
#include "data/loader.h"
#include "data/mqar.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac eval --checkpoint PATH [--data FILE.h5] [--split val|train] [--seq-len T]\n"
    "                  [--max-tokens N] [--batch B] [--packing stream|document] [--json]\n\n"
    "Scores every target token of the split once (non-overlapping windows of T, the last one\n"
    "partial) and prints the mean loss (nats/token), perplexity = exp(mean loss) and bits per\n"
    "byte = total loss / ln 2 / UTF-8 bytes of the scored text (documents decoded with the\n"
    "checkpoint's tokenizer, else the dataset's, each end-of-document counted as one byte; when\n"
    "neither has one, data prepared with --token-ids, it is unavailable: null in --json).\n"
    "--data defaults to the checkpoint config's data.path; --seq-len to its data.seq_len;\n"
    "--max-tokens limits the number of scored tokens (default: all); --packing to the\n"
    "checkpoint's data.packing (document: each token sees only its own document, docs/data.md\n"
    "\"Packing\"). After 5 s, progress (tokens scored, ETA) goes to stderr every 10 s. Cost: every\n"
    "window is one forward pass; full attention costs O(T^2) per window, so a very long --seq-len\n"
    "on a CPU can take hours (docs/training.md, \"Evaluation\").\n\n"
    "A checkpoint trained on MQAR (data.type \"mqar\") is scored on its config's test slices\n"
    "(data.mqar.test, generated from data.mqar.test_seed): loss and accuracy (the value is the\n"
    "argmax of the logits) over the queries, pooled and per slice (L = sequence length,\n"
    "P = key-value pairs); only --batch and --json apply.\n";

// UTF-8 bytes of the text behind split tokens [1, 1 + count): the scored targets.
uint64_t scored_bytes(const TokenDataset& ds, Split split, uint64_t count, const Tokenizer& tok) {
  uint64_t bytes = 0;
  std::vector<int32_t> buf, doc;
  const uint64_t chunk = 1 << 20;
  for (uint64_t off = 1; off < 1 + count; off += chunk) {
    const uint64_t n = std::min(chunk, 1 + count - off);
    buf.resize(n);
    ds.read(split, off, n, buf.data());
    for (int32_t id : buf) {
      if (id == ds.eos_id()) {
        bytes += tok.decode(doc).size() + 1;
        doc.clear();
      } else {
        doc.push_back(id);
      }
    }
  }
  return bytes + tok.decode(doc).size();
}

// Model from a checkpoint on the GPU when there is one (and the config does not ask for the CPU).
struct LoadedModel {
  std::unique_ptr<GpuContext> gctx;
  std::unique_ptr<Model> model;
};
LoadedModel load_model(const CheckpointReader& reader, const Config& cfg) {
  LoadedModel m;
  Ctx ctx;
  if (cfg.train.device != "cpu" && gpu_available()) {
    m.gctx = std::make_unique<GpuContext>();
    ctx = m.gctx->ctx();
  }
  m.model = std::make_unique<Model>(cfg.model, ctx, ModelOptions{.precision = cfg.train.precision});
  reader.load_params(m.model->params(), false);
  m.model->params().refresh_compute(ctx);
  return m;
}

int eval_mqar(const std::string& ckpt, const Config& cfg, const CheckpointReader& reader, int64_t batch, bool as_json) {
  const MqarSet test = MqarSet::test(cfg.data.mqar, cfg.model.vocab_size);
  const int64_t B = batch ? batch : cfg.train.micro_batch;
  LoadedModel m = load_model(reader, cfg);
  m.model->reserve(B, test.max_seq_len());
  const auto t0 = std::chrono::steady_clock::now();
  MqarResult r;
  {
    Progress progress("eval", "sequences", static_cast<int64_t>(test.size()));
    r = evaluate_mqar(*m.model, test, B, 0, 1, [&](int64_t done) { progress.set_done(done); });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MqarScore all = r.pooled();
  if (as_json) {
    json slices = json::array();
    for (size_t i = 0; i < r.slices.size(); ++i)
      slices.push_back({{"seq_len", r.slices[i].seq_len}, {"pairs", r.slices[i].pairs},
                        {"count", r.scores[i].sequences}, {"targets", r.scores[i].targets},
                        {"accuracy", r.scores[i].accuracy()}, {"loss", r.scores[i].mean_loss()}});
    json j = {{"checkpoint", ckpt}, {"data", "mqar"}, {"test_seed", cfg.data.mqar.test_seed},
              {"mqar", {{"accuracy", all.accuracy()}, {"loss", all.mean_loss()}, {"targets", all.targets},
                        {"sequences", all.sequences}, {"slices", slices}}},
              {"seconds", secs}};
    if (all.aux_sum != 0) j["aux_loss"] = all.aux_sum / static_cast<double>(all.targets);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s on MQAR (test seed %llu)\n", ckpt.c_str(), static_cast<unsigned long long>(cfg.data.mqar.test_seed));
  std::printf("  %6s %6s %10s %10s %9s %9s\n", "L", "P", "sequences", "queries", "accuracy", "loss");
  for (size_t i = 0; i < r.slices.size(); ++i)
    std::printf("  %6lld %6lld %10lld %10lld %9.4f %9.4f\n", static_cast<long long>(r.slices[i].seq_len),
                static_cast<long long>(r.slices[i].pairs), static_cast<long long>(r.scores[i].sequences),
                static_cast<long long>(r.scores[i].targets), r.scores[i].accuracy(), r.scores[i].mean_loss());
  std::printf("  %-13s %10lld %10lld %9.4f %9.4f | %.1f s\n", "pooled", static_cast<long long>(all.sequences),
              static_cast<long long>(all.targets), all.accuracy(), all.mean_loss(), secs);
  return 0;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto ckpt = args.get("checkpoint");
  const auto data = args.get("data");
  const auto split_opt = args.get("split");
  const Split split = parse_split(split_opt.value_or("val"));
  // A count, when given, is at least 1: 0 is not a silent "the default" (0 below: not given).
  auto count_opt = [&](const char* name) -> int64_t {
    const auto text = args.get(name);
    if (!text) return 0;
    const int64_t v = args.get_int(name, 0);
    if (v < 1) throw UserError(std::string("--") + name + " must be at least 1, got " + *text);
    return v;
  };
  const int64_t seq_len = count_opt("seq-len"), max_tokens = count_opt("max-tokens"), batch = count_opt("batch");
  const bool as_json = args.flag("json");
  const auto packing = args.get("packing");
  args.finish();
  if (packing && *packing != "stream" && *packing != "document")
    throw UserError("--packing must be stream or document, got '" + *packing + "'");
  if (!ckpt) throw UserError("--checkpoint PATH is required (see --help)");

  const CheckpointReader reader(*ckpt);
  const CheckpointData& meta = reader.data();
  Config cfg = Config::from_json(meta.config, *ckpt + ":/config");
  if (cfg.data.type == "mqar") {
    const char* opt = data         ? "--data"
                      : split_opt  ? "--split"
                      : seq_len    ? "--seq-len"
                      : max_tokens ? "--max-tokens"
                      : packing    ? "--packing"
                                   : nullptr;
    if (opt)
      throw UserError(std::string(opt) + " does not apply: " + *ckpt +
                      " was trained on MQAR, which is scored on its config's test slices (data.mqar.test)");
    return eval_mqar(*ckpt, cfg, reader, batch, as_json);
  }
  const std::string data_path = data ? *data : cfg.data.path;
  if (data_path.empty()) throw UserError("no dataset: pass --data FILE.h5");
  TokenDataset ds(data_path);
  // The checkpoint's vocabulary is fixed: the data must change, not model.vocab_size.
  if (ds.vocab_size() != cfg.model.vocab_size)
    throw UserError(data_path + " has vocab_size " + std::to_string(ds.vocab_size()) + " but " + *ckpt +
                    "'s model has " + std::to_string(cfg.model.vocab_size) +
                    ": score it on data of its own tokenizer (its run trained on '" + cfg.data.path +
                    "'; linac prepare --tokenizer with that file tokenises other text alike)");
  // The scored text's bytes come from the checkpoint's tokenizer, else the dataset's; a dataset
  // prepared from token ids, scored with a checkpoint that has none, has no text to count.
  if (!meta.tokenizer.empty() && ds.has_tokenizer() && ds.tokenizer_bytes() != meta.tokenizer)
    throw UserError(data_path + ": its SentencePiece model is not " + *ckpt +
                    "'s, so its ids stand for other tokens: prepare the data with the checkpoint's tokenizer "
                    "(linac prepare --tokenizer " +
                    *ckpt + ")");
  std::optional<Tokenizer> tok;
  if (!meta.tokenizer.empty())
    tok = Tokenizer::from_bytes(meta.tokenizer, *ckpt);
  else if (ds.has_tokenizer())
    tok = ds.tokenizer();

  // A window never holds more positions than there are targets to score.
  const uint64_t split_targets = ds.size(split) > 0 ? ds.size(split) - 1 : 0;
  const uint64_t targets = max_tokens > 0 ? std::min<uint64_t>(split_targets, static_cast<uint64_t>(max_tokens)) : split_targets;
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(seq_len ? seq_len : cfg.data.seq_len, static_cast<int64_t>(targets)));
  // No more rows than the split has windows: a larger --batch would only allocate empty rows.
  const int64_t windows = static_cast<int64_t>((targets + static_cast<uint64_t>(T) - 1) / static_cast<uint64_t>(T));
  const int64_t B = std::min(batch ? batch : cfg.train.micro_batch, std::max<int64_t>(1, windows));
  const bool documents = packing.value_or(cfg.data.packing) == "document";
  LoadedModel m = load_model(reader, cfg);
  if (documents) m.model->check_documents();
  m.model->reserve(B, T);
  EvalLoader loader(ds, split, B, T, 0, 1, static_cast<uint64_t>(max_tokens));

  const auto t0 = std::chrono::steady_clock::now();
  EvalResult r;
  {
    Progress progress("eval", "tokens", static_cast<int64_t>(loader.num_targets()));
    r = evaluate(*m.model, loader, documents, [&](int64_t done) { progress.set_done(done); });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.targets == 0) throw UserError(data_path + ": the " + split_name(split) + " split has no tokens to score");
  const uint64_t bytes = tok ? scored_bytes(ds, split, static_cast<uint64_t>(r.targets), *tok) : 0;
  const double loss = r.mean_loss(), ppl = std::exp(loss);
  const double bpb = r.loss_sum / std::log(2.0) / static_cast<double>(std::max<uint64_t>(1, bytes));
  const std::string no_bpb =
      "no tokenizer to give the tokens' bytes (neither the checkpoint nor " + data_path + " has one: token-id data)";
  if (as_json) {
    json j = {{"checkpoint", *ckpt}, {"data", data_path}, {"split", split_name(split)}, {"seq_len", T},
              {"packing", documents ? "document" : "stream"},
              {"tokens", r.targets}, {"bytes", tok ? json(bytes) : json(nullptr)}, {"loss", loss},
              {"perplexity", ppl}, {"bits_per_byte", tok ? json(bpb) : json(nullptr)}, {"seconds", secs}};
    if (!tok) j["bits_per_byte_unavailable"] = no_bpb;
    if (r.aux_sum != 0) j["aux_loss"] = r.mean_aux();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s on %s [%s], T=%lld, %s packing\n", ckpt->c_str(), data_path.c_str(), split_name(split),
                static_cast<long long>(T), documents ? "document" : "stream");
    char bpb_text[32] = "unavailable";
    if (tok) std::snprintf(bpb_text, sizeof bpb_text, "%.4f", bpb);
    std::printf("tokens %lld | loss %.4f | perplexity %.3f | bits/byte %s | %.1f s\n",
                static_cast<long long>(r.targets), loss, ppl, bpb_text, secs);
    if (!tok) std::printf("bits/byte unavailable: %s\n", no_bpb.c_str());
    // Auxiliary terms (e.g. Transformer-VQ's commitment loss) are not part of the perplexity.
    if (r.aux_sum != 0) std::printf("aux loss %.6f per target (not in the loss above)\n", r.mean_aux());
  }
  return 0;
}

}  // namespace linac::cli
