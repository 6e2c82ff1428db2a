// Taylor attention CPU reference: the feature-map identity (docs/based.md §2.2); quadratic == recurrent ==
// chunked forward (o, den, final state) and backward in double for T around the chunk sizes 16/64,
// several F, H > 1 and Dv not a power of two; gradient checks of each form against central
// differences; decode steps == forward, prefill + decode == a longer forward; causality; large |u|;
// the size and checks of the saved carries. q/k/v are strided views of one fused buffer, as the
// model passes them.
#include <cmath>
#include <cstring>

#include "taylor_attn/taylor_attn.h"
#include "test_util.h"

namespace linac::test_taylor_attn {
namespace {

struct Problem : test::QkvLayout {
  int64_t B, T, F;
  DType dt;
  OwnedTensor in, grad;  // [B,T,W]: q | k | v (+ a pad column so no view is contiguous)
  OwnedTensor u;         // loss weights: loss = sum(o * u)

  Problem(int64_t b, int64_t t, int64_t h, int64_t f, int64_t dv, DType d = DType::F64, uint64_t seed = 1,
          double amp = 1.5)
      : QkvLayout(h, f, dv),
        B(b),
        T(t),
        F(f),
        dt(d),
        in(test::random_tensor({b, t, W}, d, seed, -amp, amp)),
        grad(d, Device::CPU, {b, t, W}),
        u(test::random_tensor({b, t, h, dv}, d, seed + 1)) {}
  int64_t rows() const { return taylor_attn_state_rows(F); }

