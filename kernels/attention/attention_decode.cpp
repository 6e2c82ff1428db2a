// Attention decode entry points: argument checks, the layout, device/dtype dispatch; the cache write.
#include "attention/attention_decode.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/dispatch.h"

namespace linac {

namespace {

// A [B,H,D] argument shaped like q: contiguous [H,D] rows, free batch stride.
void check_bhd(const Tensor& x, const Tensor& q, const char* op, const char* name) {
  LINAC_CHECK(x.ndim == 3, std::string(op) + ": " + name + " must be [B,H,D], got " + x.shape_str());
  LINAC_CHECK_SHAPE(x, q);
  LINAC_CHECK(x.strides[2] == 1 && (x.shape[1] == 1 || x.strides[1] == x.shape[2]),
              std::string(op) + ": " + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == q.device, std::string(op) + ": " + name + " is on another device");
}

// A [B,S,H,D] cache matching the [B,H,D] rows of x; returns S.
int64_t check_cache(const Tensor& cache, const Tensor& x, const char* op, const char* name) {
  LINAC_CHECK(cache.ndim == 4 && cache.is_contiguous() && cache.size(0) == x.size(0) && cache.size(2) == x.size(1) &&
                  cache.size(3) == x.size(2),
              std::string(op) + ": " + name + " must be [B,S,H,D] contiguous with [B,H,D] = " + x.shape_str() +
                  ", got " + cache.shape_str());
  LINAC_CHECK(cache.device == x.device, std::string(op) + ": " + name + " is on another device");
  LINAC_CHECK(cache.dtype == x.dtype, std::string(op) + ": " + name + " has another dtype");
  return cache.size(1);
}

// The keys or values of attention_cache_write as [B, n, H, D] tokens (a [B, H, D] argument is one
// token) with contiguous [H, D] rows; tokens of a row, and rows, must not overlap.
Tensor cache_tokens(const Tensor& x, const char* name) {
  const std::string what = std::string("attention_cache_write: ") + name;
  LINAC_CHECK(x.ndim == 3 || x.ndim == 4, what + " must be [B,H,D] or [B,n,H,D], got " + x.shape_str());
  Tensor t = x;
  if (x.ndim == 3) {
    t.ndim = 4;
    t.shape = {x.shape[0], 1, x.shape[1], x.shape[2]};
    t.strides = {x.strides[0], x.shape[1] * x.shape[2], x.strides[1], x.strides[2]};
  }
  const int64_t width = t.shape[2] * t.shape[3];
  LINAC_CHECK(t.strides[3] == 1 && (t.shape[2] == 1 || t.strides[2] == t.shape[3]),
              what + " must have contiguous [H,D] rows");
  LINAC_CHECK((t.shape[1] <= 1 || t.strides[1] >= width) && (t.shape[0] <= 1 || t.strides[0] >= width),
              what + "'s tokens overlap");
  return t;
}

}  // namespace

void attention_decode(const Ctx& ctx, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t n_valid,
                      const Tensor& o, float scale) {
  check_bhd(q, q, "attention_decode", "q");
  check_bhd(o, q, "attention_decode", "o");
  LINAC_CHECK(o.dtype == q.dtype, "attention_decode: o has another dtype");
  AttentionDecodeLayout L;
  L.B = q.size(0), L.H = q.size(1), L.D = q.size(2);
  L.Hk = k_cache.ndim == 4 ? k_cache.size(2) : 0;
  LINAC_CHECK(L.Hk > 0 && L.H % L.Hk == 0, "attention_decode: the caches' heads must divide q's " +
                                               std::to_string(L.H) + ", got " + k_cache.shape_str());
  // The caches' [B, Hk, D] rows.
  Tensor kv_row = q;
  kv_row.shape[1] = L.Hk;
  L.S = check_cache(k_cache, kv_row, "attention_decode", "k_cache");
  LINAC_CHECK(check_cache(v_cache, kv_row, "attention_decode", "v_cache") == L.S,
              "attention_decode: k_cache and v_cache hold different numbers of slots");
  LINAC_CHECK(n_valid >= 1 && n_valid <= L.S,
              "attention_decode: n_valid must be in [1, " + std::to_string(L.S) + "], got " + std::to_string(n_valid));
  LINAC_CHECK(L.D > 0, "attention_decode: empty head dim");
  // The GPU kernel subtracts the running maximum of the raw scores (see attention.cpp).
  LINAC_CHECK(scale >= 0, "attention_decode: the softmax scale must be positive");
  L.n_valid = n_valid;
  L.scale = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(L.D));
  L.q_b = q.strides[0], L.o_b = o.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    attention_decode_cuda(ctx, L, q, k_cache, v_cache, o);
#endif
    return;
  }
  LINAC_CPU_DISPATCH(q.dtype, F,
                     attention_decode_cpu<F>(L, q.data<F>(), k_cache.data<F>(), v_cache.data<F>(), o.data<F>()));
}

