// Attention decode, CUDA vs the CPU reference (double) on the same rounded inputs, f32 and bf16:
// cache sizes 1, 16, 64, 1000 with n_valid < S (the slots past n_valid hold NaN), head dims 64 and
// 128 plus D = 32, 96, 112 and 256 (groups of lanes that do not fill a warp, or a whole warp per
// key), one and several slot blocks; q as a strided view; grouped-query and multi-query caches
// (Hk < H); bitwise reruns; the GPU cache write, of one token and of a prompt's tokens at once. The decoding step
// (attention_decode_step): rows of one call at their own positions around the slot blocks' edges (0, 63, 64, 999 of a
// 1000-slot cache), a window's ring past its size, RoPE or none, GQA, q/k/v as the strided column
// blocks of a qkv row; against the CPU step on the same rounded inputs (output, the new slot of
// each cache), qkv untouched, the block counters left zero, and bitwise reruns; a row's step
// bitwise the same in a batch of 64 as alone (the large and small grids' kernel variants).
#include <limits>

#include "attention/attention_decode.h"
#include "test_util.h"

namespace linac::test_attention_decode_gpu {
namespace {

struct Case {
  int64_t B, H, D, S, n_valid;
  int64_t Hk = 0;  // key/value heads of the caches, dividing H; 0: H
  int64_t kv_heads() const { return Hk > 0 ? Hk : H; }
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hk=" + std::to_string(c.kv_heads()) +
         " D=" + std::to_string(c.D) + " S=" + std::to_string(c.S) + " n_valid=" + std::to_string(c.n_valid);
}

const Case kCases[] = {
    {3, 2, 64, 1, 1},       {2, 4, 64, 16, 11},       {2, 3, 128, 16, 16},    {3, 2, 128, 64, 50},
    {2, 3, 64, 1000, 999},  {1, 2, 128, 1000, 700},   {2, 2, 32, 64, 63},     {1, 3, 96, 200, 130},
    {2, 2, 256, 1000, 257}, {1, 1, 128, 64, 1},       {3, 2, 96, 16, 16},     {2, 3, 112, 1000, 777},
    {1, 2, 112, 64, 64},    {2, 6, 64, 1000, 999, 2}, {3, 4, 128, 64, 50, 1}, {2, 6, 96, 200, 130, 3}};

// The first n_valid slots random, the others NaN (a kernel that reads them fails).
OwnedTensor make_cache(const Case& c, uint64_t seed) {
  const int64_t slot = c.kv_heads() * c.D;
  OwnedTensor x = test::random_tensor({c.B, c.S, c.kv_heads(), c.D}, DType::F64, seed, -2, 2);
  double* p = x->data<double>();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = c.n_valid * slot; i < c.S * slot; ++i)
      p[b * c.S * slot + i] = std::numeric_limits<double>::quiet_NaN();
  return x;
}

// q as the middle third of a [B, 3, H, D] buffer: batch stride 3*H*D.
Tensor q_view(const Tensor& buf) { return buf.select(1, 1); }

void run_parity(DType dt, double tol) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    OwnedTensor qbuf = test::random_tensor({c.B, 3, c.H, c.D}, DType::F64, 1, -2, 2);
    OwnedTensor kc = make_cache(c, 2), vc = make_cache(c, 3);
    OwnedTensor qbuf_g = to(qbuf, Device::CUDA, dt), kc_g = to(kc, Device::CUDA, dt), vc_g = to(vc, Device::CUDA, dt);
    OwnedTensor o_g(dt, Device::CUDA, {c.B, c.H, c.D});
    test::poison(o_g);
    attention_decode(gctx.ctx(), q_view(qbuf_g), kc_g, vc_g, c.n_valid, o_g);
    ctx_synchronize(gctx.ctx());

    OwnedTensor qbuf_r = to(qbuf_g, Device::CPU, DType::F64), kc_r = to(kc_g, Device::CPU, DType::F64),
                vc_r = to(vc_g, Device::CPU, DType::F64);
    OwnedTensor o_r(DType::F64, Device::CPU, {c.B, c.H, c.D});
    attention_decode(Ctx{}, q_view(qbuf_r), kc_r, vc_r, c.n_valid, o_r);
    EXPECT_LT(test::rel_error(o_g, o_r), tol);

    OwnedTensor o_g2(dt, Device::CUDA, {c.B, c.H, c.D});
    attention_decode(gctx.ctx(), q_view(qbuf_g), kc_g, vc_g, c.n_valid, o_g2);
    ctx_synchronize(gctx.ctx());
    EXPECT_EQ(to_doubles(o_g), to_doubles(o_g2)) << "not bitwise reproducible";
  }
}