  struct Out {
    OwnedTensor o, den, sf;
  };
  Out forward(const TaylorAttnOpts& opts, TaylorAttnForm form) const {
    Out r{OwnedTensor(dt, Device::CPU, {B, T, H, Dv}), OwnedTensor(dt, Device::CPU, {B, H, T}),
          OwnedTensor(dt, Device::CPU, {B, H, rows(), Dv + 1})};
    for (const Tensor* x : {&r.o.t, &r.den.t, &r.sf.t}) test::poison(*x);
    taylor_attn_fwd(Ctx{}, q(in), k(in), v(in), r.o, r.den, r.sf, opts, form);
    return r;
  }
  // Gradients of sum(o * u) land in `grad` (same layout as `in`); returns them q|k|v in order.
  std::vector<double> backward(const TaylorAttnOpts& opts, TaylorAttnForm form) {
    Out f = forward(opts, form);
    test::poison(grad);
    taylor_attn_bwd(Ctx{}, q(in), k(in), v(in), f.o, f.den, u, q(grad), k(grad), v(grad), opts, form);
    std::vector<double> all;
    for (const Tensor& x : {q(grad), k(grad), v(grad)}) {
      const auto part = test::view_values(x);
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }
  double loss(const TaylorAttnOpts& opts, TaylorAttnForm form) const {
    const auto o = to_doubles(forward(opts, form).o), w = to_doubles(u);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * w[i];
    return l;
  }
};

TaylorAttnOpts opts_of(int64_t chunk) {
  TaylorAttnOpts o;
  o.chunk = chunk;
  return o;
}

const TaylorAttnForm kForms[] = {TaylorAttnForm::Quadratic, TaylorAttnForm::Recurrent, TaylorAttnForm::Chunk};
const char* form_name(TaylorAttnForm f) {
  return f == TaylorAttnForm::Quadratic ? "quadratic" : f == TaylorAttnForm::Recurrent ? "recurrent" : "chunk";
}

TEST(TaylorAttnCpu, FeatureMapIdentity) {
  for (int64_t F : {4, 8, 16}) {
    SCOPED_TRACE("F=" + std::to_string(F));
    const int64_t R = taylor_attn_state_rows(F);
    EXPECT_EQ(R, F * F + F + 1);
    std::vector<double> pq(static_cast<size_t>(R)), pk(static_cast<size_t>(R));
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const auto q = test::random_values(static_cast<size_t>(F), seed, -2, 2);
      const auto k = test::random_values(static_cast<size_t>(F), seed + 100, -2, 2);
      taylor_feature_map_cpu(F, q.data(), pq.data());
      taylor_feature_map_cpu(F, k.data(), pk.data());
      double qk = 0, dot = 0;
      for (int64_t i = 0; i < F; ++i) qk += q[i] * k[i];
      for (int64_t r = 0; r < R; ++r) dot += pq[r] * pk[r];
      const double u = qk / std::sqrt(static_cast<double>(F));
      EXPECT_NEAR(dot, 1 + u + u * u / 2, 1e-12 * (1 + u * u));
    }
    // kappa over a sweep of u (k = s q / |q|^2 * sqrt(F) gives u = s): its minimum is 1/2 at u = -1.
    const auto q = test::random_values(static_cast<size_t>(F), 5, -1, 1);
    double qq = 0;
    for (double x : q) qq += x * x;
    double lo = 1e9;
    for (int step = -400; step <= 400; ++step) {
      const double s = step / 100.0;
      std::vector<double> k(q.size());
      for (size_t i = 0; i < q.size(); ++i) k[i] = s * q[i] / qq * std::sqrt(static_cast<double>(F));
      taylor_feature_map_cpu(F, q.data(), pq.data());
      taylor_feature_map_cpu(F, k.data(), pk.data());
      double dot = 0;
      for (int64_t r = 0; r < R; ++r) dot += pq[r] * pk[r];
      lo = std::min(lo, dot);
    }
    EXPECT_NEAR(lo, 0.5, 1e-12);
  }
}

struct FormCase {
  int64_t T, chunk, F;
};
const FormCase kCases[] = {{1, 16, 4},  {15, 16, 8}, {16, 16, 4},  {17, 16, 16}, {100, 16, 4},
                           {1, 64, 8},  {17, 64, 4}, {100, 64, 8}, {64, 64, 4},  {130, 64, 16}};
std::string name(const FormCase& c) {
  return "T=" + std::to_string(c.T) + " C=" + std::to_string(c.chunk) + " F=" + std::to_string(c.F);
}

TEST(TaylorAttnCpu, ForwardFormsAgree) {
  for (const FormCase& c : kCases) {
    SCOPED_TRACE(name(c));
    Problem p(2, c.T, 2, c.F, 12);
    const auto o = opts_of(c.chunk);
    const auto ref = p.forward(o, TaylorAttnForm::Quadratic);
    ASSERT_TRUE(test::all_finite(to_doubles(ref.o)));
    for (TaylorAttnForm f : {TaylorAttnForm::Recurrent, TaylorAttnForm::Chunk}) {
      SCOPED_TRACE(form_name(f));
      const auto r = p.forward(o, f);
      EXPECT_LT(test::rel_error(r.o, ref.o), 1e-12);
      EXPECT_LT(test::rel_error(r.den, ref.den), 1e-12);
      EXPECT_LT(test::rel_error(r.sf, ref.sf), 1e-12);
    }
  }
}

TEST(TaylorAttnCpu, BackwardFormsAgree) {
  for (const FormCase& c : kCases) {
    SCOPED_TRACE(name(c));
    Problem p(2, c.T, 2, c.F, 12);
    const auto o = opts_of(c.chunk);
    const auto ref = p.backward(o, TaylorAttnForm::Quadratic);
    ASSERT_TRUE(test::all_finite(ref));
    for (TaylorAttnForm f : {TaylorAttnForm::Recurrent, TaylorAttnForm::Chunk}) {
      SCOPED_TRACE(form_name(f));
      EXPECT_LT(test::rel_error(p.backward(o, f), ref), 1e-11);
    }
  }
}

TEST(TaylorAttnCpu, GradCheckDouble) {
  for (TaylorAttnForm f : kForms)
    for (const auto& [T, chunk, F, Dv] : {std::array<int64_t, 4>{21, 8, 4, 5}, std::array<int64_t, 4>{13, 16, 3, 7}}) {
      SCOPED_TRACE(std::string(form_name(f)) + " T=" + std::to_string(T) + " F=" + std::to_string(F));
      Problem p(2, T, 2, F, Dv, DType::F64, 9);
      const auto o = opts_of(chunk);
      p.backward(o, f);
      // The pad column of `grad` was poisoned; only the q|k|v columns carry gradients.
      const int64_t n = p.in->numel();
      std::vector<double> analytic = to_doubles(p.grad);
      for (int64_t i = p.W - 1; i < n; i += p.W) analytic[static_cast<size_t>(i)] = 0;
      auto loss = [&] { return p.loss(o, f); };
      EXPECT_LT(test::check_grad(loss, p.in->data<double>(), analytic.data(), static_cast<size_t>(n), 200, 3, 1e-5),
                1e-6);
    }
}

// Decoding token by token from a zero state reproduces the forward, and the state after the
// last token is the forward's s_final.
TEST(TaylorAttnCpu, DecodeStepsMatchForward) {
  for (DType dt : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 2, T = 19, H = 3, F = 8, Dv = 10;
    Problem p(B, T, H, F, Dv, dt, 4);
    const auto ref = p.forward(opts_of(16), TaylorAttnForm::Chunk);
    OwnedTensor state(dt, Device::CPU, {B, H, p.rows(), Dv + 1}), o(dt, Device::CPU, {B, H, Dv});
    std::memset(state->ptr, 0, state->nbytes());
    std::vector<double> got(static_cast<size_t>(B * T * H * Dv));
    for (int64_t t = 0; t < T; ++t) {
      auto tok = [&](const Tensor& x) { return x.select(1, t); };
      test::poison(o);
      taylor_attn_step(Ctx{}, tok(p.q(p.in)), tok(p.k(p.in)), tok(p.v(p.in)), state, o);
      const auto ov = to_doubles(o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t e = 0; e < H * Dv; ++e) got[((b * T + t) * H) * Dv + e] = ov[b * H * Dv + e];
    }
    const double tol = dt == DType::F64 ? 1e-12 : 1e-5;
    EXPECT_LT(test::rel_error(got, to_doubles(ref.o)), tol);
    EXPECT_LT(test::rel_error(state, ref.sf), tol);
  }
}

// Prefill T1 tokens (s_final), then decode the rest: the outputs equal one forward over all T.
TEST(TaylorAttnCpu, PrefillThenDecode) {
  const int64_t B = 2, T = 40, T1 = 27, H = 2, F = 4, Dv = 6;
  Problem full(B, T, H, F, Dv, DType::F64, 6);
  const auto ref = full.forward(opts_of(16), TaylorAttnForm::Chunk);
  const auto prefix = [&](const Tensor& x) { return x.narrow(1, 0, T1); };
  OwnedTensor o1(DType::F64, Device::CPU, {B, T1, H, Dv}), den1(DType::F64, Device::CPU, {B, H, T1});
  OwnedTensor state(DType::F64, Device::CPU, {B, H, full.rows(), Dv + 1}), o(DType::F64, Device::CPU, {B, H, Dv});
  test::poison(state);
  taylor_attn_fwd(Ctx{}, prefix(full.q(full.in)), prefix(full.k(full.in)), prefix(full.v(full.in)), o1, den1, state,
                  opts_of(16));
  const auto ref_o = to_doubles(ref.o), o1v = to_doubles(o1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < T1 * H * Dv; ++e) ASSERT_NEAR(o1v[b * T1 * H * Dv + e], ref_o[b * T * H * Dv + e], 1e-12);
  for (int64_t t = T1; t < T; ++t) {
    auto tok = [&](const Tensor& x) { return x.select(1, t); };
    taylor_attn_step(Ctx{}, tok(full.q(full.in)), tok(full.k(full.in)), tok(full.v(full.in)), state, o);
    const auto ov = to_doubles(o);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < H * Dv; ++e) EXPECT_NEAR(ov[b * H * Dv + e], ref_o[(b * T + t) * H * Dv + e], 1e-12);
  }
}

// Perturbing token t (its q, k and v) leaves every output before t bitwise unchanged.
TEST(TaylorAttnCpu, Causal) {
  for (TaylorAttnForm f : kForms) {
    SCOPED_TRACE(form_name(f));
    const int64_t T = 37, t = 21;
    Problem p(1, T, 2, 4, 6, DType::F32, 8);
    const auto before = p.forward(opts_of(16), f);
    for (int64_t c = 0; c < p.W; ++c) p.in->data<float>()[t * p.W + c] += 0.5f;
    const auto after = p.forward(opts_of(16), f);
    const auto a = to_doubles(before.o), b = to_doubles(after.o);
    const int64_t row = 2 * 6;
    for (int64_t i = 0; i < t * row; ++i) ASSERT_EQ(a[i], b[i]) << i;
    bool changed = false;
    for (int64_t i = t * row; i < T * row; ++i) changed |= a[i] != b[i];
    EXPECT_TRUE(changed);
  }
}

// Unnormalised projections with |u| in the hundreds: every output and gradient stays finite.
TEST(TaylorAttnCpu, LargeScoresStayFinite) {
  for (DType dt : {DType::F32, DType::F64})
    for (TaylorAttnForm f : kForms) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + form_name(f));
      Problem p(1, 70, 2, 16, 8, dt, 12, 30.0);
      const auto r = p.forward(opts_of(64), f);
      EXPECT_TRUE(test::all_finite(to_doubles(r.o)));
      EXPECT_TRUE(test::all_finite(to_doubles(r.den)));
      EXPECT_TRUE(test::all_finite(p.backward(opts_of(64), f)));
    }
}

