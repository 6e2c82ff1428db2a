// Short-convolution entry points: argument checks, the layout (shapes, batch/token strides),
// device/dtype dispatch.
#include "short_conv/short_conv.h"

#include <string>

#include "core/dispatch.h"

namespace linac {

namespace {

// A [B,T,C] argument shaped like a: unit channel stride, free batch/token strides.
void check_btc(const Tensor& x, const Tensor& a, const char* name) {
  LINAC_CHECK(x.ndim == 3, std::string("short_conv: ") + name + " must be [B,T,C], got " + x.shape_str());
  LINAC_CHECK_SHAPE(x, a);
  LINAC_CHECK(x.strides[2] == 1, std::string("short_conv: ") + name + " must have unit channel stride");
  LINAC_CHECK(x.device == a.device, std::string("short_conv: ") + name + " is on another device");
}

// A [B,C] step argument shaped like a_t: unit channel stride, free batch stride.
void check_bc(const Tensor& x, const Tensor& a_t, const char* name) {
  LINAC_CHECK(x.ndim == 2, std::string("short_conv_step: ") + name + " must be [B,C], got " + x.shape_str());
  LINAC_CHECK_SHAPE(x, a_t);
  LINAC_CHECK(x.strides[1] == 1, std::string("short_conv_step: ") + name + " must have unit channel stride");
  LINAC_CHECK(x.device == a_t.device, std::string("short_conv_step: ") + name + " is on another device");
}

// h [C, W] and the optional biases [C]; returns W.
int64_t check_params(const Tensor& h, const Tensor& ba, const Tensor& bg, int64_t C, Device dev) {
  LINAC_CHECK(h.ndim == 2 && h.is_contiguous() && h.size(0) == C,
              "short_conv: h must be [C, W] contiguous with C = " + std::to_string(C) + ", got " + h.shape_str());
  const int64_t W = h.size(1);
  LINAC_CHECK(W >= 1 && W <= kShortConvMaxWidth,
              "short_conv: width must be 1.." + std::to_string(kShortConvMaxWidth) + ", got " + std::to_string(W));
  LINAC_CHECK(h.device == dev, "short_conv: h is on another device");
  for (const Tensor* b : {&ba, &bg}) {
    if (!b->defined()) continue;
    LINAC_CHECK(b->ndim == 1 && b->size(0) == C && b->is_contiguous(),
                "short_conv: biases must be [C] contiguous, got " + b->shape_str());
    LINAC_CHECK(b->device == dev, "short_conv: a bias is on another device");
  }
  return W;
}

ShortConvLayout::Strides strides(const Tensor& x) { return {x.strides[0], x.strides[1]}; }

ShortConvLayout make_layout(const Tensor& a, const Tensor& g, const Tensor& h, const Tensor& ba, const Tensor& bg,
                            const ShortConvOpts& opts) {
  check_btc(a, a, "a");
  check_btc(g, a, "g");
  ShortConvLayout L;
  L.B = a.size(0), L.T = a.size(1), L.C = a.size(2);
  L.W = check_params(h, ba, bg, L.C, a.device);
  L.silu = opts.silu;
  L.doc_start = opts.docs.start;
  L.a = strides(a), L.g = strides(g);
  return L;
}

void check_cpu_dtypes(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts) LINAC_CHECK(!t->defined() || t->dtype == dt, "short_conv: CPU dtypes must agree");
}

}  // namespace

void short_conv_fwd(const Ctx& ctx, const Tensor& a, const Tensor& g, const Tensor& h, const Tensor& ba,
                    const Tensor& bg, const Tensor& z, const ShortConvOpts& opts) {
  ShortConvLayout L = make_layout(a, g, h, ba, bg, opts);
  check_btc(z, a, "z");
  L.z = strides(z);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    short_conv_fwd_cuda(ctx, L, a, g, h, ba, bg, z);
#endif
    return;
  }
  check_cpu_dtypes({&a, &g, &h, &ba, &bg, &z});
  LINAC_CPU_DISPATCH(a.dtype, F,
                     short_conv_fwd_cpu<F>(L, a.data<F>(), g.data<F>(), h.data<F>(), ptr_or_null<F>(ba),
                                           ptr_or_null<F>(bg), z.data<F>()));
}

