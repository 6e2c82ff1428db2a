// Attention CPU reference: forward against a direct masked-softmax computation, backward against
// finite differences, on q/k/v views of a fused [B,T,3,H,D] buffer (as the model passes them).
#include <cmath>
#include <limits>

#include "attention/attention.h"
#include "rope/rope.h"
#include "test_util.h"

namespace linac::test_attention {
namespace {

struct Case {
  int64_t T, D;
  bool causal;
  int64_t window;
};

std::string name(const Case& c) {
  return "T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) + (c.causal ? " causal" : " full") +
         " window=" + std::to_string(c.window);
}

// loss = sum(o * u) for a fixed random u, so every output element carries gradient.
struct AttentionProblem {
  static constexpr int64_t B = 2, H = 2;
  Case c;
  AttentionOpts opts;
  OwnedTensor qkv, u;
  AttentionProblem(const Case& cs)
      : c(cs), qkv(test::random_tensor({B, cs.T, 3, H, cs.D}, DType::F64, 21)),
        u(test::random_tensor({B, cs.T, H, cs.D}, DType::F64, 22)) {
    opts.causal = cs.causal;
    opts.window = cs.window;
  }
  Tensor part(const Tensor& fused, int i) const { return fused.select(2, i); }
  void forward(const Tensor& o, const Tensor& lse) const {
    attention_fwd(Ctx{}, part(qkv, 0), part(qkv, 1), part(qkv, 2), o, lse, opts);
  }
  double loss() const {
    OwnedTensor o(DType::F64, Device::CPU, {B, c.T, H, c.D}), lse(DType::F64, Device::CPU, {B, H, c.T});
    forward(o, lse);
    double l = 0;
    for (int64_t i = 0; i < o->numel(); ++i) l += o->data<double>()[i] * u->data<double>()[i];
    return l;
  }
};

TEST(AttentionCpu, ForwardMatchesDirectSoftmax) {
  for (const Case& c : {Case{13, 8, true, 0}, Case{37, 64, true, 5}, Case{20, 8, false, 0}, Case{9, 128, true, 0}}) {
    AttentionProblem p(c);
    const int64_t B = p.B, H = p.H, T = c.T, D = c.D;
    OwnedTensor o(DType::F64, Device::CPU, {B, T, H, D}), lse(DType::F64, Device::CPU, {B, H, T});
    test::poison(o);
    test::poison(lse);
    p.forward(o, lse);
    const double* x = p.qkv->data<double>();
    auto at = [&](int64_t b, int64_t t, int i, int64_t h, int64_t d) {
      return x[(((b * T + t) * 3 + i) * H + h) * D + d];
    };
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    std::vector<double> s(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          double z = 0;
          for (int64_t j = 0; j < T; ++j) {
            const bool allowed = !c.causal || (j <= t && (c.window == 0 || j > t - c.window));
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += at(b, t, 0, h, d) * at(b, j, 1, h, d);
            s[j] = allowed ? std::exp(scale * dot) : 0.0;
            z += s[j];
          }
          EXPECT_NEAR(lse->data<double>()[(b * H + h) * T + t], std::log(z), 1e-12) << name(c);
          for (int64_t d = 0; d < D; ++d) {
            double ref = 0;
            for (int64_t j = 0; j < T; ++j) ref += s[j] / z * at(b, j, 2, h, d);
            EXPECT_NEAR(o->data<double>()[((b * T + t) * H + h) * D + d], ref, 1e-12) << name(c);
          }
        }
  }
}

TEST(AttentionCpu, GradCheckDouble) {
  for (const Case& c : {Case{13, 8, true, 0}, Case{37, 8, true, 0}, Case{37, 8, true, 5}, Case{13, 8, false, 0},
                        Case{13, 64, true, 0}, Case{37, 64, true, 5}, Case{11, 128, true, 0}}) {
    AttentionProblem p(c);
    const int64_t B = p.B, H = p.H, T = c.T, D = c.D;
    OwnedTensor o(DType::F64, Device::CPU, {B, T, H, D}), lse(DType::F64, Device::CPU, {B, H, T});
    p.forward(o, lse);
    // dq/dk/dv are views into a fused gradient buffer; NaN first checks they are overwritten.
    OwnedTensor dqkv(DType::F64, Device::CPU, {B, T, 3, H, D});
    test::poison(dqkv);
    attention_bwd(Ctx{}, p.part(p.qkv, 0), p.part(p.qkv, 1), p.part(p.qkv, 2), o, lse, p.u, p.part(dqkv, 0),
                  p.part(dqkv, 1), p.part(dqkv, 2), p.opts);
    ASSERT_TRUE(test::all_finite(to_doubles(dqkv))) << name(c);
    auto loss = [&] { return p.loss(); };
    // Step 1e-5: q and k of token 0 have exactly zero gradient, where rounding noise of a smaller
    // step would exceed check_grad's 1e-6 relative floor.
    const double err = test::check_grad(loss, p.qkv->data<double>(), dqkv->data<double>(),
                                        static_cast<size_t>(dqkv->numel()), 128, 7, 1e-5);
    EXPECT_LT(err, 1e-6) << name(c);
  }
}

// AttentionOpts::accumulate_dv: dv is what was there plus the gradient the plain backward writes;
// dq and dk are unchanged (grouped-query attention, so dv's rows sum over a group).
TEST(AttentionCpu, AccumulateDvAddsToDv) {
  const int64_t B = 2, T = 37, H = 4, Hk = 2, D = 8;
  OwnedTensor q = test::random_tensor({B, T, H, D}, DType::F64, 41),
              k = test::random_tensor({B, T, Hk, D}, DType::F64, 42);
  OwnedTensor v = test::random_tensor({B, T, Hk, D}, DType::F64, 43),
              dout = test::random_tensor({B, T, H, D}, DType::F64, 44);
  OwnedTensor o(DType::F64, Device::CPU, {B, T, H, D}), lse(DType::F64, Device::CPU, {B, H, T});
  AttentionOpts opts;
  opts.window = 5;
  attention_fwd(Ctx{}, q, k, v, o, lse, opts);
  OwnedTensor dq(DType::F64, Device::CPU, {B, T, H, D}), dk(DType::F64, Device::CPU, {B, T, Hk, D});
  OwnedTensor dv(DType::F64, Device::CPU, {B, T, Hk, D});
  attention_bwd(Ctx{}, q, k, v, o, lse, dout, dq, dk, dv, opts);
  OwnedTensor dq2(DType::F64, Device::CPU, {B, T, H, D}), dk2(DType::F64, Device::CPU, {B, T, Hk, D});
  OwnedTensor dv2 = test::random_tensor({B, T, Hk, D}, DType::F64, 45);
  const std::vector<double> before = to_doubles(dv2);
  opts.accumulate_dv = true;
  attention_bwd(Ctx{}, q, k, v, o, lse, dout, dq2, dk2, dv2, opts);
  EXPECT_EQ(to_doubles(dq2), to_doubles(dq));
  EXPECT_EQ(to_doubles(dk2), to_doubles(dk));
  const std::vector<double> plain = to_doubles(dv), added = to_doubles(dv2);
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(added[i], before[i] + plain[i], 1e-12) << i;
}

// With AttentionOpts::rope the backward returns the gradient for q and k before their
// rotation: loss(q, k, v) = sum(attention(rope(q), rope(k), v) * u), by finite differences.
TEST(AttentionCpu, GradCheckThroughRopeDouble) {
  for (const Case& c : {Case{13, 8, true, 0}, Case{37, 64, true, 5}, Case{13, 8, false, 0}}) {
    AttentionProblem p(c);
    p.opts.rope = 50.0;  // angles of several turns within the sequence
    const int64_t B = p.B, H = p.H, T = c.T, D = c.D;
    OwnedTensor rot(DType::F64, Device::CPU, {B, T, 3, H, D});
    OwnedTensor o(DType::F64, Device::CPU, {B, T, H, D}), lse(DType::F64, Device::CPU, {B, H, T});
    auto forward = [&] {
      copy_tensor(rot, p.qkv);
      rope_fwd(Ctx{}, p.part(rot, 0), p.opts.rope, 0);
      rope_fwd(Ctx{}, p.part(rot, 1), p.opts.rope, 0);
      attention_fwd(Ctx{}, p.part(rot, 0), p.part(rot, 1), p.part(rot, 2), o, lse, p.opts);
    };
    forward();
    OwnedTensor dqkv(DType::F64, Device::CPU, {B, T, 3, H, D});
    test::poison(dqkv);
    attention_bwd(Ctx{}, p.part(rot, 0), p.part(rot, 1), p.part(rot, 2), o, lse, p.u, p.part(dqkv, 0), p.part(dqkv, 1),
                  p.part(dqkv, 2), p.opts);
    ASSERT_TRUE(test::all_finite(to_doubles(dqkv))) << name(c);
    auto loss = [&] {
      forward();
      double l = 0;
      for (int64_t i = 0; i < o->numel(); ++i) l += o->data<double>()[i] * p.u->data<double>()[i];
      return l;
    };
    const double err = test::check_grad(loss, p.qkv->data<double>(), dqkv->data<double>(),
                                        static_cast<size_t>(dqkv->numel()), 128, 7, 1e-5);
    EXPECT_LT(err, 1e-6) << name(c);
  }
}

TEST(AttentionCpu, WindowCoveringEverythingIsCausal) {
  AttentionProblem causal(Case{17, 8, true, 0}), windowed(Case{17, 8, true, 17});
  OwnedTensor o1(DType::F64, Device::CPU, {2, 17, 2, 8}), l1(DType::F64, Device::CPU, {2, 2, 17});
  OwnedTensor o2(DType::F64, Device::CPU, {2, 17, 2, 8}), l2(DType::F64, Device::CPU, {2, 2, 17});
  causal.forward(o1, l1);
  windowed.forward(o2, l2);
  EXPECT_EQ(test::max_abs_diff(to_doubles(o1), to_doubles(o2)), 0.0);
  EXPECT_EQ(test::max_abs_diff(to_doubles(l1), to_doubles(l2)), 0.0);
}

TEST(AttentionCpu, RejectsWindowWithoutCausal) {
  AttentionProblem p(Case{5, 8, false, 3});
  OwnedTensor o(DType::F64, Device::CPU, {2, 5, 2, 8}), lse(DType::F64, Device::CPU, {2, 2, 5});
  EXPECT_THROW(p.forward(o, lse), Error);
}

}  // namespace
}  // namespace linac::test_attention
