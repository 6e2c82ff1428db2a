// Grouped-query attention on the CPU (attention.h): H query heads over Hk key/value heads, q/k/v
// as views of a fused [B, T, H + 2 Hk, D] projection, as the mixer passes them.
//  - GQA equals multi-head attention with each key/value head repeated over its group: the same o
//    and lse, the same dq, and dk/dv the group sums of the repeated heads' gradients;
//  - the backward against finite differences in double, with a window, RoPE and documents;
//  - decoding from a cache of Hk heads equals the forward's rows;
//  - shapes that do not divide are refused.
#include <cmath>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "model/mixers/proj_views.h"
#include "rope/rope.h"
#include "test_util.h"

namespace linac::test_attention_gqa {
namespace {

struct GqaCase {
  int64_t T, H, Hk, D;
  int64_t window = 0;
  double rope = 0;
  bool docs = false;
};

std::string name(const GqaCase& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " Hk=" + std::to_string(c.Hk) +
         " D=" + std::to_string(c.D) + " window=" + std::to_string(c.window) + (c.rope > 0 ? " rope" : "") +
         (c.docs ? " docs" : "");
}

constexpr int64_t kB = 2;

// q, k, v views of a fused [B*T, (H + 2 Hk) D] buffer.
struct Qkv {
  Tensor q, k, v;
};
Qkv views(const Tensor& fused, const GqaCase& c) {
  return {bthd(fused, kB, c.T, 0, c.H, c.D), bthd(fused, kB, c.T, c.H * c.D, c.Hk, c.D),
          bthd(fused, kB, c.T, (c.H + c.Hk) * c.D, c.Hk, c.D)};
}

// The [B, T, H, D] tensor whose head h is head h / (H / Hk) of x [B, T, Hk, D].
OwnedTensor repeat_heads(const Tensor& x, int64_t H) {
  const int64_t BT = x.size(0) * x.size(1), Hk = x.size(2), D = x.size(3);
  const std::vector<double> in = test::view_values(x);
  OwnedTensor out(DType::F64, Device::CPU, {x.size(0), x.size(1), H, D});
  for (int64_t bt = 0; bt < BT; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < D; ++e)
        out->data<double>()[(bt * H + h) * D + e] = in[static_cast<size_t>((bt * Hk + h / (H / Hk)) * D + e)];
  return out;
}

AttentionOpts opts_of(const GqaCase& c, const test::DocLayout& docs) {
  AttentionOpts o;
  o.window = c.window;
  o.rope = c.rope;
  if (c.docs) o.docs = docs.host();
  return o;
}

test::DocLayout layout_of(const GqaCase& c) { return test::doc_layout(kB, c.T, {{5, 1, 9}, {3, 11, 2}}); }

TEST(AttentionGqaCpu, EqualsMultiHeadWithRepeatedKeyValueHeads) {
  for (const GqaCase& c : {GqaCase{13, 4, 2, 8}, GqaCase{29, 6, 1, 16, 7}, GqaCase{21, 6, 3, 8, 0, 50.0, true}}) {
    SCOPED_TRACE(name(c));
    const int64_t P = (c.H + 2 * c.Hk) * c.D;
    OwnedTensor fused = test::random_tensor({kB * c.T, P}, DType::F64, 41, -1.5, 1.5);
    OwnedTensor dout = test::random_tensor({kB, c.T, c.H, c.D}, DType::F64, 42);
    const test::DocLayout docs = layout_of(c);
    const AttentionOpts opts = opts_of(c, docs);
    const Qkv in = views(fused, c);
    OwnedTensor o(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}), lse(DType::F64, Device::CPU, {kB, c.H, c.T});
    OwnedTensor dfused(DType::F64, Device::CPU, {kB * c.T, P});
    test::poison(dfused);
    attention_fwd(Ctx{}, in.q, in.k, in.v, o, lse, opts);
    const Qkv d = views(dfused, c);
    attention_bwd(Ctx{}, in.q, in.k, in.v, o, lse, dout, d.q, d.k, d.v, opts);

    const OwnedTensor k_rep = repeat_heads(in.k, c.H), v_rep = repeat_heads(in.v, c.H);
    OwnedTensor o_m(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}), lse_m(DType::F64, Device::CPU, {kB, c.H, c.T});
    OwnedTensor dq_m(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}), dk_m(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}),
        dv_m(DType::F64, Device::CPU, {kB, c.T, c.H, c.D});
    attention_fwd(Ctx{}, in.q, k_rep, v_rep, o_m, lse_m, opts);
    attention_bwd(Ctx{}, in.q, k_rep, v_rep, o_m, lse_m, dout, dq_m, dk_m, dv_m, opts);
    EXPECT_EQ(test::max_abs_diff(to_doubles(o), to_doubles(o_m)), 0.0);
    EXPECT_EQ(test::max_abs_diff(to_doubles(lse), to_doubles(lse_m)), 0.0);
    EXPECT_EQ(test::max_abs_diff(test::view_values(d.q), to_doubles(dq_m)), 0.0);
    // dk, dv of head g: the sum over its group of the repeated heads' gradients.
    const int64_t G = c.H / c.Hk;
    for (const auto& [ours, theirs] : {std::pair{d.k, &dk_m}, std::pair{d.v, &dv_m}}) {
      OwnedTensor sum(DType::F64, Device::CPU, {kB, c.T, c.Hk, c.D});
      std::vector<double> acc(static_cast<size_t>(sum->numel()), 0.0);
      for (int64_t h = 0; h < c.H; ++h) {
        const std::vector<double> part = test::view_values((*theirs)->select(2, h));
        for (int64_t bt = 0; bt < kB * c.T; ++bt)
          for (int64_t e = 0; e < c.D; ++e)
            acc[static_cast<size_t>((bt * c.Hk + h / G) * c.D + e)] += part[static_cast<size_t>(bt * c.D + e)];
      }
      EXPECT_LT(test::max_abs_diff(test::view_values(ours), acc), 1e-12);
    }
  }
}

