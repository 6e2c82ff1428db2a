// RoPE entry points: argument checks and device/dtype dispatch.
#include "rope/rope.h"

#include "core/dispatch.h"

namespace linac {

namespace {
void rope_apply(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, bool inverse,
                const DocBounds& docs, const Tensor& row_pos = Tensor()) {
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
  const int32_t* rows = nullptr;
  if (row_pos.defined()) {
    LINAC_CHECK(row_pos.dtype == DType::I32 && row_pos.ndim == 1 && row_pos.size(0) == x.size(0) &&
                    row_pos.is_contiguous() && row_pos.device == x.device,
                "rope: pos must be int32 [B] on x's device, got " + row_pos.shape_str());
    rows = row_pos.data<int32_t>();
  }
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    rope_apply_cuda(ctx, x, freqs, pos0, inverse, docs.start, rows);
    return;
  }
  for (int64_t b = 0; rows && b < x.size(0); ++b)
    LINAC_CHECK(rows[b] >= 0, "rope: negative position in row " + std::to_string(b));
  LINAC_CPU_DISPATCH(x.dtype, T,
                     rope_apply_cpu<T>(x.data<T>(), x.size(0), x.size(1), x.size(2), d, x.strides[0], x.strides[1],
                                       freqs, pos0, inverse, docs.start, rows));
}
}  // namespace

void rope_fwd(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs) {
  rope_apply(ctx, x, freqs, pos0, false, docs);
}

void rope_bwd(const Ctx& ctx, const Tensor& dx, const RopeFreqs& freqs, int64_t pos0, const DocBounds& docs) {
  rope_apply(ctx, dx, freqs, pos0, true, docs);
}

void rope_fwd(const Ctx& ctx, const Tensor& x, const RopeFreqs& freqs, const Tensor& pos) {
  LINAC_CHECK(pos.defined(), "rope: per-row positions missing");
  rope_apply(ctx, x, freqs, 0, false, {}, pos);
}

void rope_bwd(const Ctx& ctx, const Tensor& dx, const RopeFreqs& freqs, const Tensor& pos) {
  LINAC_CHECK(pos.defined(), "rope: per-row positions missing");
  rope_apply(ctx, dx, freqs, 0, true, {}, pos);
}

}  // namespace linac