// TaylorAttnOpts::saved_carries: its size is the f32 carries of the calls that keep them (bf16, Dv
// <= 64, more than one 2048-token segment) and zero otherwise; the CPU forms ignore
// it (the same bits with and without); a buffer smaller than a call needs is refused.
TEST(TaylorAttnCpu, SavedCarries) {
  const int64_t R = 16 * 16 + 2 * 16;  // the GPU's padded feature rows
  EXPECT_EQ(taylor_attn_saved_carries_bytes(2, 2049, 3, 16, 64), static_cast<size_t>(2 * 3 * 2 * R * 80 * 4));
  EXPECT_EQ(taylor_attn_saved_carries_bytes(1, 8192, 2, 16, 48), static_cast<size_t>(1 * 2 * 4 * R * 64 * 4));
  EXPECT_EQ(taylor_attn_saved_carries_bytes(2, 2048, 3, 16, 64), 0u);                     // one segment
  EXPECT_EQ(taylor_attn_saved_carries_bytes(1, 8192, 2, 16, 64, DType::F32), 0u);         // not the fused kernels
  EXPECT_EQ(taylor_attn_saved_carries_bytes(1, 8192, 2, 16, 80), 0u);                     // Dv > 64

  Problem p(1, 70, 2, 16, 8);
  const auto plain = p.forward(opts_of(64), TaylorAttnForm::Chunk);
  TaylorAttnOpts opts = opts_of(64);
  OwnedTensor saved(DType::F32, Device::CPU, {4});
  test::poison(saved);
  opts.saved_carries = saved;
  const auto with = p.forward(opts, TaylorAttnForm::Chunk);
  EXPECT_TRUE(test::same_bits(plain.o, with.o));
  EXPECT_TRUE(test::same_bits(plain.den, with.den));
  EXPECT_TRUE(test::same_bits(plain.sf, with.sf));

  // A bf16 call of two segments needs 2 x 288 x 80 f32 per (batch, head) pair: one float short is
  // refused for it; the full size passes that check (the CPU then refuses bf16 itself).
  const int64_t T = 2100, need = 2 * R * 80;
  OwnedTensor q(DType::BF16, Device::CPU, {1, T, 1, 16}), v(DType::BF16, Device::CPU, {1, T, 1, 64});
  OwnedTensor o(DType::BF16, Device::CPU, {1, T, 1, 64}), den(DType::F32, Device::CPU, {1, 1, T});
  auto refusal = [&](int64_t floats) {
    OwnedTensor buf(DType::F32, Device::CPU, {floats});
    opts.saved_carries = buf;
    try {
      taylor_attn_fwd(Ctx{}, q, q, v, o, den, Tensor(), opts);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(need - 1).find("saved_carries"), std::string::npos);
  const std::string full = refusal(need);
  EXPECT_FALSE(full.empty());
  EXPECT_EQ(full.find("saved_carries"), std::string::npos) << full;
}

// The GPU workspace: the fused cases (bf16, Dv <= 64, documents or not) keep g~ and the segment
// carries, far less than the launches' per-chunk states; the other calls need the launches'.
TEST(TaylorAttnCpu, WorkspaceByKernels) {
  const int64_t T = 4100, R = 16 * 16 + 2 * 16, N = 65;  // 65 chunks, three segments
  const size_t g = static_cast<size_t>(N * 64 * 80 * 2), carries = static_cast<size_t>(3 * R * 80 * 4);
  EXPECT_EQ(taylor_attn_workspace_bytes(1, T, 1, 16, 64), (g + 255) / 256 * 256 + carries);
  const size_t launches = taylor_attn_launches_workspace_bytes(1, T, 1, 16, 64);
  EXPECT_GT(launches, static_cast<size_t>(N * R * 80 * 2));  // the per-chunk states alone
  EXPECT_EQ(taylor_attn_workspace_bytes(1, T, 1, 16, 64, DType::F32),
            taylor_attn_launches_workspace_bytes(1, T, 1, 16, 64, DType::F32));
  EXPECT_EQ(taylor_attn_workspace_bytes(2, T, 3, 16, 80), taylor_attn_launches_workspace_bytes(2, T, 3, 16, 80));
}

// LINAC_TAYLOR_KERNELS: sm80 and chunk are taken as asked (the GPU tests run each family so), any
// other value but auto is a UserError that names the variable.
TEST(TaylorAttnCpu, KernelChoice) {
  {
    const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", "chunk");
    EXPECT_STREQ(taylor_attn_gpu_kernels(), "chunk");
  }
  {
    const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", "sm80");
    EXPECT_STREQ(taylor_attn_gpu_kernels(), "sm80");
  }
  const test::ScopedEnv choice("LINAC_TAYLOR_KERNELS", "wgmma");
  try {
    taylor_attn_gpu_kernels();
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("LINAC_TAYLOR_KERNELS must be auto, sm80 or chunk"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace linac::test_taylor_attn
