// Attention decode on the CPU against the attention forward on the whole sequence: every row of a
// causal forward (a full cache read up to n_valid = t + 1, the unread slots NaN), and every row of
// a sliding-window forward replayed through a ring buffer of `window` slots written with
// attention_cache_write (positions past the window wrap around), in f64 and f32; the cache write of
// several tokens at once.
#include <cmath>
#include <limits>

#include "attention/attention.h"
#include "attention/attention_decode.h"
#include "test_util.h"

namespace linac::test_attention_decode {
namespace {

struct Seq {
  int64_t B, T, H, D;
  DType dt;
  OwnedTensor q, k, v;
  Seq(int64_t b, int64_t t, int64_t h, int64_t d, DType d_t)
      : B(b),
        T(t),
        H(h),
        D(d),
        dt(d_t),
        q(test::random_tensor({b, t, h, d}, d_t, 1, -2, 2)),
        k(test::random_tensor({b, t, h, d}, d_t, 2, -2, 2)),
        v(test::random_tensor({b, t, h, d}, d_t, 3)) {}
  // Rows of the forward: o [B, T, H, D].
  OwnedTensor forward(int64_t window) const {
    OwnedTensor o(dt, Device::CPU, {B, T, H, D}), lse(dt, Device::CPU, {B, H, T});
    AttentionOpts opts;
    opts.window = window;
    attention_fwd(Ctx{}, q, k, v, o, lse, opts);
    return o;
  }
};

// [B, H, D] values of token t of a [B, T, H, D] tensor.
std::vector<double> row(const Tensor& x, int64_t t) {
  const std::vector<double> all = to_doubles(x);
  const int64_t T = x.size(1), HD = x.size(2) * x.size(3);
  std::vector<double> out;
  for (int64_t b = 0; b < x.size(0); ++b)
    out.insert(out.end(), all.begin() + (b * T + t) * HD, all.begin() + (b * T + t + 1) * HD);
  return out;
}

void check_causal(DType dt, double tol) {
  const Seq s(2, 37, 3, 24, dt);
  const OwnedTensor o = s.forward(0);
  // A cache with room past T: the extra slots are NaN and must never be read.
  const int64_t S = s.T + 5;
  OwnedTensor kc(dt, Device::CPU, {s.B, S, s.H, s.D}), vc(dt, Device::CPU, {s.B, S, s.H, s.D});
  test::poison(kc);
  test::poison(vc);
  for (int64_t t = 0; t < s.T; ++t) attention_cache_write(Ctx{}, s.k->select(1, t), s.v->select(1, t), kc, vc, t);
  OwnedTensor ot(dt, Device::CPU, {s.B, s.H, s.D});
  for (int64_t t = 0; t < s.T; ++t) {
    test::poison(ot);
    attention_decode(Ctx{}, s.q->select(1, t), kc, vc, t + 1, ot);
    EXPECT_LT(test::rel_error(to_doubles(ot), row(o, t)), tol) << "t=" << t;
  }
}

TEST(AttentionDecode, CausalRowsF64) { check_causal(DType::F64, 1e-13); }
TEST(AttentionDecode, CausalRowsF32) { check_causal(DType::F32, 1e-5); }

void check_ring_buffer(DType dt, double tol) {
  const int64_t window = 8;
  const Seq s(2, 29, 2, 16, dt);
  const OwnedTensor o = s.forward(window);
  OwnedTensor kc(dt, Device::CPU, {s.B, window, s.H, s.D}), vc(dt, Device::CPU, {s.B, window, s.H, s.D});
  test::poison(kc);
  test::poison(vc);
  OwnedTensor ot(dt, Device::CPU, {s.B, s.H, s.D});
  for (int64_t pos = 0; pos < s.T; ++pos) {
    attention_cache_write(Ctx{}, s.k->select(1, pos), s.v->select(1, pos), kc, vc, pos % window);
    test::poison(ot);
    attention_decode(Ctx{}, s.q->select(1, pos), kc, vc, std::min(pos + 1, window), ot);
    EXPECT_LT(test::rel_error(to_doubles(ot), row(o, pos)), tol) << "pos=" << pos;
  }
}

TEST(AttentionDecode, RingBufferMatchesWindowedRowsF64) { check_ring_buffer(DType::F64, 1e-13); }
TEST(AttentionDecode, RingBufferMatchesWindowedRowsF32) { check_ring_buffer(DType::F32, 1e-5); }

// A prompt's keys and values in one call: token i of the run in slot (slot + i) mod S, read from
// strided views of a fused per-token buffer; runs that fit, that wrap around the ring's end, of one
// token and of a whole ring; the other slots keep what they held.
TEST(AttentionCacheWrite, TokensInOneCallGoWhereTheirSlotsAre) {
  const int64_t B = 3, T = 13, H = 2, D = 5, S = 7;
  const OwnedTensor qkv = test::random_tensor({B, T, 3, H, D}, DType::F32, 4);
  const Tensor k = qkv->select(2, 1), v = qkv->select(2, 2);  // [B, T, H, D], token stride 3 H D
  const std::vector<double> src = to_doubles(qkv);
  struct Run {
    int64_t first, n, slot;
  };
  for (const Run r : {Run{0, 4, 0}, Run{4, 7, 3}, Run{11, 2, 6}, Run{2, 1, 6}, Run{6, 7, 0}, Run{5, 5, 4}}) {
    SCOPED_TRACE("first " + std::to_string(r.first) + ", n " + std::to_string(r.n) + ", slot " +
                 std::to_string(r.slot));
    OwnedTensor kc = test::random_tensor({B, S, H, D}, DType::F32, 5),
                vc = test::random_tensor({B, S, H, D}, DType::F32, 6);
    std::vector<double> want_k = to_doubles(kc), want_v = to_doubles(vc);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < r.n; ++i)
        for (int64_t e = 0; e < H * D; ++e) {
          const int64_t to = (b * S + (r.slot + i) % S) * H * D + e, from = ((b * T + r.first + i) * 3 + 1) * H * D + e;
          want_k[static_cast<size_t>(to)] = src[static_cast<size_t>(from)];
          want_v[static_cast<size_t>(to)] = src[static_cast<size_t>(from + H * D)];
        }
    attention_cache_write(Ctx{}, k.narrow(1, r.first, r.n), v.narrow(1, r.first, r.n), kc, vc, r.slot);
    EXPECT_EQ(to_doubles(kc), want_k);
    EXPECT_EQ(to_doubles(vc), want_v);
  }
  OwnedTensor kc(DType::F32, Device::CPU, {B, S, H, D}), vc(DType::F32, Device::CPU, {B, S, H, D});
  EXPECT_ANY_THROW(attention_cache_write(Ctx{}, k.narrow(1, 0, S + 1), v.narrow(1, 0, S + 1), kc, vc, 0));
  EXPECT_ANY_THROW(attention_cache_write(Ctx{}, k.narrow(1, 0, 2), v.narrow(1, 0, 3), kc, vc, 0));
  const OwnedTensor v64 = test::random_tensor({B, 2, H, D}, DType::F64, 7);
  EXPECT_ANY_THROW(attention_cache_write(Ctx{}, k.narrow(1, 0, 2), v64, kc, vc, 0));
  Tensor same_token = k.narrow(1, 0, 2);
  same_token.strides[1] = 0;
  EXPECT_ANY_THROW(attention_cache_write(Ctx{}, same_token, same_token, kc, vc, 0));
}

TEST(AttentionDecode, ExplicitScale) {
  const Seq s(1, 5, 2, 8, DType::F64);
  OwnedTensor kc = test::random_tensor({1, 5, 2, 8}, DType::F64, 9),
              vc = test::random_tensor({1, 5, 2, 8}, DType::F64, 10);
  OwnedTensor o1(DType::F64, Device::CPU, {1, 2, 8}), o2(DType::F64, Device::CPU, {1, 2, 8});
  // Scaling q by c equals scaling the scores by c.
  OwnedTensor q2(DType::F64, Device::CPU, {1, 2, 8});
  const Tensor q1 = s.q->select(1, 4);
  for (int64_t i = 0; i < 16; ++i) q2->data<double>()[i] = 0.7 * q1.data<double>()[i];
  attention_decode(Ctx{}, q1, kc, vc, 5, o1, static_cast<float>(0.7 / std::sqrt(8.0)));
  attention_decode(Ctx{}, q2, kc, vc, 5, o2);
  EXPECT_LT(test::rel_error(to_doubles(o1), to_doubles(o2)), 1e-7);
}

TEST(AttentionDecode, RejectsBadArguments) {
  const Seq s(1, 4, 2, 8, DType::F64);
  OwnedTensor ot(DType::F64, Device::CPU, {1, 2, 8});
  const Tensor q = s.q->select(1, 0);
  EXPECT_ANY_THROW(attention_decode(Ctx{}, q, s.k, s.v, 0, ot));
  EXPECT_ANY_THROW(attention_decode(Ctx{}, q, s.k, s.v, 5, ot));
  EXPECT_ANY_THROW(attention_cache_write(Ctx{}, q, q, s.k, s.v, 4));
  OwnedTensor wrong(DType::F64, Device::CPU, {1, 4, 3, 8});
  EXPECT_ANY_THROW(attention_decode(Ctx{}, q, wrong, s.v, 2, ot));
}

}  // namespace
}  // namespace linac::test_attention_decode
