// attention_decode_step on the CPU against the attention forward over whole sequences: the rows of
// one call at different positions (each row's cache holds the rotated keys and the values of its
// earlier positions, every other slot NaN), RoPE at each row's position (plain and Llama 3
// scaled) or none, the new key and value written to the row's slot, full attention and a sliding
// window's ring buffer, grouped-query heads, f64 and f32; then the arguments it refuses.
#include <cmath>
#include <limits>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "rope/rope.h"
#include "test_util.h"

namespace linac::test_attention_decode_step {
namespace {

struct StepCase {
  int64_t B, T, H, Hk, D, window;
  RopeFreqs rope;
  std::vector<int32_t> pos;  // per row: the token it decodes (< T)
};

// [H*D] values of x[b, t] (x [B, T, H, D] as doubles).
std::vector<double> token(const std::vector<double>& x, int64_t T, int64_t HD, int64_t b, int64_t t) {
  const auto first = x.begin() + (b * T + t) * HD;
  return {first, first + HD};
}

void check_step(const StepCase& c, DType dt, double tol) {
  const int64_t B = c.B, T = c.T, HD = c.H * c.D, KD = c.Hk * c.D;
  const OwnedTensor q = test::random_tensor({B, T, c.H, c.D}, dt, 11, -2, 2);
  const OwnedTensor k = test::random_tensor({B, T, c.Hk, c.D}, dt, 12, -2, 2);
  const OwnedTensor v = test::random_tensor({B, T, c.Hk, c.D}, dt, 13);
  // The reference: q and k rotated at their positions over whole sequences, then the forward.
  OwnedTensor qr = to(q, Device::CPU, dt), kr = to(k, Device::CPU, dt);
  if (c.rope.defined()) {
    rope_fwd(Ctx{}, qr, c.rope, 0);
    rope_fwd(Ctx{}, kr, c.rope, 0);
  }
  OwnedTensor o(dt, Device::CPU, {B, T, c.H, c.D}), lse(dt, Device::CPU, {B, c.H, T});
  AttentionOpts opts;
  opts.window = c.window;
  attention_fwd(Ctx{}, qr, kr, v, o, lse, opts);
  const std::vector<double> qd = to_doubles(q), kd = to_doubles(k), vd = to_doubles(v), krd = to_doubles(kr),
                            qrd = to_doubles(qr), od = to_doubles(o);

  // Row b's cache: the rotated keys and the values of positions before pos[b] (the last `window`
  // of them in ring slots for a window), NaN elsewhere.
  const int64_t S = c.window > 0 ? c.window : T + 3;
  std::vector<double> kc(static_cast<size_t>(B * S * KD), std::numeric_limits<double>::quiet_NaN()), vc = kc;
  std::vector<double> qt, kt, vt;
  OwnedTensor pos(DType::I32, Device::CPU, {B});
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = c.pos[static_cast<size_t>(b)];
    pos->data<int32_t>()[b] = static_cast<int32_t>(p);
    for (int64_t t = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0; t < p; ++t) {
      const int64_t slot = c.window > 0 ? t % c.window : t;
      const std::vector<double> kt_r = token(krd, T, KD, b, t), vt_r = token(vd, T, KD, b, t);
      std::copy(kt_r.begin(), kt_r.end(), kc.begin() + (b * S + slot) * KD);
      std::copy(vt_r.begin(), vt_r.end(), vc.begin() + (b * S + slot) * KD);
    }
    for (auto [src, dst, n] : {std::tuple{&qd, &qt, HD}, {&kd, &kt, KD}, {&vd, &vt, KD}}) {
      const std::vector<double> r = token(*src, T, n, b, p);
      dst->insert(dst->end(), r.begin(), r.end());
    }
  }
  auto tensor_of = [&](const std::vector<double>& x, std::vector<int64_t> dims) {
    OwnedTensor t64(DType::F64, Device::CPU, dims);
    std::copy(x.begin(), x.end(), t64->data<double>());
    return to(t64, Device::CPU, dt);
  };
  OwnedTensor q_t = tensor_of(qt, {B, c.H, c.D}), k_t = tensor_of(kt, {B, c.Hk, c.D}), v_t = tensor_of(vt, {B, c.Hk, c.D});
  OwnedTensor k_cache = tensor_of(kc, {B, S, c.Hk, c.D}), v_cache = tensor_of(vc, {B, S, c.Hk, c.D});
  OwnedTensor o_t(dt, Device::CPU, {B, c.H, c.D});
  test::poison(o_t);
  attention_decode_step(Ctx{}, q_t, k_t, v_t, pos, k_cache, v_cache, c.rope, c.window, o_t);