TEST(AttentionGqaCpu, GradCheckDouble) {
  for (const GqaCase& c : {GqaCase{13, 4, 2, 8}, GqaCase{37, 3, 1, 8, 5}, GqaCase{17, 4, 1, 16, 0, 30.0},
                           GqaCase{23, 6, 2, 8, 0, 30.0, true}}) {
    SCOPED_TRACE(name(c));
    const int64_t P = (c.H + 2 * c.Hk) * c.D;
    OwnedTensor fused = test::random_tensor({kB * c.T, P}, DType::F64, 51);
    OwnedTensor u = test::random_tensor({kB, c.T, c.H, c.D}, DType::F64, 52);
    const test::DocLayout docs = layout_of(c);
    const AttentionOpts opts = opts_of(c, docs);
    OwnedTensor rot(DType::F64, Device::CPU, {kB * c.T, P});
    OwnedTensor o(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}), lse(DType::F64, Device::CPU, {kB, c.H, c.T});
    // loss = sum(attention(rope(q), rope(k), v) * u): the backward returns unrotated gradients.
    auto forward = [&] {
      copy_tensor(rot, fused);
      const Qkv r = views(rot, c);
      if (c.rope > 0) {
        rope_fwd(Ctx{}, r.q, opts.rope, 0, opts.docs);
        rope_fwd(Ctx{}, r.k, opts.rope, 0, opts.docs);
      }
      attention_fwd(Ctx{}, r.q, r.k, r.v, o, lse, opts);
    };
    forward();
    OwnedTensor dfused(DType::F64, Device::CPU, {kB * c.T, P});
    test::poison(dfused);
    const Qkv r = views(rot, c), d = views(dfused, c);
    attention_bwd(Ctx{}, r.q, r.k, r.v, o, lse, u, d.q, d.k, d.v, opts);
    ASSERT_TRUE(test::all_finite(to_doubles(dfused)));
    auto loss = [&] {
      forward();
      double l = 0;
      for (int64_t i = 0; i < o->numel(); ++i) l += o->data<double>()[i] * u->data<double>()[i];
      return l;
    };
    const double err = test::check_grad(loss, fused->data<double>(), dfused->data<double>(),
                                        static_cast<size_t>(dfused->numel()), 160, 9, 1e-5);
    EXPECT_LT(err, 1e-6);
  }
}

TEST(AttentionGqaCpu, DecodeFromAGroupedCacheEqualsTheForward) {
  const GqaCase c{19, 6, 2, 8};
  const int64_t P = (c.H + 2 * c.Hk) * c.D;
  OwnedTensor fused = test::random_tensor({kB * c.T, P}, DType::F64, 61, -2, 2);
  const Qkv in = views(fused, c);
  OwnedTensor o(DType::F64, Device::CPU, {kB, c.T, c.H, c.D}), lse(DType::F64, Device::CPU, {kB, c.H, c.T});
  attention_fwd(Ctx{}, in.q, in.k, in.v, o, lse, AttentionOpts{});
  OwnedTensor kc(DType::F64, Device::CPU, {kB, c.T, c.Hk, c.D}), vc(DType::F64, Device::CPU, {kB, c.T, c.Hk, c.D});
  OwnedTensor ot(DType::F64, Device::CPU, {kB, c.H, c.D});
  for (int64_t t = 0; t < c.T; ++t) {
    attention_cache_write(Ctx{}, in.k.select(1, t), in.v.select(1, t), kc, vc, t);
    test::poison(ot);
    attention_decode(Ctx{}, in.q.select(1, t), kc, vc, t + 1, ot);
    EXPECT_LT(test::max_abs_diff(to_doubles(ot), test::view_values(o->select(1, t))), 1e-12) << "t=" << t;
  }
}

TEST(AttentionGqaCpu, RefusesHeadsThatDoNotDivide) {
  OwnedTensor q(DType::F64, Device::CPU, {1, 5, 4, 8}), k(DType::F64, Device::CPU, {1, 5, 3, 8});
  OwnedTensor o(DType::F64, Device::CPU, {1, 5, 4, 8}), lse(DType::F64, Device::CPU, {1, 4, 5});
  try {
    attention_fwd(Ctx{}, q, k, k, o, lse, AttentionOpts{});
    FAIL() << "3 key/value heads for 4 query heads must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Hk dividing"), std::string::npos) << e.what();
  }
  OwnedTensor qd(DType::F64, Device::CPU, {1, 4, 8}), kc(DType::F64, Device::CPU, {1, 6, 3, 8});
  OwnedTensor od(DType::F64, Device::CPU, {1, 4, 8});
  EXPECT_ANY_THROW(attention_decode(Ctx{}, qd, kc, kc, 2, od));
}

}  // namespace
}  // namespace linac::test_attention_gqa
