// Attention entry points: argument checks and device/dtype dispatch.
#include "attention/attention.h"

#include <cmath>
#include <string>
#include <string_view>

#include "core/dispatch.h"
#include "rope/rope.h"

namespace linac {

namespace {

// A [B,T,H,D] argument: same shape as `like`, head and dim strides fixed, batch/token strides free.
void check_bthd(const Tensor& x, const Tensor& like, const char* name) {
  LINAC_CHECK(x.ndim == 4, std::string("attention: ") + name + " must be [B,T,H,D], got " + x.shape_str());
  LINAC_CHECK_SHAPE(x, like);
  LINAC_CHECK(x.strides[3] == 1 && (x.shape[2] == 1 || x.strides[2] == x.shape[3]),
              std::string("attention: ") + name + " must have contiguous [H,D] rows");
  LINAC_CHECK(x.device == like.device, std::string("attention: ") + name + " is on another device");
}

// k or v: [B, T, Hk, D] with q's B, T and D, Hk dividing q's H.
void check_kv(const Tensor& x, const Tensor& q, const char* name) {
  LINAC_CHECK(x.ndim == 4 && x.size(0) == q.size(0) && x.size(1) == q.size(1) && x.size(3) == q.size(3) &&
                  x.size(2) > 0 && q.size(2) % x.size(2) == 0,
              std::string("attention: ") + name + " must be [B,T,Hk,D] with Hk dividing q's heads, got " +
                  x.shape_str() + " for q " + q.shape_str());
  Tensor same = q;
  same.shape[2] = x.size(2);
  check_bthd(x, same, name);
}

AttentionLayout make_layout(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                            const AttentionOpts& opts) {
  check_bthd(q, q, "q");
  check_kv(k, q, "k");
  check_bthd(v, k, "v");
  check_bthd(o, q, "o");
  AttentionLayout L;
  L.B = q.size(0), L.T = q.size(1), L.H = q.size(2), L.D = q.size(3), L.Hk = k.size(2);
  LINAC_CHECK(lse.ndim == 3 && lse.is_contiguous() && lse.size(0) == L.B && lse.size(1) == L.H && lse.size(2) == L.T,
              "attention: lse must be [B,H,T] contiguous, got " + lse.shape_str());
  LINAC_CHECK(opts.window >= 0 && (opts.window == 0 || opts.causal), "attention: a window needs causal attention");
  LINAC_CHECK(L.D > 0, "attention: empty head dim");
  // The kernels subtract the running maximum of the raw scores, which is the maximum of the scaled
  // ones only for a positive scale.
  LINAC_CHECK(opts.scale >= 0, "attention: the softmax scale must be positive");
  L.scale = opts.scale != 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(L.D));
  L.causal = opts.causal;
  L.window = opts.window;
  LINAC_CHECK(opts.rope.base >= 0 && (!opts.rope.defined() || L.D % 2 == 0),
              "attention: RoPE needs a positive base and an even head dim");
  L.rope = opts.rope;
  LINAC_CHECK(!opts.docs.defined() || (opts.causal && opts.docs.end), "attention: document bounds need causal "
              "attention and both start and end");
  L.docs = opts.docs;
  L.accumulate_dv = opts.accumulate_dv;
  auto strides = [](const Tensor& x) { return AttentionLayout::Strides{x.strides[0], x.strides[1]}; };
  L.q = strides(q), L.k = strides(k), L.v = strides(v), L.o = strides(o);
  return L;
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    LINAC_CHECK(t->dtype == (*ts.begin())->dtype, "attention: CPU dtypes must agree");
}

}  // namespace

const char* attention_gpu_kernels(int64_t D) {
  const bool hopper = hopper_kernels_allowed("LINAC_ATTENTION_KERNELS");
  if (LINAC_WITH_SM90A && hopper && attention_gpu_head_dim_ok(D) && gpu_compute_capability() == 90) return "sm90";
  return "sm80";
}

void attention_fwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, const AttentionOpts& opts) {
  const AttentionLayout L = make_layout(q, k, v, o, lse, opts);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    attention_fwd_cuda(ctx, L, q, k, v, o, lse);
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &o, &lse});
  LINAC_CPU_DISPATCH(q.dtype, F,
                     attention_fwd_cpu<F>(L, q.data<F>(), k.data<F>(), v.data<F>(), o.data<F>(), lse.data<F>()));
}

void attention_bwd(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                   const AttentionOpts& opts) {
  AttentionLayout L = make_layout(q, k, v, o, lse, opts);
  check_bthd(dout, q, "dout");
  check_bthd(dq, q, "dq");
  check_bthd(dk, k, "dk");
  check_bthd(dv, k, "dv");
  auto strides = [](const Tensor& x) { return AttentionLayout::Strides{x.strides[0], x.strides[1]}; };
  L.dout = strides(dout), L.dq = strides(dq), L.dk = strides(dk), L.dv = strides(dv);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
    attention_bwd_cuda(ctx, L, q, k, v, o, lse, dout, dq, dk, dv);
    return;
  }
  check_cpu_dtypes({&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv});
  LINAC_CPU_DISPATCH(q.dtype, F,
                     attention_bwd_cpu<F>(L, q.data<F>(), k.data<F>(), v.data<F>(), o.data<F>(), lse.data<F>(),
                                          dout.data<F>(), dq.data<F>(), dk.data<F>(), dv.data<F>()));
  if (L.rope.defined()) {
    rope_bwd(ctx, dq, L.rope, 0, L.docs);
    rope_bwd(ctx, dk, L.rope, 0, L.docs);
  }
}

bool attention_bwd_fuses_rope(int64_t D) { return std::string_view(attention_gpu_kernels(D)) == "sm90"; }

AttentionBwdWorkspace attention_bwd_workspace(int64_t B, int64_t T, int64_t H, int64_t D, bool rope) {
  auto aligned = [](int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256 * 256); };
  AttentionBwdWorkspace w;
  w.bytes = aligned(B * H * T * 4);
  if (std::string_view(attention_gpu_kernels(D)) == "sm90") {
    const int64_t tiles = B * H * ((T + kAttentionDqTile - 1) / kAttentionDqTile);
    w.counters = w.bytes;
    w.bytes += aligned((tiles + 1) * 4);
    w.dq_acc = w.bytes;
    w.bytes += aligned(tiles * kAttentionDqTile * attention_sm90_tile_cols(D) * 4);
  }
  if (rope && attention_bwd_fuses_rope(D)) {
    w.rope_table = w.bytes;
    w.bytes += aligned(T * (D / 2) * 8);
  }
  return w;
}

}  // namespace linac
