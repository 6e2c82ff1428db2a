#include "train/evaluate.h"

#include <algorithm>

namespace linac {

EvalResult evaluate(Model& model, EvalLoader& loader) {
  const int64_t B = loader.batch(), T = loader.seq_len();
  const Device dev = model.env().device();
  std::vector<int32_t> rows(loader.batch_elems());
  std::vector<int32_t> counts(static_cast<size_t>(B));
  OwnedTensor tok(DType::I32, Device::CPU, {B, T}), tgt(DType::I32, Device::CPU, {B, T});
  OwnedTensor tok_d(DType::I32, dev, {B, T}), tgt_d(DType::I32, dev, {B, T});
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
    r.loss_sum += model.forward_loss(tok_db, tgt_db);
    r.aux_sum += model.aux_loss_sum();
  }
  return r;
}

}  // namespace linac