void attention_decode_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos,
                           const Tensor& k_cache, const Tensor& v_cache, const RopeFreqs& rope, int64_t window,
                           const Tensor& o, const Tensor& done) {
  const char* op = "attention_decode_step";
  check_bhd(q, q, op, "q");
  check_bhd(o, q, op, "o");
  LINAC_CHECK(o.dtype == q.dtype, "attention_decode_step: o has another dtype");
  check_bhd(k, k, op, "k");
  check_bhd(v, k, op, "v");
  LINAC_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0 &&
                  k.device == q.device,
              "attention_decode_step: k must be [B, Hk, D] with Hk dividing q's heads, got q " + q.shape_str() +
                  ", k " + k.shape_str());
  AttentionDecodeLayout L;
  L.B = q.size(0), L.H = q.size(1), L.D = q.size(2), L.Hk = k.size(1);
  L.S = check_cache(k_cache, k, op, "k_cache");
  LINAC_CHECK(check_cache(v_cache, v, op, "v_cache") == L.S,
              "attention_decode_step: k_cache and v_cache hold different numbers of slots");
  LINAC_CHECK(pos.dtype == DType::I32 && pos.ndim == 1 && pos.size(0) == L.B && pos.is_contiguous() &&
                  pos.device == q.device,
              "attention_decode_step: pos must be [B] int32 on q's device, got " + pos.shape_str());
  LINAC_CHECK(window == 0 || window == L.S,
              "attention_decode_step: a window's ring holds exactly `window` slots, got " + std::to_string(L.S) +
                  " for window " + std::to_string(window));
  LINAC_CHECK(L.D > 0 && L.D % 2 == 0, "attention_decode_step: the head dim must be even");
  L.window = window;
  L.scale = 1.0 / std::sqrt(static_cast<double>(L.D));
  L.q_b = q.strides[0], L.o_b = o.strides[0], L.k_b = k.strides[0], L.v_b = v.strides[0];
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    attention_decode_step_cuda(ctx, L, q, k, v, pos, rope, k_cache, v_cache, o, done);
#endif
    return;
  }
  for (int64_t b = 0; b < L.B; ++b) {
    const int32_t p = pos.data<int32_t>()[b];
    LINAC_CHECK(p >= 0 && (window > 0 || p < L.S), "attention_decode_step: row " + std::to_string(b) +
                                                       " at position " + std::to_string(p) + " outside the cache's " +
                                                       std::to_string(L.S) + " slots");
  }
  LINAC_CPU_DISPATCH(q.dtype, F,
                     attention_decode_step_cpu<F>(L, q.data<F>(), k.data<F>(), v.data<F>(), pos.data<int32_t>(), rope,
                                                  k_cache.data<F>(), v_cache.data<F>(), o.data<F>()));
}

void attention_cache_write(const Ctx& ctx, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                           const Tensor& v_cache, int64_t slot) {
  const Tensor kt = cache_tokens(k, "k"), vt = cache_tokens(v, "v");
  LINAC_CHECK(same_shape(kt, vt) && kt.device == vt.device && kt.dtype == vt.dtype,
              "attention_cache_write: k and v must have the same shape, device and dtype, got " + k.shape_str() +
                  " and " + v.shape_str());
  // The caches' [B, Hk, D] rows.
  Tensor row = kt;
  row.ndim = 3;
  row.shape = {kt.shape[0], kt.shape[2], kt.shape[3]};
  row.strides = {kt.strides[0], kt.strides[2], kt.strides[3]};
  const int64_t S = check_cache(k_cache, row, "attention_cache_write", "k_cache");
  LINAC_CHECK(check_cache(v_cache, row, "attention_cache_write", "v_cache") == S,
              "attention_cache_write: k_cache and v_cache hold different numbers of slots");
  const int64_t n = kt.size(1);
  LINAC_CHECK(slot >= 0 && slot < S,
              "attention_cache_write: slot " + std::to_string(slot) + " outside [0, " + std::to_string(S) + ")");
  LINAC_CHECK(n <= S, "attention_cache_write: " + std::to_string(n) + " tokens for " + std::to_string(S) + " slots");
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    attention_cache_write_cuda(ctx, kt, k_cache, slot);
    attention_cache_write_cuda(ctx, vt, v_cache, slot);
#endif
    return;
  }
  const int64_t B = kt.size(0), width = kt.size(2) * kt.size(3);
  const size_t e = dtype_size(kt.dtype);
  for (const auto& [x, cache] : {std::pair{&kt, &k_cache}, std::pair{&vt, &v_cache}})
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<char*>(cache->ptr) + static_cast<size_t>((b * S + (slot + i) % S) * width) * e,
                    static_cast<const char*>(x->ptr) + static_cast<size_t>(b * x->strides[0] + i * x->strides[1]) * e,
                    static_cast<size_t>(width) * e);
}

size_t attention_decode_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t n_valid) {
  const int64_t splits = (n_valid + kAttentionDecodeSplit - 1) / kAttentionDecodeSplit;
  if (splits <= 1) return 0;
  // Per (batch, head, split): the unnormalised output row, its running max and its sum (f32).
  const size_t bytes = static_cast<size_t>(B * H * splits * (D + 2)) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

}  // namespace linac
