#include "data/documents.h"

#include "core/error.h"

namespace linac {

void doc_bounds_from_tokens(const int32_t* tokens, int64_t B, int64_t T, int32_t eos, int32_t* out) {
  int32_t* start = out;
  int32_t* end = out + B * T;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = tokens + b * T;
    int32_t s = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && row[t - 1] == eos) s = static_cast<int32_t>(t);
      start[b * T + t] = s;
    }
    int32_t e = static_cast<int32_t>(T);
    for (int64_t t = T - 1; t >= 0; --t) {
      end[b * T + t] = e;
      if (start[b * T + t] == t) e = static_cast<int32_t>(t);
    }
  }
}

DocBoundsBuffer::DocBoundsBuffer(Device dev, int64_t B, int64_t T, int32_t eos)
    : eos_(eos), host_(DType::I32, Device::CPU, {2 * B * T}), dev_(DType::I32, dev, {2 * B * T}) {}

Tensor DocBoundsBuffer::compute(const int32_t* tokens, int64_t B, int64_t T) {
  LINAC_CHECK(2 * B * T <= host_->numel(), "DocBoundsBuffer: batch larger than allocated");
  const std::vector<int64_t> dims = {2, B, T};
  const Tensor h(host_->ptr, DType::I32, Device::CPU, dims), d(dev_->ptr, DType::I32, dev_->device, dims);
  doc_bounds_from_tokens(tokens, B, T, eos_, h.data<int32_t>());
  copy_tensor(d, h);
  return d;
}

double mean_doc_length(const int32_t* tokens, int64_t B, int64_t T, int32_t eos) {
  int64_t starts = B;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) starts += tokens[b * T + t] == eos;
  return static_cast<double>(B * T) / static_cast<double>(starts);
}

}  // namespace linac
