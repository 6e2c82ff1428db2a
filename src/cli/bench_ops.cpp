#include "cli/bench_ops.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "data/documents.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "gla/gla.h"
#include "latte/latte.h"
#include "lightning/lightning.h"
#include "short_conv/short_conv.h"
#include "taylor_attn/taylor_attn.h"
#include "vq_attn/vq_attn.h"

namespace linac::cli {

namespace {

struct OpTiming {
  int64_t T, B;
  double fwd_ms, bwd_ms, flops;
  double bytes;  // > 0 for memory-bound ops: activation bytes moved, reported as GB/s instead of TFLOP/s
};

// Random values in [-1, 1) as dtype dt on the device.
OwnedTensor random_device(const std::vector<int64_t>& dims, DType dt, uint64_t seed) {
  OwnedTensor h(DType::F32, Device::CPU, dims);
  for (int64_t i = 0; i < h->numel(); ++i)
    h->data<float>()[i] = static_cast<float>(2.0 * philox_uniform(seed, 0x0b, static_cast<uint64_t>(i)) - 1.0);
  return to(h, Device::CUDA, dt);
}

// Median of `iters` timed runs of f after 3 warm-ups.
double time_ms(const Ctx& ctx, int64_t iters, const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  Timer timer(ctx);
  for (int64_t i = 0; i < iters; ++i) {
    timer.start();
    f();
    t.push_back(timer.stop_ms());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Document bounds [2, B, T] (starts, ends; core/doc_bounds.h) on the host for `--doc-len`: each token
// ends its document with probability 1 / doc_len, so lengths are geometric with that mean (as
// `bench CONFIG --doc-len` packs them).
OwnedTensor random_doc_bounds(int64_t B, int64_t T, double doc_len) {
  constexpr int32_t kEos = 1;
  std::vector<int32_t> ends(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ends.size(); ++i) ends[i] = philox_uniform(6, 0x0d, i) < 1.0 / doc_len ? kEos : 0;
  OwnedTensor host(DType::I32, Device::CPU, {2, B, T});
  doc_bounds_from_tokens(ends.data(), B, T, kEos, host->data<int32_t>());
  return host;
}

// doc_len > 0: document packing (AttentionOpts::docs, random_doc_bounds); FLOPs count the keys each
// query sees in its document. Hk < H: grouped-query attention (FLOPs count the H
// query heads).
OpTiming bench_attention(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t Hk, int64_t D, DType dt,
                         int64_t window, double doc_len, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor q = random_device({B, T, H, D}, dt, 1), k = random_device({B, T, Hk, D}, dt, 2);
  OwnedTensor v = random_device({B, T, Hk, D}, dt, 3), dout = random_device({B, T, H, D}, dt, 4);
  OwnedTensor o(dt, Device::CUDA, {B, T, H, D}), lse(DType::F32, Device::CUDA, {B, H, T});
  OwnedTensor dq(dt, Device::CUDA, {B, T, H, D}), dk(dt, Device::CUDA, {B, T, Hk, D}), dv(dt, Device::CUDA, {B, T, Hk, D});
  AttentionOpts opts;
  opts.window = window;
  double keys = window > 0 && window < T ? static_cast<double>(window) : (static_cast<double>(T) + 1) / 2;
  OwnedTensor bounds;
  if (doc_len > 0) {
    OwnedTensor host = random_doc_bounds(B, T, doc_len);
    double seen = 0;
    for (int64_t i = 0; i < B * T; ++i) {
      const int64_t n = i % T - host->data<int32_t>()[i] + 1;
      seen += static_cast<double>(window > 0 ? std::min(n, window) : n);
    }
    keys = seen / static_cast<double>(B * T);
    bounds = to(host, Device::CUDA, DType::I32);
    opts.docs = {bounds->data<int32_t>(), bounds->data<int32_t>() + B * T};
  }
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { attention_fwd(ctx, q, k, v, o, lse, opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] { attention_bwd(ctx, q, k, v, o, lse, dout, dq, dk, dv, opts); });
  r.flops = 4.0 * static_cast<double>(B * T * H * D) * keys * 3.5;  // fwd 2 GEMMs; bwd 5 (with the recompute)
  return r;
}

// GLA at the paper's speed-test shape (H = 4, Dk = 128, Dv = 256 at d = 1024): gates f32 in
// [-0.2, 0) (logsigmoid(z)/16 for typical z), chunk 64. FLOPs per token and head counted as the
// chunkwise algorithm needs them: forward 4 Dk Dv (state update + inter-chunk output) + C (Dk + Dv)
// (causal halves of Q K^T and P V), backward twice that.
OpTiming bench_gla(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t Dk, int64_t Dv, DType dt,
                   int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor q = random_device({B, T, H, Dk}, dt, 1), k = random_device({B, T, H, Dk}, dt, 2);
  OwnedTensor v = random_device({B, T, H, Dv}, dt, 3), dout = random_device({B, T, H, Dv}, dt, 4);
  OwnedTensor gh(DType::F32, Device::CPU, {B, T, H, Dk});
  for (int64_t i = 0; i < gh->numel(); ++i)
    gh->data<float>()[i] = static_cast<float>(-0.2 * philox_uniform(5, 0x0c, static_cast<uint64_t>(i)));
  OwnedTensor g = to(gh, Device::CUDA, DType::F32);
  OwnedTensor o(dt, Device::CUDA, {B, T, H, Dv}), dg(DType::F32, Device::CUDA, {B, T, H, Dk});
  OwnedTensor dq(dt, Device::CUDA, {B, T, H, Dk}), dk(dt, Device::CUDA, {B, T, H, Dk}), dv(dt, Device::CUDA, {B, T, H, Dv});
  GlaOpts opts;
  opts.scale = 1.0 / std::sqrt(static_cast<double>(Dk));
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { gla_fwd(ctx, q, k, v, g, o, Tensor(), Tensor(), opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] {
    gla_bwd(ctx, q, k, v, g, dout, Tensor(), Tensor(), dq, dk, dv, dg, Tensor(), opts);
  });
  const double per_token_head = 4.0 * static_cast<double>(Dk * Dv) + static_cast<double>(opts.chunk * (Dk + Dv));
  r.flops = 3.0 * per_token_head * static_cast<double>(B * T * H);
  return r;
}

// Lightning attention (TNL's token mixer core) with the TNL decay schedule s_h = 2^(-8(h+1)/H) and
// Dk = Dv = head dim. FLOPs per token and head as the block algorithm needs them: forward
// 4 D^2 (state update + inter-block output) + C D (causal halves of Q K^T and P V, C = 64),
// backward twice that.
OpTiming bench_lightning(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t D, DType dt, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor q = random_device({B, T, H, D}, dt, 1), k = random_device({B, T, H, D}, dt, 2);
  OwnedTensor v = random_device({B, T, H, D}, dt, 3), dout = random_device({B, T, H, D}, dt, 4);
  OwnedTensor sh(DType::F32, Device::CPU, {H});
  for (int64_t h = 0; h < H; ++h)
    sh->data<float>()[h] = static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(H)));
  OwnedTensor decay = to(sh, Device::CUDA, DType::F32);
  OwnedTensor o(dt, Device::CUDA, {B, T, H, D});
  OwnedTensor dq(dt, Device::CUDA, {B, T, H, D}), dk(dt, Device::CUDA, {B, T, H, D}), dv(dt, Device::CUDA, {B, T, H, D});
  const LightningOpts opts;
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { lightning_fwd(ctx, q, k, v, decay, o, Tensor(), Tensor(), opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] {
    lightning_bwd(ctx, q, k, v, decay, dout, Tensor(), Tensor(), dq, dk, dv, Tensor(), opts);
  });
  const double per_token_head = 4.0 * static_cast<double>(D * D) + static_cast<double>(opts.block * 2 * D);
  r.flops = 3.0 * per_token_head * static_cast<double>(B * T * H);
  return r;
}

// Latte (the latent-state core of the Latte / Latte-Macchiato mixer) with L latents per head and
// Dv = head dim; Macchiato adds the local column of a and the local state. FLOPs per token and head
// as the chunked algorithm needs them: forward 4 L Dv (chunk terms and the inter-chunk readout) +
// C (L + Dv) (causal halves of A = pi exp(b - lse) and A V, C = 64), backward twice that.
OpTiming bench_latte(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t L, int64_t Dv, bool macchiato,
                     DType dt, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T), La = macchiato ? L + 1 : L;
  OwnedTensor a = random_device({B, T, H, La}, dt, 1), b = random_device({B, T, H, L}, dt, 2);
  OwnedTensor v = random_device({B, T, H, Dv}, dt, 3), dy = random_device({B, T, H, Dv}, dt, 4);
  OwnedTensor local = macchiato ? random_device({B, T, H, Dv}, dt, 5) : OwnedTensor();
  OwnedTensor dlocal = macchiato ? OwnedTensor(dt, Device::CUDA, {B, T, H, Dv}) : OwnedTensor();
  OwnedTensor y(dt, Device::CUDA, {B, T, H, Dv}), lse(DType::F32, Device::CUDA, {B, T, H, L});
  OwnedTensor da(dt, Device::CUDA, {B, T, H, La}), db(dt, Device::CUDA, {B, T, H, L}), dv(dt, Device::CUDA, {B, T, H, Dv});
  const LatteOpts opts;
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { latte_fwd(ctx, a, b, v, local, y, lse, Tensor(), opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] { latte_bwd(ctx, a, b, v, local, lse, dy, da, db, dv, dlocal, opts); });
  const double per_token_head = 4.0 * static_cast<double>(L * Dv) + 64.0 * static_cast<double>(L + Dv);
  r.flops = 3.0 * per_token_head * static_cast<double>(B * T * H);
  return r;
}

// The short gated convolution at Based's shape (C = 2 d_model channels, width 3), with a and g
// column ranges of one fused [B, T, 2C] buffer as the BaseConv mixer passes them. Memory bound: the
// forward reads a, g and writes z, the backward reads a, g, dz and writes da, dg.
OpTiming bench_short_conv(const Ctx& ctx, int64_t T, int64_t tokens, int64_t C, int64_t W, DType dt, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor ag = random_device({B, T, 2 * C}, dt, 1), dag(dt, Device::CUDA, {B, T, 2 * C});
  OwnedTensor dz = random_device({B, T, C}, dt, 2), z(dt, Device::CUDA, {B, T, C});
  OwnedTensor h = random_device({C, W}, DType::F32, 3), ba = random_device({C}, DType::F32, 4);
  OwnedTensor bg = random_device({C}, DType::F32, 5), dh(DType::F32, Device::CUDA, {C, W});
  OwnedTensor dba(DType::F32, Device::CUDA, {C}), dbg(DType::F32, Device::CUDA, {C});
  auto half = [&](const Tensor& buf, int64_t i) { return buf.narrow(2, i * C, C); };
  const ShortConvOpts opts;
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { short_conv_fwd(ctx, half(ag, 0), half(ag, 1), h, ba, bg, z, opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] {
    short_conv_bwd(ctx, half(ag, 0), half(ag, 1), h, ba, bg, dz, half(dag, 0), half(dag, 1), dh, dba, dbg, opts);
  });
  r.bytes = 8.0 * static_cast<double>(B * T * C) * static_cast<double>(dtype_size(dt));
  return r;
}

// Taylor linear attention (the Based layer) at the paper's shape (F = 16, Dv = head dim), chunk 64.
// FLOPs per token and head as the chunked algorithm needs them: forward 4 R (Dv + 1) (state update
// and inter-chunk readout over R = F^2 + F + 1 features) + C (F + Dv + 1) (causal halves of Q K^T
// and kappa(U) V~), backward twice that.
OpTiming bench_taylor(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t F, int64_t Dv, DType dt,
                      double doc_len, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor q = random_device({B, T, H, F}, dt, 1), k = random_device({B, T, H, F}, dt, 2);
  OwnedTensor v = random_device({B, T, H, Dv}, dt, 3), dout = random_device({B, T, H, Dv}, dt, 4);
  OwnedTensor o(dt, Device::CUDA, {B, T, H, Dv}), den(DType::F32, Device::CUDA, {B, H, T});
  OwnedTensor dq(dt, Device::CUDA, {B, T, H, F}), dk(dt, Device::CUDA, {B, T, H, F}), dv(dt, Device::CUDA, {B, T, H, Dv});
  TaylorAttnOpts opts;
  OwnedTensor bounds;
  if (doc_len > 0) {
    bounds = to(random_doc_bounds(B, T, doc_len), Device::CUDA, DType::I32);
    opts.docs = {bounds->data<int32_t>(), bounds->data<int32_t>() + B * T};
  }
  // The forward keeps its segment carries for the backward, as the Based layer has it.
  const size_t carries = taylor_attn_saved_carries_bytes(B, T, H, F, Dv, dt);
  OwnedTensor saved(DType::F32, Device::CUDA, {static_cast<int64_t>(carries / sizeof(float))});
  if (carries > 0) opts.saved_carries = saved;
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { taylor_attn_fwd(ctx, q, k, v, o, den, Tensor(), opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] { taylor_attn_bwd(ctx, q, k, v, o, den, dout, dq, dk, dv, opts); });
  const double R = static_cast<double>(taylor_attn_state_rows(F));
  const double per_token_head = 4.0 * R * static_cast<double>(Dv + 1) + static_cast<double>(opts.chunk * (F + Dv + 1));
  r.flops = 3.0 * per_token_head * static_cast<double>(B * T * H);
  return r;
}

// VQ-attention (Transformer-VQ) at the paper's SHGA shape by default (H = 1, Dk 128, Dv 1536,
// S = 512 codes, block Lb = 512), random codes, q/k/v as separate tensors. FLOPs per token and head
// as the block algorithm needs them: forward 2 (1.5 Lb + S) (Dk + Dv) (scores and weighted values
// over the window, on average half the present block and all of the previous one, and the S cache
// entries), backward twice that. The kernels get the scratch they ask for (vq_attn_workspace_bytes)
// as their context's workspace, and the forward saves its cache and weights for the backward, as
// the vq_gau mixer has them. doc_len > 0: document packing (VqAttnOpts::docs, random_doc_bounds;
// the documents' placement planned by the first call and kept, as the mixers of a model's layers
// share it); the FLOPs stay the stream's.
OpTiming bench_vq_attn(const Ctx& model_ctx, int64_t T, int64_t tokens, int64_t H, int64_t Dk, int64_t Dv, int64_t S,
                       int64_t Lb, DType dt, double doc_len, int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  const bool docs = doc_len > 0;
  const Buffer workspace(vq_attn_workspace_bytes(B, T, H, Dk, Dv, S, Lb, dt, docs), Device::CUDA);
  Ctx ctx = model_ctx;
  ctx.workspace = workspace.data();
  ctx.workspace_bytes = workspace.bytes();
  OwnedTensor q = random_device({B, T, H, Dk}, dt, 1), v = random_device({B, T, H, Dv}, dt, 3);
  OwnedTensor dout = random_device({B, T, H, Dv}, dt, 4), codebook = random_device({H, S, Dk}, DType::F32, 5);
  OwnedTensor u = random_device({H, Dk}, DType::F32, 6), vr = random_device({H, Dk}, DType::F32, 7);
  OwnedTensor rho = random_device({H, Lb + 1, Dk}, DType::F32, 8), k = random_device({B, T, H, Dk}, dt, 2);
  OwnedTensor z(DType::I32, Device::CUDA, {B, T, H}), khat(dt, Device::CUDA, {B, T, H, Dk});
  vq_quantize(ctx, k, codebook, z, khat, Tensor());
  OwnedTensor o(dt, Device::CUDA, {B, T, H, Dv}), lse(DType::F32, Device::CUDA, {B, T, H});
  OwnedTensor dq(dt, Device::CUDA, {B, T, H, Dk}), dkhat(dt, Device::CUDA, {B, T, H, Dk}), dv(dt, Device::CUDA, {B, T, H, Dv});
  OwnedTensor du(DType::F32, Device::CUDA, {H, Dk}), dvr(DType::F32, Device::CUDA, {H, Dk});
  OwnedTensor drho(DType::F32, Device::CUDA, {H, Lb + 1, Dk});
  const Buffer saved_cache(vq_attn_saved_cache_bytes(B, T, H, Dv, S, Lb, dt, docs), Device::CUDA);
  const Buffer saved_weights(vq_attn_saved_weights_bytes(B, T, H, S, Lb, dt, docs), Device::CUDA);
  VqAttnOpts opts;
  opts.block = Lb;
  auto words = [](const Buffer& b) {
    return Tensor(b.data(), DType::F32, Device::CUDA, {static_cast<int64_t>(b.bytes() / 4)});
  };
  OwnedTensor bounds;
  int64_t doc_blocks = 0;
  if (docs) {
    bounds = to(random_doc_bounds(B, T, doc_len), Device::CUDA, DType::I32);
    opts.docs = {bounds->data<int32_t>(), bounds->data<int32_t>() + B * T};
    opts.doc_blocks = &doc_blocks;
  }
  opts.saved_cache = words(saved_cache);
  opts.saved_weights = words(saved_weights);
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { vq_attn_fwd(ctx, q, khat, z, v, codebook, u, vr, rho, o, lse, opts); });
  r.bwd_ms = time_ms(ctx, iters, [&] {
    vq_attn_bwd(ctx, q, khat, z, v, codebook, u, vr, rho, o, lse, dout, dq, dkhat, dv, du, dvr, drho, opts);
  });
  const double per_token_head = 2.0 * (1.5 * static_cast<double>(Lb) + static_cast<double>(S)) * static_cast<double>(Dk + Dv);
  r.flops = 3.0 * per_token_head * static_cast<double>(B * T * H);
  return r;
}

