#include "train/evaluate.h"

#include <algorithm>
#include <memory>

#include "data/documents.h"

namespace linac {

EvalResult evaluate(Model& model, EvalLoader& loader, bool documents, const EvalProgress& progress) {
  const int64_t B = loader.batch(), T = loader.seq_len();
  const Device dev = model.env().device();
  std::vector<int32_t> rows(loader.batch_elems());
  std::vector<int32_t> counts(static_cast<size_t>(B));
  OwnedTensor tok(DType::I32, Device::CPU, {B, T}), tgt(DType::I32, Device::CPU, {B, T});
  OwnedTensor tok_d(DType::I32, dev, {B, T}), tgt_d(DType::I32, dev, {B, T});
  std::unique_ptr<DocBoundsBuffer> docs;
  if (documents) docs = std::make_unique<DocBoundsBuffer>(dev, B, T, loader.eos());
  EvalResult r;
  loader.reset();
  while (loader.next(rows.data(), counts.data())) {
    // The model runs only on the longest window of the batch: padding past it scores nothing.
    const int64_t Tb = std::max<int64_t>(1, *std::max_element(counts.begin(), counts.end()));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < Tb; ++t) {
        tok->data<int32_t>()[b * Tb + t] = rows[static_cast<size_t>(b * (T + 1) + t)];
        tgt->data<int32_t>()[b * Tb + t] = t < counts[static_cast<size_t>(b)] ? rows[static_cast<size_t>(b * (T + 1) + t + 1)] : -1;
      }
      r.targets += counts[static_cast<size_t>(b)];
    }
    const std::vector<int64_t> dims = {B, Tb};
    const Tensor tok_b(tok->ptr, DType::I32, Device::CPU, dims), tgt_b(tgt->ptr, DType::I32, Device::CPU, dims);
    const Tensor tok_db(tok_d->ptr, DType::I32, dev, dims), tgt_db(tgt_d->ptr, DType::I32, dev, dims);
    copy_tensor(tok_db, tok_b);
    copy_tensor(tgt_db, tgt_b);
    r.loss_sum += model.forward_loss(tok_db, tgt_db, nullptr,
                                     docs ? docs->compute(tok->data<int32_t>(), B, Tb) : Tensor());
    r.aux_sum += model.aux_loss_sum();
    if (progress) progress(r.targets);
  }
  return r;
}

MqarScore& MqarScore::operator+=(const MqarScore& o) {
  loss_sum += o.loss_sum;
  hits += o.hits;
  aux_sum += o.aux_sum;
  targets += o.targets;
  sequences += o.sequences;
  return *this;
}

MqarScore MqarResult::pooled() const {
  MqarScore p;
  for (const auto& s : scores) p += s;
  return p;
}

void MqarResult::reduce(const std::function<double(double)>& sum) {
  for (auto& s : scores) {
    s.loss_sum = sum(s.loss_sum);
    s.hits = sum(s.hits);
    s.aux_sum = sum(s.aux_sum);
    s.targets = static_cast<int64_t>(sum(static_cast<double>(s.targets)));
    s.sequences = static_cast<int64_t>(sum(static_cast<double>(s.sequences)));
  }
}

MqarResult evaluate_mqar(Model& model, const MqarSet& set, int64_t B, int rank, int world,
                         const EvalProgress& progress) {
  const Device dev = model.env().device();
  const int64_t Lmax = set.max_seq_len();
  OwnedTensor tok(DType::I32, Device::CPU, {B, Lmax}), tgt(DType::I32, Device::CPU, {B, Lmax});
  OwnedTensor tok_d(DType::I32, dev, {B, Lmax}), tgt_d(DType::I32, dev, {B, Lmax});
  MqarResult r;
  r.slices = set.slices();
  int64_t sequences = 0;
  for (size_t s = 0; s < set.slices().size(); ++s) {
    const MqarSlice& sl = set.slices()[s];
    MqarScore score;
    const uint64_t begin = set.slice_begin(s), end = set.slice_begin(s + 1);
    uint64_t j = begin + static_cast<uint64_t>(rank);
    while (j < end) {
      int64_t rows = 0;
      for (; rows < B && j < end; ++rows, j += static_cast<uint64_t>(world)) {
        set.example(j, tok->data<int32_t>() + rows * sl.seq_len, tgt->data<int32_t>() + rows * sl.seq_len);
        score.targets += sl.pairs;
      }
      score.sequences += rows;
      const std::vector<int64_t> dims = {rows, sl.seq_len};
      const Tensor tok_b(tok->ptr, DType::I32, Device::CPU, dims), tgt_b(tgt->ptr, DType::I32, Device::CPU, dims);
      const Tensor tok_db(tok_d->ptr, DType::I32, dev, dims), tgt_db(tgt_d->ptr, DType::I32, dev, dims);
      copy_tensor(tok_db, tok_b);
      copy_tensor(tgt_db, tgt_b);
      double hits = 0;
      score.loss_sum += model.forward_loss(tok_db, tgt_db, &hits);
      score.hits += hits;
      score.aux_sum += model.aux_loss_sum();
      sequences += rows;
      if (progress) progress(sequences);
    }
    r.scores.push_back(score);
  }
  return r;
}

}  // namespace linac
