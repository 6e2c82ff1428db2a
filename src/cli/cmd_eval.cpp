// linac eval --checkpoint PATH [--data FILE.h5] [--split val|train] [--seq-len T] [--max-tokens N] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "config/config.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

namespace linac::cli {

namespace {

const char* kUsage =
    "usage: linac eval --checkpoint PATH [--data FILE.h5] [--split val|train] [--seq-len T]\n"
    "                  [--max-tokens N] [--batch B] [--json]\n\n"
    "Scores every target token of the split once (non-overlapping windows of T, the last one\n"
    "partial) and prints the mean loss (nats/token), perplexity = exp(mean loss) and bits per\n"
    "byte = total loss / ln 2 / UTF-8 bytes of the scored text (documents decoded with the\n"
    "checkpoint's tokenizer, each end-of-document counted as one byte). --data defaults to the\n"
    "checkpoint config's data.path; --seq-len to its data.seq_len; --max-tokens limits the\n"
    "number of scored tokens (default: all).\n";

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

}  // namespace

int cmd_eval(int argc, char** argv) {
  Args args(argc, argv, kUsage, {"json"});
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto ckpt = args.get("checkpoint");
  const auto data = args.get("data");
  const Split split = parse_split(args.get_or("split", "val"));
  const int64_t seq_len = args.get_int("seq-len", 0), max_tokens = args.get_int("max-tokens", 0);
  const int64_t batch = args.get_int("batch", 0);
  const bool as_json = args.flag("json");
  args.finish();
  if (!ckpt) throw UserError("--checkpoint PATH is required (see --help)");
  if (seq_len < 0 || max_tokens < 0 || batch < 0) throw UserError("--seq-len, --max-tokens and --batch must be positive");

  const CheckpointReader reader(*ckpt);
  const CheckpointData& meta = reader.data();
  Config cfg = Config::from_json(meta.config, *ckpt + ":/config");
  const std::string data_path = data ? *data : cfg.data.path;
  if (data_path.empty()) throw UserError("no dataset: pass --data FILE.h5");
  TokenDataset ds(data_path);
  check_dataset_vocab(ds, cfg.model.vocab_size);
  const Tokenizer tok = meta.tokenizer.empty() ? ds.tokenizer() : Tokenizer::from_bytes(meta.tokenizer, *ckpt);

  // A window never holds more positions than there are targets to score.
  const uint64_t split_targets = ds.size(split) > 0 ? ds.size(split) - 1 : 0;
  const uint64_t targets = max_tokens > 0 ? std::min<uint64_t>(split_targets, static_cast<uint64_t>(max_tokens)) : split_targets;
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(seq_len ? seq_len : cfg.data.seq_len, static_cast<int64_t>(targets)));
  const int64_t B = batch ? batch : cfg.train.micro_batch;
  const bool gpu = cfg.train.device != "cpu" && gpu_available();
  std::unique_ptr<GpuContext> gctx;
  Ctx ctx;
  if (gpu) {
    gctx = std::make_unique<GpuContext>();
    ctx = gctx->ctx();
  }
  Model model(cfg.model, ctx, cfg.train.precision, false);
  reader.load_params(model.params(), false);
  model.params().refresh_compute(ctx);
  model.reserve(B, T);
  EvalLoader loader(ds, split, B, T, 0, 1, static_cast<uint64_t>(max_tokens));

  const auto t0 = std::chrono::steady_clock::now();
  const EvalResult r = evaluate(model, loader);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.targets == 0) throw UserError(data_path + ": the " + split_name(split) + " split has no tokens to score");
  const uint64_t bytes = scored_bytes(ds, split, static_cast<uint64_t>(r.targets), tok);
  const double loss = r.mean_loss(), ppl = std::exp(loss);
  const double bpb = r.loss_sum / std::log(2.0) / static_cast<double>(std::max<uint64_t>(1, bytes));
  if (as_json) {
    json j = {{"checkpoint", *ckpt}, {"data", data_path}, {"split", split_name(split)}, {"seq_len", T},
              {"tokens", r.targets}, {"bytes", bytes}, {"loss", loss}, {"perplexity", ppl},
              {"bits_per_byte", bpb}, {"seconds", secs}};
    if (r.aux_sum != 0) j["aux_loss"] = r.mean_aux();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s on %s [%s], T=%lld\n", ckpt->c_str(), data_path.c_str(), split_name(split),
                static_cast<long long>(T));
    std::printf("tokens %lld | loss %.4f | perplexity %.3f | bits/byte %.4f | %.1f s\n",
                static_cast<long long>(r.targets), loss, ppl, bpb, secs);
    // Auxiliary terms (e.g. Transformer-VQ's commitment loss) are not part of the perplexity.
    if (r.aux_sum != 0) std::printf("aux loss %.6f per target (not in the loss above)\n", r.mean_aux());
  }
  return 0;
}

}  // namespace linac::cli
