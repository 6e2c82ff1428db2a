// RoPE entry points: argument checks and device/dtype dispatch.
#include "rope/rope.h"

#include "core/dispatch.h"

namespace linac {

namespace {
void rope_apply(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, bool inverse, const DocBounds& docs) {
  LINAC_CHECK(x.ndim == 4, "rope: x must be [B, T, H, D], got " + x.shape_str());
  const int64_t d = x.size(3);
  LINAC_CHECK(d % 2 == 0 && d <= kRopeMaxDim, "rope: head dim must be even and at most " +
                                                  std::to_string(kRopeMaxDim) + ", got " + std::to_string(d));
  LINAC_CHECK(x.strides[3] == 1 && (x.size(2) == 1 || x.strides[2] == d),
              "rope: the last two dimensions of x must be contiguous");
  LINAC_CHECK(freqs.base > 0 && pos0 >= 0, "rope: base must be positive and pos0 non-negative");
  LINAC_CHECK(!freqs.scaled() || (freqs.factor >= 1 && freqs.high_freq_factor > freqs.low_freq_factor &&
                                  freqs.low_freq_factor > 0 && freqs.original_context > 0),
              "rope: Llama 3 scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
              "original context");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    rope_apply_cuda(ctx, x, freqs, pos0, inverse, docs.start);
    return;
  }
  LINAC_CPU_DISPATCH(x.dtype, T,
                     rope_apply_cpu<T>(x.data<T>(), x.size(0), x.size(1), x.size(2), d, x.strides[0], x.strides[1],
                                       freqs, pos0, inverse, docs.start));
}
}  // namespace

void rope_fwd(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs) {
  rope_apply(ctx, x, freqs, pos0, false, docs);
}

void rope_bwd(const Ctx& ctx, const Tensor& dx, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs) {
  rope_apply(ctx, dx, freqs, pos0, true, docs);
}

}  // namespace linac
