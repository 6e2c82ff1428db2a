#include "train/train_data.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "comm/comm.h"
#include "train/evaluate.h"

namespace linac {

TrainData TrainData::open(const Config& cfg) {
  TrainData d;
  if (cfg.data.type == "mqar") {
    d.mqar_train = std::make_unique<MqarSet>(MqarSet::train(cfg.data.mqar, cfg.model.vocab_size));
    d.mqar_test = std::make_unique<MqarSet>(MqarSet::test(cfg.data.mqar, cfg.model.vocab_size));
    return d;
  }
  if (cfg.data.path.empty()) throw UserError(cfg.source + ": data.path: is required (a token file from `linac prepare`)");
  d.tokens = std::make_unique<TokenDataset>(cfg.data.path);
  check_dataset_vocab(*d.tokens, cfg.model.vocab_size);
  if (cfg.data.packing == "document") {
    // Before anything is written: every mixer of the architecture must support documents.
    Model(cfg.model, Ctx{}, {.allocate = false}).check_documents();
    d.documents = true;
  }
  return d;
}

int64_t TrainData::max_seq_len(int64_t T) const { return mqar_test ? std::max(T, mqar_test->max_seq_len()) : T; }

std::unique_ptr<TrainBatches> TrainData::train_batches(int64_t B, int64_t T, int rank, int world, uint64_t seed) const {
  if (mqar_train) return std::make_unique<MqarLoader>(*mqar_train, B, T, rank, world, seed);
  return std::make_unique<TrainLoader>(*tokens, Split::Train, B, T, rank, world, seed);
}

Validation::Validation(const TrainData& data, const TrainConfig& tc, int64_t B, int64_t T, int rank, int world)
    : B_(B), rank_(rank), world_(world), documents_(data.documents) {
  if (tc.eval_every <= 0) return;
  if (data.mqar_test) mqar_ = data.mqar_test.get();
  else if (data.tokens->size(Split::Val) > 1)
    eval_ = std::make_unique<EvalLoader>(*data.tokens, Split::Val, B, T, rank, world, static_cast<uint64_t>(tc.eval_tokens));
}

Validation::~Validation() = default;

std::string Validation::run(Model& model, const Comm& comm, json& rec) {
  if (mqar_) {
    MqarResult res = evaluate_mqar(model, *mqar_, B_, rank_, world_);
    res.reduce([&](double x) { return comm.sum(x); });
    const MqarScore all = res.pooled();
    rec["val_loss"] = all.mean_loss();
    rec["val_accuracy"] = all.accuracy();
    json slices = json::array();
    std::string per_slice;
    for (size_t i = 0; i < res.slices.size(); ++i) {
      const MqarSlice& sl = res.slices[i];
      slices.push_back({{"seq_len", sl.seq_len}, {"pairs", sl.pairs}, {"accuracy", res.scores[i].accuracy()}});
      per_slice += fmt::format(" {}x{}:{:.3f}", sl.seq_len, sl.pairs, res.scores[i].accuracy());
    }
    rec["val_slices"] = slices;
    return fmt::format("val loss {:.4f} | val accuracy {:.4f} ({} queries) | by L x P:{}", all.mean_loss(),
                       all.accuracy(), all.targets, per_slice);
  }
  const EvalResult local = evaluate(model, *eval_, documents_);
  const double count = comm.sum(static_cast<double>(local.targets));
  const double val = count > 0 ? comm.sum(local.loss_sum) / count : 0.0;
  const double val_aux = count > 0 ? comm.sum(local.aux_sum) / count : 0.0;
  rec["val_loss"] = val;
  rec["val_ppl"] = std::exp(val);
  if (val_aux != 0) rec["val_aux_loss"] = val_aux;
  return fmt::format("val loss {:.4f} | val ppl {:.2f}{} ({} tokens)", val, std::exp(val),
                     val_aux != 0 ? fmt::format(" | val aux {:.5f}", val_aux) : "", static_cast<int64_t>(count));
}

}  // namespace linac