TEST(AttentionDecodeGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 1e-5);
}

TEST(AttentionDecodeGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2);
}

TEST(AttentionDecodeGpu, CacheWrite) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (const int64_t D : {64, 96, 112}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const int64_t B = 3, S = 7, H = 2, slot = 5;
    OwnedTensor kc = test::random_tensor({B, S, H, D}, DType::F32, 1),
                vc = test::random_tensor({B, S, H, D}, DType::F32, 2);
    OwnedTensor kv = test::random_tensor({B, 2, H, D}, DType::F32, 3);  // k_t | v_t, batch stride 2*H*D
    OwnedTensor kc_g = to(kc, Device::CUDA, DType::BF16), vc_g = to(vc, Device::CUDA, DType::BF16);
    OwnedTensor kv_g = to(kv, Device::CUDA, DType::BF16);
    attention_cache_write(gctx.ctx(), kv_g->select(1, 0), kv_g->select(1, 1), kc_g, vc_g, slot);
    ctx_synchronize(gctx.ctx());
    // The same write on the CPU, on the same rounded values.
    OwnedTensor kc_r = to(kc_g, Device::CPU, DType::F32), vc_r = to(vc_g, Device::CPU, DType::F32);
    OwnedTensor kv_r = to(kv_g, Device::CPU, DType::F32);
    OwnedTensor kc_e = to(to(kc, Device::CPU, DType::BF16), Device::CPU, DType::F32);
    OwnedTensor vc_e = to(to(vc, Device::CPU, DType::BF16), Device::CPU, DType::F32);
    attention_cache_write(Ctx{}, kv_r->select(1, 0), kv_r->select(1, 1), kc_e, vc_e, slot);
    EXPECT_EQ(to_doubles(kc_r), to_doubles(kc_e));
    EXPECT_EQ(to_doubles(vc_r), to_doubles(vc_e));
  }
}

// A prompt's tokens in one call on the GPU against the CPU's write, bitwise: runs shorter than the
// batch (copied token by token) and longer (sequence by sequence), fitting or wrapping around the
// ring, from strided views of a fused [B, T, 3, H, D] buffer.
TEST(AttentionDecodeGpu, CacheWriteOfSeveralTokens) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t B = 3, T = 40, H = 2, D = 96, S = 16;
  struct Run {
    int64_t first, n, slot;
  };
  const OwnedTensor qkv_g = to(test::random_tensor({B, T, 3, H, D}, DType::F32, 7), Device::CUDA, DType::BF16);
  const OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::BF16);
  for (const Run r : {Run{0, 2, 15}, Run{5, 3, 4}, Run{10, 16, 0}, Run{24, 16, 9}, Run{30, 9, 12}, Run{39, 1, 3}}) {
    SCOPED_TRACE("first " + std::to_string(r.first) + ", n " + std::to_string(r.n) + ", slot " +
                 std::to_string(r.slot));
    OwnedTensor kc_g = to(test::random_tensor({B, S, H, D}, DType::F32, 8), Device::CUDA, DType::BF16);
    OwnedTensor vc_g = to(test::random_tensor({B, S, H, D}, DType::F32, 9), Device::CUDA, DType::BF16);
    OwnedTensor kc_r = to(kc_g, Device::CPU, DType::BF16), vc_r = to(vc_g, Device::CPU, DType::BF16);
    auto run = [&](const Tensor& qkv) { return qkv.narrow(1, r.first, r.n); };
    attention_cache_write(gctx.ctx(), run(qkv_g).select(2, 1), run(qkv_g).select(2, 2), kc_g, vc_g, r.slot);
    ctx_synchronize(gctx.ctx());
    attention_cache_write(Ctx{}, run(qkv_r).select(2, 1), run(qkv_r).select(2, 2), kc_r, vc_r, r.slot);
    EXPECT_EQ(to_doubles(kc_g), to_doubles(kc_r));
    EXPECT_EQ(to_doubles(vc_g), to_doubles(vc_r));
  }
}

struct StepCase {
  int64_t B, H, Hk, D, S, window;
  bool rope;
  std::vector<int32_t> pos;
};

