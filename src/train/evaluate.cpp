#include "train/evaluate.h"

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
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        tok->data<int32_t>()[b * T + t] = rows[static_cast<size_t>(b * (T + 1) + t)];
        tgt->data<int32_t>()[b * T + t] = t < counts[static_cast<size_t>(b)] ? rows[static_cast<size_t>(b * (T + 1) + t + 1)] : -1;
      }
      r.targets += counts[static_cast<size_t>(b)];
    }
    copy_tensor(tok_d, tok);
    copy_tensor(tgt_d, tgt);
    r.loss_sum += model.forward_loss(tok_d, tgt_d);
  }
  return r;
}

}  // namespace linac
