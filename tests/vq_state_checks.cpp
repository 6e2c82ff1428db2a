#include "vq_state_checks.h"

#include <gtest/gtest.h>

#include <string>

#include "core/buffer.h"
#include "test_util.h"
#include "vq_attn/vq_attn.h"

namespace linac::test {

namespace {

struct State {
  OwnedTensor khat, v, z, counts, means;
  State(DType dt, Device dev, int64_t B, int64_t H, int64_t Lb, int64_t Dk, int64_t Dv, int64_t S)
      : khat(dt, dev, {B, H, Lb, Dk}),
        v(dt, dev, {B, H, Lb, Dv}),
        z(DType::I32, dev, {B, H, Lb}),
        counts(dt, dev, {B, H, S}),
        means(dt, dev, {B, H, S, Dv}) {}
  VqAttnState view() const { return {khat, v, z, counts, means}; }
};

std::vector<int32_t> host_ints(const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  copy_tensor(Tensor(out.data(), DType::I32, Device::CPU, t.dims()), t);
  return out;
}

}  // namespace

void check_state_prefill_matches_steps(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z,
                                       const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr,
                                       const Tensor& rho, const std::vector<std::vector<int64_t>>& docs) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dk = q.size(3), Dv = v.size(3);
  const int64_t S = codebook.size(1), Lb = rho.size(1) - 1;
  const Device dev = q.device;
  const DType state_dt = ctx.is_gpu() ? DType::F32 : q.dtype;
  // Document bounds: per token the start and end of its document in the row.
  OwnedTensor start(DType::I32, Device::CPU, {B, T}), end(DType::I32, Device::CPU, {B, T});
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> lens = docs.empty() ? std::vector<int64_t>{T} : docs[static_cast<size_t>(b)];
    int64_t a = 0;
    for (int64_t len : lens) {
      for (int64_t t = a; t < a + len; ++t) {
        start->data<int32_t>()[b * T + t] = static_cast<int32_t>(a);
        end->data<int32_t>()[b * T + t] = static_cast<int32_t>(a + len);
      }
      a += len;
    }
    ASSERT_EQ(a, T) << "row " << b << "'s documents do not add up to T";
  }
  const OwnedTensor start_d = to(start, dev, DType::I32), end_d = to(end, dev, DType::I32);
  DocBounds bounds;
  if (!docs.empty()) bounds = {start_d->data<int32_t>(), end_d->data<int32_t>()};

  // The prefill, into a poisoned state: it must write all of it.
  State pre(state_dt, dev, B, H, Lb, Dk, Dv, S);
  for (const Tensor* t : {&pre.khat.t, &pre.v.t, &pre.counts.t, &pre.means.t}) poison(*t);
  const OwnedTensor z_d = to(z, dev, DType::I32);
  Ctx pctx = ctx;
  OwnedTensor ws;
  if (ctx.is_gpu()) {
    ws =
        OwnedTensor(DType::F32, dev, {static_cast<int64_t>(vq_attn_state_prefill_workspace_bytes(B, T, H, S) / 4 + 1)});
    pctx.workspace = ws->ptr;
    pctx.workspace_bytes = ws->nbytes();
  }
  vq_attn_state_prefill(pctx, khat, z_d, v, pre.view(), bounds);

  // The steps.
  State step(state_dt, dev, B, H, Lb, Dk, Dv, S);
  vq_attn_state_reset(ctx, step.view());
  OwnedTensor o(q.dtype, dev, {B, H, Dv}), zc_h(DType::I32, Device::CPU, {B, H});
  std::vector<int32_t> pos(static_cast<size_t>(B));  // each row's position in its document
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const int32_t a = start->data<int32_t>()[b * T + t];
      if (t > 0 && a == t) vq_attn_state_start_document(ctx, step.view(), b);
      pos[static_cast<size_t>(b)] = static_cast<int32_t>(t - a);
    }
    for (int64_t i = 0; i < B * H; ++i) zc_h->data<int32_t>()[i] = z.data<int32_t>()[((i / H) * T + t) * H + i % H];
    const OwnedTensor zc = to(zc_h, dev, DType::I32), pos_d = int32_values(pos, dev);
    vq_attn_step(ctx, token(q, t), token(khat, t), zc, token(v, t), codebook, u, vr, rho, step.view(), pos_d, o);
  }
  if (ctx.is_gpu()) ctx_synchronize(ctx);

  EXPECT_EQ(to_doubles(pre.counts), to_doubles(step.counts)) << "cache counts";
  EXPECT_EQ(to_doubles(pre.means), to_doubles(step.means)) << "cache means";
  const std::vector<int32_t> zp = host_ints(pre.z), zs = host_ints(step.z);
  const std::vector<double> kp = to_doubles(pre.khat), ks = to_doubles(step.khat);
  const std::vector<double> vp = to_doubles(pre.v), vs = to_doubles(step.v);
  for (int64_t b = 0; b < B; ++b) {
    // The last document's n tokens from a; slot i holds its latest token at a position r = i mod Lb.
    const int64_t a = start->data<int32_t>()[b * T + T - 1], n = T - a;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lb; ++i) {
        const int64_t r = i + (n - 1 - i) / Lb * Lb, t = a + r, slot = (b * H + h) * Lb + i;
        SCOPED_TRACE("row " + std::to_string(b) + " head " + std::to_string(h) + " slot " + std::to_string(i) +
                     " (last document from " + std::to_string(a) + ", " + std::to_string(n) + " tokens)");
        const auto s = static_cast<size_t>(slot);
        if (i >= n) {  // no token of the last document: absent (in the steps, z = 0 where no token ever was)
          EXPECT_EQ(zp[s], -1);
          if (n < T) EXPECT_EQ(zs[s], -1);
          continue;
        }
        ASSERT_EQ(zp[s], zs[s]);
        ASSERT_EQ(zp[s], z.data<int32_t>()[(b * T + t) * H + h]);
        for (int64_t e = 0; e < Dk; ++e) ASSERT_EQ(kp[s * Dk + e], ks[s * Dk + e]) << "khat " << e;
        for (int64_t e = 0; e < Dv; ++e) ASSERT_EQ(vp[s * Dv + e], vs[s * Dv + e]) << "v " << e;
      }
  }
}

}  // namespace linac::test