void short_conv_bwd(const Ctx& ctx, const Tensor& a, const Tensor& g, const Tensor& h, const Tensor& ba,
                    const Tensor& bg, const Tensor& dz, const Tensor& da, const Tensor& dg, const Tensor& dh,
                    const Tensor& dba, const Tensor& dbg, const ShortConvOpts& opts) {
  ShortConvLayout L = make_layout(a, g, h, ba, bg, opts);
  check_btc(dz, a, "dz");
  check_btc(da, a, "da");
  if (dg.defined()) {
    check_btc(dg, a, "dg");
    L.dg = strides(dg);
  }
  L.dz = strides(dz), L.da = strides(da);
  LINAC_CHECK(dh.ndim == 2 && dh.is_contiguous() && same_shape(dh, h) && dh.device == a.device,
              "short_conv: dh must be shaped like h, contiguous, got " + dh.shape_str());
  LINAC_CHECK(ba.defined() || !dba.defined(), "short_conv: dba given without ba");
  LINAC_CHECK(bg.defined() || !dbg.defined(), "short_conv: dbg given without bg");
  check_params(h, dba, dbg, L.C, a.device);
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    short_conv_bwd_cuda(ctx, L, a, g, h, ba, bg, dz, da, dg, dh, dba, dbg);
#endif
    return;
  }
  check_cpu_dtypes({&a, &g, &h, &ba, &bg, &dz, &da, &dg, &dh, &dba, &dbg});
  LINAC_CPU_DISPATCH(a.dtype, F,
                     short_conv_bwd_cpu<F>(L, a.data<F>(), g.data<F>(), h.data<F>(), ptr_or_null<F>(ba),
                                           ptr_or_null<F>(bg), dz.data<F>(), da.data<F>(), ptr_or_null<F>(dg),
                                           dh.data<F>(), ptr_or_null<F>(dba), ptr_or_null<F>(dbg)));
}

void short_conv_step(const Ctx& ctx, const Tensor& a_t, const Tensor& g_t, const Tensor& h, const Tensor& ba,
                     const Tensor& bg, const Tensor& state, const Tensor& z_t, const ShortConvOpts& opts) {
  check_bc(a_t, a_t, "a_t");
  check_bc(g_t, a_t, "g_t");
  check_bc(z_t, a_t, "z_t");
  LINAC_CHECK(!opts.docs.defined(), "short_conv_step: a document starts from a zeroed state, not from bounds");
  ShortConvLayout L;
  L.B = a_t.size(0), L.T = 1, L.C = a_t.size(1);
  L.W = check_params(h, ba, bg, L.C, a_t.device);
  L.silu = opts.silu;
  L.a = {a_t.strides[0], 0}, L.g = {g_t.strides[0], 0}, L.z = {z_t.strides[0], 0};
  LINAC_CHECK(state.ndim == 3 && state.size(0) == L.B && state.size(1) == L.W - 1 && state.size(2) == L.C &&
                  state.is_contiguous() && state.device == a_t.device,
              "short_conv_step: state must be [B, W-1, C] contiguous, got " + state.shape_str());
  if (ctx.is_gpu()) {
    LINAC_REQUIRE_CUDA();
#if LINAC_WITH_CUDA
    short_conv_step_cuda(ctx, L, a_t, g_t, h, ba, bg, state, z_t);
#endif
    return;
  }
  check_cpu_dtypes({&a_t, &g_t, &h, &ba, &bg, &state, &z_t});
  LINAC_CPU_DISPATCH(a_t.dtype, F,
                     short_conv_step_cpu<F>(L, a_t.data<F>(), g_t.data<F>(), h.data<F>(), ptr_or_null<F>(ba),
                                            ptr_or_null<F>(bg), state.data<F>(), z_t.data<F>()));
}

size_t short_conv_bwd_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t W) {
  // One row of W + 2 partial sums (dh[:, j], dba, dbg) per channel per token tile: the carve in short_conv.cu.
  const int64_t tiles = B * ((T + kShortConvTileTokens - 1) / kShortConvTileTokens);
  const size_t bytes = static_cast<size_t>(tiles * (W + 2) * C) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

}  // namespace linac
