// The VQ quantizer and code statistics, CUDA against brute force and the CPU forms in double:
// the nearest code (within f32 rounding of the distances), the lowest of exact ties, its rounded
// codeword and squared distance; code sums and counts (bitwise reruns, chunked one-hot rows,
// sequences that do not follow each other in k), the EMA update and the codebook from it.
#include <algorithm>
#include <vector>

#include "test_util.h"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_packed.h"

namespace linac::test_vq_quant_gpu {
namespace {

double sq_dist(const double* a, const double* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return d;
}

// The GPU picks a nearest code (within f32 rounding of the distances), the lowest of exact ties,
// writes that codeword and its squared distance.
TEST(VqQuantGpu, NearestCodeTiesAndError) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t B = 2, T = 301, H = 2, Dk = 128, S = 512, W = 2 * H * Dk + 8;
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    OwnedTensor cb_h = test::random_tensor({H, S, Dk}, DType::F64, 51, -0.5, 0.5);
    double* c = cb_h->data<double>();
    for (int64_t d = 0; d < Dk; ++d) c[(0 * S + 300) * Dk + d] = c[(0 * S + 17) * Dk + d];  // code 300 repeats 17
    OwnedTensor buf_h = test::random_tensor({B, T, W}, DType::F64, 52, -0.5, 0.5);
    for (int64_t bt = 0; bt < B * T; bt += 7)  // some keys sit exactly on code 17 of head 0
      for (int64_t d = 0; d < Dk; ++d) buf_h->data<double>()[bt * W + d] = c[17 * Dk + d];
    OwnedTensor buf = to(buf_h, Device::CUDA, act), cb = to(cb_h, Device::CUDA, DType::F32);
    OwnedTensor z(DType::I32, Device::CUDA, {B, T, H}), err(DType::F32, Device::CUDA, {B, T, H});
    test::poison(err);
    vq_quantize(gctx.ctx(), test::bthd(buf, 0, H, Dk), cb, z, test::bthd(buf, H * Dk, H, Dk), err);
    ctx_synchronize(gctx.ctx());
    const OwnedTensor z_h = to(z, Device::CPU, DType::I32);
    const auto all = to_doubles(buf), cbv = to_doubles(cb), e = to_doubles(err);
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t h = 0; h < H; ++h) {
        const double* k = &all[bt * W + h * Dk];
        const double* kh = &all[bt * W + H * Dk + h * Dk];
        const int32_t zi = z_h->data<int32_t>()[bt * H + h];
        ASSERT_TRUE(zi >= 0 && zi < S);
        double best = 1e300;
        for (int64_t s = 0; s < S; ++s) best = std::min(best, sq_dist(k, &cbv[(h * S + s) * Dk], Dk));
        const double got = sq_dist(k, &cbv[(h * S + zi) * Dk], Dk);
        EXPECT_LE(got, best + 1e-4) << bt << " " << h;
        if (h == 0 && bt % 7 == 0) EXPECT_EQ(zi, 17) << bt;
        EXPECT_NEAR(e[bt * H + h], got, 1e-5 * (1 + got));
        OwnedTensor one(DType::F64, Device::CPU, {Dk}), r(act, Device::CPU, {Dk});
        std::copy(&cbv[(h * S + zi) * Dk], &cbv[(h * S + zi) * Dk] + Dk, one->data<double>());
        convert_host(r, one);
        const auto rounded = to_doubles(r);
        for (int64_t d = 0; d < Dk; ++d) ASSERT_EQ(kh[d], rounded[d]);
      }
  }
}

