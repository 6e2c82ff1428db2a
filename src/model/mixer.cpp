#include "model/mixer.h"

#include <algorithm>

#include "core/buffer.h"

namespace linac {

std::vector<int64_t> last_doc_lengths(const ModelEnv& env, int64_t B, int64_t T) {
  std::vector<int64_t> len(static_cast<size_t>(B), T);
  if (!env.docs.defined()) return len;
  std::vector<int32_t> starts(static_cast<size_t>(B * T));
  const Tensor src(const_cast<int32_t*>(env.docs.start), DType::I32, env.device(), {B * T});
  copy_tensor(Tensor(starts.data(), DType::I32, Device::CPU, {B * T}), src);
  for (int64_t b = 0; b < B; ++b) len[static_cast<size_t>(b)] = T - starts[static_cast<size_t>(b * T + T - 1)];
  return len;
}

bool rows_agree(const std::vector<int64_t>& pos) {
  return std::all_of(pos.begin(), pos.end(), [&](int64_t p) { return p == pos[0]; });
}

}  // namespace linac
