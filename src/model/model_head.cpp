// The Model's LM head (model.h): logits = logit_scale * (x W^T + b) in chunks of rows, each
// chunk's fused softmax cross-entropy (kernels/cross_entropy) and the head's backward GEMMs.
#include <algorithm>

#include "core/profiler.h"
#include "cross_entropy/cross_entropy.h"
#include "elementwise/elementwise.h"
#include "matmul/matmul.h"
#include "model/model.h"

namespace linac {

namespace {
// Logits of one head chunk: 256M elements (1 GiB in f32, plus their bf16 gradient) bound the
// head's memory. Chunks of 64M (2097 rows of a 32000 vocabulary) made the head's GEMMs and the
// loss a step's slowest per FLOP: 168.9 -> 166.7 ms per GLA 340M step, 60.0 -> 58.9 ms at 125M
// (H200).
constexpr int64_t kHeadChunkElems = int64_t(256) << 20;
}  // namespace

// Logits in bf16 under bf16 compute when ModelOptions::bf16_logits (train.logits_dtype auto, the
// default, or bf16; the softmax still sums in f32), else f32 (bf16 x bf16 -> f32 GEMM). Decoding's
// logits are f32 either way (decode_logit_dtype).
DType Model::logit_dtype() const { return bf16_logits_ ? env_.act : decode_logit_dtype(); }
DType Model::decode_logit_dtype() const { return env_.act == DType::BF16 ? DType::F32 : env_.act; }

int64_t Model::head_chunk_rows(int64_t N) const {
  return std::max<int64_t>(1, std::min<int64_t>(N, kHeadChunkElems / cfg_.vocab_size));
}

size_t Model::head_scratch_bytes(int64_t N) const {
  const DType logit_dt = logit_dtype();
  const size_t per_logit = dtype_size(logit_dt) + (logit_dt == env_.act ? 0 : dtype_size(env_.act));
  return static_cast<size_t>(head_chunk_rows(N) * cfg_.vocab_size) * per_logit;
}

void Model::head_logits(const Tensor& x, const Tensor& logits) {
  const double s = cfg_.logit_scale;
  matmul(env_.ctx, x, false, params_.weight(head_ >= 0 ? head_ : embed_), true, logits, s);
  if (head_bias_ < 0) return;
  Tensor bias = params_.master(head_bias_).view({1, cfg_.vocab_size});
  const bool act_logits = logits.dtype == env_.act;
  if (bias.dtype != logits.dtype) {  // bf16 logits: the GEMM's operands share their dtype
    const Tensor b = scratch_.get("head.bias", logits.dtype, {1, cfg_.vocab_size});
    cast(env_.ctx, b, bias);
    bias = b;
  }
  // ones^T stored [1, n], as the bias gradient's GEMM reads them (a leading dimension of n rather
  // than 1 for the bf16 GEMMs); with K = 1 each element's sum is a single product either way.
  matmul(env_.ctx, (act_logits ? ones_act_ : ones_logit_).tensor(logits.dtype, {1, logits.size(0)}), true, bias, false,
         logits, s, 1.f);
}

void Model::run_head(const Tensor& xf, const Tensor& targets, float grad_scale, const Tensor& dxf, const Tensor& losses,
                     const Tensor& hits) {
  const Ctx& ctx = env_.ctx;
  const int64_t N = xf.size(0), V = cfg_.vocab_size;
  const int w = head_ >= 0 ? head_ : embed_;
  const Tensor W = params_.weight(w);
  const DType logit_dt = logit_dtype();
  const int64_t rows = head_chunk_rows(N);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    Tensor logits = scratch_.get("head.logits", logit_dt, {rows, V}).slice0(0, n);
    Tensor dlogits = logit_dt == env_.act ? logits : scratch_.get("head.dlogits", env_.act, {rows, V}).slice0(0, n);
    Tensor x = xf.slice0(r0, r0 + n);
    head_logits(x, logits);
    {
      ProfileScope prof(ctx, "cross-entropy", Profiler::Level::Op);
      cross_entropy_fwd_bwd(ctx, logits, targets.slice0(r0, r0 + n), dlogits, losses.slice0(r0, r0 + n), grad_scale,
                            hits.ptr ? hits.slice0(r0, r0 + n) : Tensor());
    }
    if (grad_scale == 0.f) continue;
    const double s = cfg_.logit_scale;
    matmul(ctx, dlogits, false, W, false, dxf.slice0(r0, r0 + n), s);
    const ParamStore::GradWrite dw = params_.grad_write(w);
    matmul(ctx, dlogits, true, x, false, dw.grad, s, dw.beta);
    if (head_bias_ >= 0)
      matmul(ctx, ones_act_.tensor(env_.act, {1, n}), false, dlogits, false, params_.grad(head_bias_).view({1, V}), s,
             1.f);
  }
}

}  // namespace linac