// The last case's grid (rows x heads x blocks of slots) is past 8 CTAs per SM on an H200, so it
// takes the kernel variant with one round of loads in flight; the others keep several.
const StepCase kStepCases[] = {
    {4, 4, 4, 64, 1000, 0, true, {0, 63, 64, 999}}, {3, 6, 2, 128, 200, 0, true, {130, 1, 199}},
    {2, 4, 1, 96, 70, 0, false, {69, 5}},           {3, 2, 2, 64, 100, 100, true, {250, 99, 0}},
    {2, 8, 2, 64, 64, 64, true, {64, 1000}},        {6, 12, 4, 64, 1200, 0, true, {1199, 700, 0, 64, 1000, 333}},
};

void run_step_parity(DType dt, double tol) {
  GpuContext gctx;
  const RopeFreqs freqs(10000.0);
  for (const StepCase& c : kStepCases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hk=" + std::to_string(c.Hk) +
                 " D=" + std::to_string(c.D) + " S=" + std::to_string(c.S) + " window=" + std::to_string(c.window));
    const int64_t P = c.H + 2 * c.Hk, KD = c.Hk * c.D;
    // Inputs rounded to dt once, so the GPU and the CPU (f64) start from the same values.
    auto rounded = [&](OwnedTensor x) { return to(to(x, Device::CPU, dt), Device::CPU, DType::F64); };
    OwnedTensor qkv = rounded(test::random_tensor({c.B, P, c.D}, DType::F64, 21, -2, 2));
    OwnedTensor kc = rounded(test::random_tensor({c.B, c.S, c.Hk, c.D}, DType::F64, 22, -2, 2));
    OwnedTensor vc = rounded(test::random_tensor({c.B, c.S, c.Hk, c.D}, DType::F64, 23));
    OwnedTensor pos(DType::I32, Device::CPU, {c.B});
    for (int64_t b = 0; b < c.B; ++b) {
      const int32_t p = c.pos[static_cast<size_t>(b)];
      pos->data<int32_t>()[b] = p;
      // Slots a row must not read hold NaN: past its position (full attention, or a ring not yet full).
      if (c.window == 0 || p + 1 < c.window)
        for (int64_t i = (p + 1) * KD; i < c.S * KD; ++i) {
          kc->data<double>()[b * c.S * KD + i] = std::numeric_limits<double>::quiet_NaN();
          vc->data<double>()[b * c.S * KD + i] = std::numeric_limits<double>::quiet_NaN();
        }
    }
    auto views = [&](const Tensor& buf) {
      return std::tuple{buf.narrow(1, 0, c.H), buf.narrow(1, c.H, c.Hk), buf.narrow(1, c.H + c.Hk, c.Hk)};
    };
    auto run_gpu = [&] {
      OwnedTensor qkv_g = to(qkv, Device::CUDA, dt), kc_g = to(kc, Device::CUDA, dt), vc_g = to(vc, Device::CUDA, dt);
      OwnedTensor pos_g = to(pos, Device::CUDA, DType::I32), o_g(dt, Device::CUDA, {c.B, c.H, c.D});
      OwnedTensor done(DType::I32, Device::CUDA, {c.B, c.H});
      zero_tensor(done);
      test::poison(o_g);
      const auto [q, k, v] = views(qkv_g);
      attention_decode_step(gctx.ctx(), q, k, v, pos_g, kc_g, vc_g, c.rope ? freqs : RopeFreqs(), c.window, o_g, done);
      ctx_synchronize(gctx.ctx());
      EXPECT_EQ(to_doubles(pos_g), to_doubles(pos)) << "the positions are the caller's to advance";
      EXPECT_EQ(to_doubles(done), std::vector<double>(static_cast<size_t>(c.B * c.H), 0.0)) << "counters left zero";
      return std::tuple{to(o_g, Device::CPU, DType::F64), to(qkv_g, Device::CPU, DType::F64),
                        to(kc_g, Device::CPU, DType::F64), to(vc_g, Device::CPU, DType::F64)};
    };
    const auto [o_g, qkv_g, kc_g, vc_g] = run_gpu();
    // The CPU step on copies: the inputs stay for the rerun.
    OwnedTensor qkv_r = to(qkv, Device::CPU, DType::F64), kc_r = to(kc, Device::CPU, DType::F64),
                vc_r = to(vc, Device::CPU, DType::F64), o_r(DType::F64, Device::CPU, {c.B, c.H, c.D});
    const auto [q, k, v] = views(qkv_r);
    attention_decode_step(Ctx{}, q, k, v, pos, kc_r, vc_r, c.rope ? freqs : RopeFreqs(), c.window, o_r);
    EXPECT_LT(test::rel_error(o_g, o_r), tol);
    EXPECT_EQ(to_doubles(qkv_g), to_doubles(qkv)) << "the GPU rotates q and k in shared memory, not in place";
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t p = c.pos[static_cast<size_t>(b)], slot = c.window > 0 ? p % c.window : p;
      const std::vector<double> kg = to_doubles(kc_g->narrow(0, b, 1).narrow(1, slot, 1));
      const std::vector<double> kr = to_doubles(kc_r->narrow(0, b, 1).narrow(1, slot, 1));
      EXPECT_LT(test::rel_error(kg, kr), tol) << "row " << b << ": the rotated key in slot " << slot;
      EXPECT_EQ(to_doubles(vc_g->narrow(0, b, 1).narrow(1, slot, 1)),
                to_doubles(vc_r->narrow(0, b, 1).narrow(1, slot, 1)))
          << "row " << b << ": the value in slot " << slot;
    }
    const auto [o_g2, qkv_g2, kc_g2, vc_g2] = run_gpu();
    EXPECT_EQ(to_doubles(o_g), to_doubles(o_g2)) << "not bitwise reproducible";
  }
}

