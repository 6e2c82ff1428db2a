// AdamW CPU reference against an independent PyTorch-style implementation.
#include <cmath>
#include <vector>

#include "adamw/adamw.h"
#include "test_util.h"

namespace linac::test_adamw {
namespace {

// torch.optim.AdamW's single-tensor step, written out in double.
void torch_adamw(std::vector<double>& p, const std::vector<double>& grad, std::vector<double>& m,
                 std::vector<double>& v, const AdamWArgs& a) {
  const double b1 = a.beta1, b2 = a.beta2;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(a.step));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(a.step));
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * static_cast<double>(a.grad_scale);
    p[i] *= 1 - static_cast<double>(a.lr) * a.weight_decay;
    m[i] = m[i] * b1 + (1 - b1) * g;  // lerp
    v[i] = v[i] * b2 + (1 - b2) * g * g;
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + a.eps;
    p[i] -= a.lr / bc1 * m[i] / denom;
  }
}

TEST(AdamwCpu, MatchesTorchOverThreeSteps) {
  const int64_t n = 37;
  OwnedTensor p = test::random_tensor({n}, DType::F64, 1);
  OwnedTensor m(DType::F64, Device::CPU, {n}), v(DType::F64, Device::CPU, {n}), copy(DType::F64, Device::CPU, {n});
  zero_tensor(m);
  zero_tensor(v);
  std::vector<double> rp = to_doubles(p), rm(n, 0.0), rv(n, 0.0);
  AdamWArgs a{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
  for (int64_t step = 1; step <= 3; ++step) {
    a.step = step;
    OwnedTensor g = test::random_tensor({n}, DType::F64, 10 + static_cast<uint64_t>(step), -2, 2);
    adamw_step(Ctx{}, p, g, m, v, copy, a);
    torch_adamw(rp, to_doubles(g), rm, rv, a);
    EXPECT_LT(test::max_abs_diff(to_doubles(p), rp), 1e-14) << "step " << step;
    EXPECT_LT(test::max_abs_diff(to_doubles(m), rm), 1e-15) << "step " << step;
    EXPECT_LT(test::max_abs_diff(to_doubles(v), rv), 1e-15) << "step " << step;
    EXPECT_EQ(to_doubles(copy), to_doubles(p));
  }
}

TEST(AdamwCpu, FirstStepIsSignOfGradient) {
  // With bias correction, step 1 gives m^ = g and v^ = g^2: the update is lr * g / (|g| + eps).
  const int64_t n = 9;
  OwnedTensor p = test::random_tensor({n}, DType::F64, 2);
  OwnedTensor g = test::random_tensor({n}, DType::F64, 3);
  OwnedTensor m(DType::F64, Device::CPU, {n}), v(DType::F64, Device::CPU, {n});
  zero_tensor(m);
  zero_tensor(v);
  const std::vector<double> p0 = to_doubles(p), g0 = to_doubles(g);
  const AdamWArgs a{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-12f, .weight_decay = 0, .grad_scale = 1,
                    .step = 1};
  adamw_step(Ctx{}, p, g, m, v, Tensor{}, a);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(p->data<double>()[i], p0[i] - static_cast<double>(a.lr) * (g0[i] > 0 ? 1 : -1), 1e-12);
}

TEST(AdamwCpu, BiasCorrectionAtLaterStep) {
  // Constant gradient from zero state: m^ = g and v^ = g^2 at every step, so each step moves
  // the parameter by lr * sign(g) (no weight decay) whatever the step number.
  const int64_t n = 5;
  OwnedTensor p = test::random_tensor({n}, DType::F64, 4);
  OwnedTensor g = test::random_tensor({n}, DType::F64, 5);
  OwnedTensor m(DType::F64, Device::CPU, {n}), v(DType::F64, Device::CPU, {n});
  zero_tensor(m);
  zero_tensor(v);
  const std::vector<double> p0 = to_doubles(p), g0 = to_doubles(g);
  AdamWArgs a{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-12f, .weight_decay = 0, .grad_scale = 1};
  for (int64_t step = 1; step <= 10; ++step) {
    a.step = step;
    adamw_step(Ctx{}, p, g, m, v, Tensor{}, a);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(p->data<double>()[i], p0[i] - 10 * static_cast<double>(a.lr) * (g0[i] > 0 ? 1 : -1), 1e-11);
}

TEST(AdamwCpu, FloatMatchesDouble) {
  const int64_t n = 1003;
  OwnedTensor p = test::random_tensor({n}, DType::F64, 6), g = test::random_tensor({n}, DType::F64, 7);
  OwnedTensor m = test::random_tensor({n}, DType::F64, 8, -0.1, 0.1);
  OwnedTensor v = test::random_tensor({n}, DType::F64, 9, 0, 0.1);
  OwnedTensor pf = to(p, Device::CPU, DType::F32), gf = to(g, Device::CPU, DType::F32);
  OwnedTensor mf = to(m, Device::CPU, DType::F32), vf = to(v, Device::CPU, DType::F32);
  const AdamWArgs a{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                    .grad_scale = 0.7f, .step = 4};
  adamw_step(Ctx{}, p, g, m, v, Tensor{}, a);
  adamw_step(Ctx{}, pf, gf, mf, vf, Tensor{}, a);
  EXPECT_LT(test::rel_error(pf, p), 1e-6);
  EXPECT_LT(test::rel_error(mf, m), 1e-6);
  EXPECT_LT(test::rel_error(vf, v), 1e-6);
}

}  // namespace
}  // namespace linac::test_adamw