TEST(VqQuantGpu, CodeStatsEmaCodebook) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const int64_t B = 3, T = 1000, H = 2, Dk = 64, S = 37, W = H * Dk + 8;
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    OwnedTensor buf_h = test::random_tensor({B, T, W}, DType::F64, 61);
    OwnedTensor z_h(DType::I32, Device::CPU, {B, T, H});
    const auto r = test::random_values(static_cast<size_t>(B * T * H), 62, 0, S);
    for (int64_t i = 0; i < B * T * H; ++i)
      z_h->data<int32_t>()[i] = std::min<int32_t>(static_cast<int32_t>(r[i]), S - 1);
    OwnedTensor buf = to(buf_h, Device::CUDA, act), z = to(z_h, Device::CUDA, DType::I32);
    OwnedTensor sums(DType::F32, Device::CUDA, {H, S, Dk}), counts(DType::F32, Device::CUDA, {H, S});
    OwnedTensor sums2(DType::F32, Device::CUDA, {H, S, Dk}), counts2(DType::F32, Device::CUDA, {H, S});
    for (const Tensor* t : {&sums.t, &counts.t, &sums2.t, &counts2.t}) test::poison(*t);
    vq_code_stats(gctx.ctx(), test::bthd(buf, 3, H, Dk), z, sums, counts);
    vq_code_stats(gctx.ctx(), test::bthd(buf, 3, H, Dk), z, sums2, counts2);
    ctx_synchronize(gctx.ctx());
    EXPECT_TRUE(test::same_bits(sums, sums2));
    EXPECT_TRUE(test::same_bits(counts, counts2));
    OwnedTensor buf_r = to(buf, Device::CPU, DType::F64);
    OwnedTensor sums_r(DType::F64, Device::CPU, {H, S, Dk}), counts_r(DType::F64, Device::CPU, {H, S});
    vq_code_stats(Ctx{}, test::bthd(buf_r, 3, H, Dk), z_h, sums_r, counts_r);
    EXPECT_LT(test::rel_error(sums, sums_r), 1e-6);
    EXPECT_EQ(to_doubles(counts), to_doubles(counts_r));
    // A workspace of 700 tokens' one-hot rows (chunks that end inside sequences), and sequences
    // that do not follow each other in k (one GEMM per sequence part).
    Ctx small = gctx.ctx();
    small.workspace_bytes = 512 + vq_cuda::kBlasBytes + 700 * vq_cuda::round8(S) * dtype_size(act);
    vq_code_stats(small, test::bthd(buf, 3, H, Dk), z, sums2, counts2);
    ctx_synchronize(gctx.ctx());
    EXPECT_LT(test::rel_error(sums2, sums_r), 1e-6);
    EXPECT_EQ(to_doubles(counts2), to_doubles(counts_r));
    OwnedTensor wide = to(test::random_tensor({B, T + 3, W}, DType::F64, 65), Device::CUDA, act);
    const size_t row_bytes = static_cast<size_t>(W) * dtype_size(act);
    for (int64_t b = 0; b < B; ++b)
      gpu_memcpy(static_cast<char*>(wide->ptr) + b * (T + 3) * row_bytes, Device::CUDA,
                 static_cast<const char*>(buf->ptr) + b * T * row_bytes, Device::CUDA, T * row_bytes);
    Tensor gapped = test::bthd(wide, 3, H, Dk);
    gapped.shape[1] = T;  // the first T tokens of each sequence, at the wider batch stride
    vq_code_stats(gctx.ctx(), gapped, z, sums2, counts2);
    ctx_synchronize(gctx.ctx());
    EXPECT_LT(test::rel_error(sums2, sums_r), 1e-6);
    EXPECT_EQ(to_doubles(counts2), to_doubles(counts_r));
    // EMA and codebook on the GPU vs the CPU in double.
    OwnedTensor cs_h = test::random_tensor({H, S, Dk}, DType::F64, 63),
                cc_h = test::random_tensor({H, S}, DType::F64, 64, 0, 3);
    cc_h->data<double>()[5] = 0.001;
    OwnedTensor cs = to(cs_h, Device::CUDA, DType::F32), cc = to(cc_h, Device::CUDA, DType::F32);
    OwnedTensor cs_r = to(cs, Device::CPU, DType::F64), cc_r = to(cc, Device::CPU, DType::F64);
    OwnedTensor sums_rr = to(sums, Device::CPU, DType::F64);
    vq_ema_update(gctx.ctx(), sums, counts, cs, cc, 0.99);
    vq_ema_update(Ctx{}, sums_rr, counts_r, cs_r, cc_r, 0.99);
    OwnedTensor cb(DType::F32, Device::CUDA, {H, S, Dk}), cb_r(DType::F64, Device::CPU, {H, S, Dk});
    test::poison(cb);
    vq_codebook_from_stats(gctx.ctx(), cs, cc, cb);
    vq_codebook_from_stats(Ctx{}, cs_r, cc_r, cb_r);
    ctx_synchronize(gctx.ctx());
    EXPECT_LT(test::rel_error(cs, cs_r), 1e-6);
    EXPECT_LT(test::rel_error(cc, cc_r), 1e-6);
    EXPECT_LT(test::rel_error(cb, cb_r), 1e-6);
  }
}

}  // namespace
}  // namespace linac::test_vq_quant_gpu
