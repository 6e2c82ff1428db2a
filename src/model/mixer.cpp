#include "model/mixer.h"

#include <algorithm>

#include "core/buffer.h"

namespace linac {

std::vector<int32_t> host_doc_starts(const ModelEnv& env, int64_t B, int64_t T) {
  if (!env.docs.defined()) return {};
  std::vector<int32_t> starts(static_cast<size_t>(B * T));
  const Tensor src(const_cast<int32_t*>(env.docs.start), DType::I32, env.device(), {B * T});
  copy_tensor(Tensor(starts.data(), DType::I32, Device::CPU, {B * T}), src);
  return starts;
}

std::vector<int64_t> last_doc_lengths(const ModelEnv& env, int64_t B, int64_t T) {
  const std::vector<int32_t> starts = host_doc_starts(env, B, T);
  std::vector<int64_t> len(static_cast<size_t>(B), T);
  if (!starts.empty())
    for (int64_t b = 0; b < B; ++b) len[static_cast<size_t>(b)] = T - starts[static_cast<size_t>(b * T + T - 1)];
  return len;
}

bool rows_agree(const std::vector<int64_t>& pos) {
  return std::all_of(pos.begin(), pos.end(), [&](int64_t p) { return p == pos[0]; });
}

// Token t of every sequence goes through step on contiguous [B, d] copies (step's kernels take
// contiguous rows). Mixers that support documents override prefill: with one chunked pass, or
// with prefill_by_steps and the prompt's document starts.
void Mixer::prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) {
  prefill_by_steps(ctx, state, x, out, {});
}

void Mixer::prefill_by_steps(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out,
                             const std::vector<int32_t>& doc_starts) {
  LINAC_CHECK(x.ndim == 3 && out.ndim == 3 && x.size(0) == out.size(0) && x.size(1) == out.size(1),
              "Mixer::prefill: x and out must be [B, T, d], got " + x.shape_str() + " and " + out.shape_str());
  LINAC_CHECK(x.is_contiguous() && out.is_contiguous(), "Mixer::prefill: x and out must be contiguous");
  const int64_t B = x.size(0), T = x.size(1);
  OwnedTensor x_t(x.dtype, x.device, {B, x.size(2)}), out_t(out.dtype, out.device, {B, out.size(2)});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B && !doc_starts.empty() && t > 0; ++b)
      if (doc_starts[static_cast<size_t>(b * T + t)] == t) start_document(state, b);
    for (int64_t b = 0; b < B; ++b) copy_tensor(ctx, x_t->select(0, b), x.select(0, b).select(0, t));
    step(state, x_t, out_t);
    for (int64_t b = 0; b < B; ++b) copy_tensor(ctx, out.select(0, b).select(0, t), out_t->select(0, b));
  }
}

}  // namespace linac