  const std::vector<double> got_o = to_doubles(o_t), got_q = to_doubles(q_t), got_kc = to_doubles(k_cache),
                            got_vc = to_doubles(v_cache);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = c.pos[static_cast<size_t>(b)], slot = c.window > 0 ? p % c.window : p;
    SCOPED_TRACE("row " + std::to_string(b) + " at position " + std::to_string(p));
    const std::vector<double> want_o = token(od, T, HD, b, p);
    EXPECT_LT(test::rel_error({got_o.begin() + b * HD, got_o.begin() + (b + 1) * HD}, want_o), tol);
    // q rotated in place; the rotated key and the value in the row's slot.
    EXPECT_LT(test::rel_error({got_q.begin() + b * HD, got_q.begin() + (b + 1) * HD}, token(qrd, T, HD, b, p)), tol);
    const auto kslot = got_kc.begin() + (b * S + slot) * KD, vslot = got_vc.begin() + (b * S + slot) * KD;
    EXPECT_LT(test::rel_error({kslot, kslot + KD}, token(krd, T, KD, b, p)), tol);
    EXPECT_EQ(std::vector<double>(vslot, vslot + KD), token(vd, T, KD, b, p));
  }
}

RopeFreqs llama3_scaled() {
  RopeFreqs f(500000.0);
  f.factor = 8, f.original_context = 16;  // a short original context: every regime of the blend
  return f;
}

const StepCase kCases[] = {
    {4, 41, 4, 4, 16, 0, RopeFreqs(10000.0), {0, 40, 17, 5}},
    {3, 70, 4, 2, 8, 0, llama3_scaled(), {69, 1, 33}},
    {3, 37, 6, 3, 12, 0, RopeFreqs(), {36, 0, 20}},
    {4, 29, 2, 1, 16, 8, RopeFreqs(10000.0), {0, 7, 8, 28}},
    {2, 45, 4, 2, 10, 13, RopeFreqs(10000.0), {44, 12}},
};

TEST(AttentionDecodeStep, RowsAtTheirOwnPositionsF64) {
  for (const StepCase& c : kCases) check_step(c, DType::F64, 1e-12);
}

TEST(AttentionDecodeStep, RowsAtTheirOwnPositionsF32) {
  for (const StepCase& c : kCases) check_step(c, DType::F32, 2e-5);
}

TEST(AttentionDecodeStep, RejectsBadArguments) {
  const Ctx cpu;
  OwnedTensor q = test::random_tensor({2, 4, 8}, DType::F64, 1), k = test::random_tensor({2, 2, 8}, DType::F64, 2);
  OwnedTensor v = test::random_tensor({2, 2, 8}, DType::F64, 3), o(DType::F64, Device::CPU, {2, 4, 8});
  OwnedTensor kc(DType::F64, Device::CPU, {2, 5, 2, 8}), vc(DType::F64, Device::CPU, {2, 5, 2, 8});
  OwnedTensor pos(DType::I32, Device::CPU, {2});
  pos->data<int32_t>()[0] = 4, pos->data<int32_t>()[1] = 5;  // row 1 is past the cache's 5 slots
  EXPECT_THROW(attention_decode_step(cpu, q, k, v, pos, kc, vc, RopeFreqs(), 0, o), Error);
  pos->data<int32_t>()[1] = -1;
  EXPECT_THROW(attention_decode_step(cpu, q, k, v, pos, kc, vc, RopeFreqs(), 0, o), Error);
  pos->data<int32_t>()[1] = 0;
  EXPECT_THROW(attention_decode_step(cpu, q, k, v, pos, kc, vc, RopeFreqs(), 3, o), Error);  // ring of 5 != 3
  OwnedTensor pos64(DType::F64, Device::CPU, {2});
  EXPECT_THROW(attention_decode_step(cpu, q, k, v, pos64, kc, vc, RopeFreqs(), 0, o), Error);
  OwnedTensor k3 = test::random_tensor({2, 3, 8}, DType::F64, 4);  // 3 heads do not divide 4
  EXPECT_THROW(attention_decode_step(cpu, q, k3, k3, pos, kc, vc, RopeFreqs(), 0, o), Error);
  attention_decode_step(cpu, q, k, v, pos, kc, vc, RopeFreqs(), 0, o);  // and the good call runs
}

}  // namespace
}  // namespace linac::test_attention_decode_step