// Decoding one token per sequence over a full KV cache of S = T slots, B = tokens / T sequences
// (the same cache bytes at every T), Hk key/value heads. No backward; memory bound: reported as
// GB/s of cache read.
OpTiming bench_attention_decode(const Ctx& ctx, int64_t T, int64_t tokens, int64_t H, int64_t Hk, int64_t D, DType dt,
                                int64_t iters) {
  const int64_t B = std::max<int64_t>(1, tokens / T);
  OwnedTensor q = random_device({B, H, D}, dt, 1), o(dt, Device::CUDA, {B, H, D});
  OwnedTensor kc = random_device({B, T, Hk, D}, dt, 2), vc = random_device({B, T, Hk, D}, dt, 3);
  OpTiming r{T, B, 0, 0, 0, 0};
  r.fwd_ms = time_ms(ctx, iters, [&] { attention_decode(ctx, q, kc, vc, T, o); });
  r.bytes = 2.0 * static_cast<double>(B * T * Hk * D) * static_cast<double>(dtype_size(dt));
  return r;
}

}  // namespace

int bench_op(Args& args, const std::string& name) {
  const auto lens = parse_int_list(args.get_or("seq-lens", "2048,8192,32768"), "--seq-lens");
  const int64_t tokens = args.get_int("tokens", 32768);
  const bool gla = name == "gla", conv = name == "short_conv", decode = name == "attention_decode";
  const bool taylor = name == "taylor", lightning = name == "lightning", latte = name == "latte", vq = name == "vq_attn";
  const int64_t H = conv ? 0 : args.get_int("heads", gla ? 4 : vq ? 1 : 16);
  const int64_t D = gla || conv || vq ? 0 : args.get_int("head-dim", 64);
  const bool grouped = name == "attention" || decode;
  const int64_t Hk = grouped ? args.get_int("kv-heads", H) : H;
  if (grouped && (Hk < 1 || H % Hk != 0)) throw UserError("--kv-heads must divide --heads (" + std::to_string(H) + ")");
  const int64_t F = taylor ? args.get_int("feature-dim", 16) : 0;
  const int64_t latents = latte ? args.get_int("latents", 16) : 0;
  const bool macchiato = latte && args.flag("macchiato");
  const int64_t Dk = gla || vq ? args.get_int("dk", 128) : 0, Dv = gla || vq ? args.get_int("dv", gla ? 256 : 1536) : 0;
  const int64_t codes = vq ? args.get_int("codes", 512) : 0, block = vq ? args.get_int("block", 512) : 0;
  const int64_t C = conv ? args.get_int("channels", 2048) : 0, W = conv ? args.get_int("width", 3) : 0;
  const int64_t window = gla || conv || decode || taylor || lightning || latte || vq ? 0 : args.get_int("window", 0);
  const double doc_len = name == "attention" || taylor || vq ? args.get_double("doc-len", 0) : 0;
  if (doc_len < 0 || (doc_len > 0 && doc_len < 1)) throw UserError("--doc-len must be at least 1 (a mean document length)");
  const int64_t iters = args.get_int("iters", 20);
  const DType dt = dtype_from_name(args.get_or("dtype", "bf16"));
  const bool as_json = args.flag("json");
  args.finish();
  if (name != "attention" && !gla && !conv && !decode && !taylor && !lightning && !latte && !vq)
    throw UserError("unknown op '" + name +
                    "' (available: attention, attention_decode, gla, latte, lightning, short_conv, taylor, vq_attn)");
  if (!gpu_available()) throw UserError("bench --op needs a CUDA device");
  GpuContext g;
  std::vector<OpTiming> rows;
  for (int64_t T : lens)
    rows.push_back(gla         ? bench_gla(g.ctx(), T, tokens, H, Dk, Dv, dt, iters)
                   : conv      ? bench_short_conv(g.ctx(), T, tokens, C, W, dt, iters)
                   : decode    ? bench_attention_decode(g.ctx(), T, tokens, H, Hk, D, dt, iters)
                   : taylor    ? bench_taylor(g.ctx(), T, tokens, H, F, D, dt, doc_len, iters)
                   : lightning ? bench_lightning(g.ctx(), T, tokens, H, D, dt, iters)
                   : latte     ? bench_latte(g.ctx(), T, tokens, H, latents, D, macchiato, dt, iters)
                   : vq        ? bench_vq_attn(g.ctx(), T, tokens, H, Dk, Dv, codes, block, dt, doc_len, iters)
                               : bench_attention(g.ctx(), T, tokens, H, Hk, D, dt, window, doc_len, iters));
  const std::string gpu = gpu_info().name;
  // What the Taylor op ran: the fused kernels' family, or the launches outside the fused cases.
  const std::string taylor_kernels = taylor && taylor_attn_fused_case(dt, D) ? taylor_attn_gpu_kernels() : "chunk";
  if (as_json) {
    nlohmann::json j = {{"op", name}, {"device", gpu}, {"heads", H}, {"head_dim", D}, {"tokens", tokens}, {"rows", nlohmann::json::array()}};
    if (gla || vq) j["dk"] = Dk, j["dv"] = Dv;
    if (vq)
      j["codes"] = codes, j["block"] = block, j["doc_len"] = doc_len,
      j["score_grads"] = vq_attn_score_grads_kernel(block, Dv, dt);
    if (conv) j["channels"] = C, j["width"] = W;
    if (taylor) j["feature_dim"] = F, j["kernels"] = taylor_kernels, j["doc_len"] = doc_len;
    if (latte) j["latents"] = latents, j["macchiato"] = macchiato;
    if (name == "attention") j["kernels"] = attention_gpu_kernels(D), j["window"] = window, j["doc_len"] = doc_len;
    if (name == "attention" || decode) j["kv_heads"] = Hk;
    for (const auto& r : rows) {
      const double ms = r.fwd_ms + r.bwd_ms;
      nlohmann::json row = {
          {"seq_len", r.T}, {"batch", r.B}, {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}, {"total_ms", ms}};
      if (r.bytes > 0)
        row["gbps"] = r.bytes / (ms * 1e6);
      else
        row["tflops"] = r.flops / (ms * 1e9);
      j["rows"].push_back(row);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const std::string kv = Hk != H ? " (" + std::to_string(Hk) + " KV)" : "";
  const std::string dims =
      gla  ? "H=" + std::to_string(H) + ", Dk=" + std::to_string(Dk) + ", Dv=" + std::to_string(Dv)
      : vq ? "H=" + std::to_string(H) + ", Dk=" + std::to_string(Dk) + ", Dv=" + std::to_string(Dv) +
                 ", S=" + std::to_string(codes) + ", Lb=" + std::to_string(block) + ", score gradients by " +
                 vq_attn_score_grads_kernel(block, Dv, dt)
      : conv   ? "C=" + std::to_string(C) + ", width " + std::to_string(W)
      : taylor ? "H=" + std::to_string(H) + ", F=" + std::to_string(F) + ", Dv=" + std::to_string(D) + ", " +
                     taylor_kernels + " kernels"
      : latte ? "H=" + std::to_string(H) + ", L=" + std::to_string(latents) + ", Dv=" + std::to_string(D) +
                    (macchiato ? ", Macchiato" : "")
      : name == "attention"
          ? "H=" + std::to_string(H) + kv + ", D=" + std::to_string(D) + ", " + attention_gpu_kernels(D) + " kernels"
          : "H=" + std::to_string(H) + kv + ", D=" + std::to_string(D);
  std::printf("%s fwd+bwd on %s, %s, %lld tokens per call, %s%s\n", name.c_str(), gpu.c_str(), dtype_name(dt),
              static_cast<long long>(tokens), dims.c_str(),
              (std::string(window ? ", window " + std::to_string(window) : "") +
               (doc_len > 0 ? ", documents of mean length " + std::to_string(std::llround(doc_len)) : ""))
                  .c_str());
  std::printf("%8s %5s %10s %10s %10s %9s\n", "T", "B", "fwd ms", "bwd ms", "total ms", conv || decode ? "GB/s" : "TFLOP/s");
  for (const auto& r : rows) {
    const double ms = r.fwd_ms + r.bwd_ms;
    std::printf("%8lld %5lld %10.3f %10.3f %10.3f %9.1f\n", static_cast<long long>(r.T), static_cast<long long>(r.B),
                r.fwd_ms, r.bwd_ms, ms, r.bytes > 0 ? r.bytes / (ms * 1e6) : r.flops / (ms * 1e9));
  }
  return 0;
}

}  // namespace linac::cli
