// What a run trains and validates on: the token windows of a `linac prepare` file (train and
// val splits), or MQAR's generated train and test sets (data.type "mqar").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "data/loader.h"
#include "data/mqar.h"
#include "data/token_dataset.h"
#include "model/model.h"

namespace linac {

class Comm;

struct TrainData {
  std::unique_ptr<TokenDataset> tokens;            // hdf5 data
  std::unique_ptr<MqarSet> mqar_train, mqar_test;  // mqar data
  bool documents = false;                          // data.packing "document" (hdf5 data)

  // Opens the token file (checking its vocabulary against the model's, and with document packing
  // that the architecture supports it) or generates MQAR's sets.
  static TrainData open(const Config& cfg);
  // The longest sequence the model must reserve for: MQAR's test slices may be longer than the
  // padded training length T.
  int64_t max_seq_len(int64_t T) const;
  // This rank's micro-batches of B sequences of T tokens, in the order `seed` gives.
  std::unique_ptr<TrainBatches> train_batches(int64_t B, int64_t T, int rank, int world, uint64_t seed) const;
  // The SentencePiece model that checkpoints carry (empty for MQAR and for token-id data).
  std::string tokenizer_bytes() const { return tokens ? tokens->tokenizer_bytes() : std::string(); }
  int32_t eos() const { return tokens ? static_cast<int32_t>(tokens->eos_id()) : -1; }
};

// Periodic validation during training: the mean loss and perplexity of the val split's first
// train.eval_tokens targets, or MQAR's accuracy and loss per test slice; summed over ranks.
class Validation {
 public:
  Validation(const TrainData& data, const TrainConfig& tc, int64_t B, int64_t T, int rank, int world);
  ~Validation();
  // False when there is nothing to validate (eval_every 0, or a val split too short).
  bool enabled() const { return eval_ || mqar_; }
  // Runs it on every rank; adds the val_* fields to `rec` and returns the line to log.
  std::string run(Model& model, const Comm& comm, json& rec);

 private:
  const MqarSet* mqar_ = nullptr;
  std::unique_ptr<EvalLoader> eval_;
  int64_t B_;
  int rank_, world_;
  bool documents_;
};

}  // namespace linac