TEST(AttentionDecodeGpu, StepParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_step_parity(DType::F32, 1e-5);
}

TEST(AttentionDecodeGpu, StepParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_step_parity(DType::BF16, 1e-2);
}

// The step's kernel variants (several rounds of cached rows in flight per lane for small grids,
// one round for large ones) do the same arithmetic: a row's output and cache are bitwise the same
// whether it runs in a batch of 64 or alone.
TEST(AttentionDecodeGpu, StepVariantsAgreeBitwise) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const RopeFreqs freqs(10000.0);
  const int64_t B = 64, H = 12, S = 1100;
  for (const auto& [dt, D, Hk] : {std::tuple{DType::BF16, 64, 12}, std::tuple{DType::BF16, 128, 4},
                                  std::tuple{DType::F32, 64, 12}, std::tuple{DType::F32, 128, 6}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D) + " Hk=" + std::to_string(Hk));
    const int64_t P = H + 2 * Hk;
    OwnedTensor qkv = to(test::random_tensor({B, P, D}, DType::F32, 31, -2, 2), Device::CUDA, dt);
    OwnedTensor kc = to(test::random_tensor({B, S, Hk, D}, DType::F32, 32, -2, 2), Device::CUDA, dt);
    OwnedTensor vc = to(test::random_tensor({B, S, Hk, D}, DType::F32, 33), Device::CUDA, dt);
    OwnedTensor pos(DType::I32, Device::CPU, {B});
    for (int64_t b = 0; b < B; ++b) pos->data<int32_t>()[b] = static_cast<int32_t>((b * 397 + 11) % S);
    // Rows b0 .. b0 + n - 1 of everything, run as a batch of n: the output and both caches.
    auto run = [&](int64_t b0, int64_t n) {
      OwnedTensor q_n = to(qkv->narrow(0, b0, n), Device::CUDA, dt), kc_n = to(kc->narrow(0, b0, n), Device::CUDA, dt),
                  vc_n = to(vc->narrow(0, b0, n), Device::CUDA, dt);
      OwnedTensor pos_n = to(pos->narrow(0, b0, n), Device::CUDA, DType::I32), o(dt, Device::CUDA, {n, H, D});
      OwnedTensor done(DType::I32, Device::CUDA, {n, H});
      zero_tensor(done);
      test::poison(o);
      attention_decode_step(gctx.ctx(), q_n->narrow(1, 0, H), q_n->narrow(1, H, Hk), q_n->narrow(1, H + Hk, Hk), pos_n,
                            kc_n, vc_n, freqs, 0, o, done);
      ctx_synchronize(gctx.ctx());
      return std::tuple{to(o, Device::CPU, DType::F64), to(kc_n, Device::CPU, DType::F64),
                        to(vc_n, Device::CPU, DType::F64)};
    };
    const auto [o_all, k_all, v_all] = run(0, B);
    for (const int64_t b : {int64_t{0}, int64_t{1}, B - 1}) {
      SCOPED_TRACE("row " + std::to_string(b));
      const auto [o_1, k_1, v_1] = run(b, 1);
      EXPECT_EQ(to_doubles(o_all->narrow(0, b, 1)), to_doubles(o_1));
      EXPECT_EQ(to_doubles(k_all->narrow(0, b, 1)), to_doubles(k_1));
      EXPECT_EQ(to_doubles(v_all->narrow(0, b, 1)), to_doubles(v_1));
    }
  }
}

}  // namespace
}  // namespace linac::test_attention_decode_gpu
