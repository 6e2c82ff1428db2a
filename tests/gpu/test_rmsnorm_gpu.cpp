// RMSNorm CUDA vs the CPU reference (double), f32 and bf16 activations, with the fused residual
// add and gradient copy.
#include <utility>

#include "rmsnorm/rmsnorm.h"
#include "test_util.h"

namespace linac::test_rmsnorm_gpu {
namespace {

// Widths of 128 * k up to 1024 take the warp-per-row kernels, 1792 and 2048 rows of two warps,
// 2560 rows of four, the others (777, 1152, 2304) a block per row; all do the residual add (h:
// x + add, summed in f32 and rounded to x's dtype, bit for bit; the norm is h's) and write dx_copy
// (the updated dx in dy's dtype). 1100 rows give the backward's row groups (at most 1024 / warps)
// several rows each.
void run_parity(DType x_dt, DType y_dt, double tol) {
  const std::pair<int64_t, int64_t> shapes[] = {{777, 300},  {768, 300},   {128, 300},  {1024, 1100}, {1152, 300},
                                                {1792, 300}, {2048, 1100}, {2304, 300}, {2560, 1100}};
  for (const auto& [dim, rows] : shapes) {
    SCOPED_TRACE("dim=" + std::to_string(dim) + " rows=" + std::to_string(rows));
    OwnedTensor x = test::random_tensor({rows, dim}, DType::F64, 11, -2, 2);
    OwnedTensor w = test::random_tensor({dim}, DType::F64, 12, 0.5, 1.5);
    OwnedTensor dy = test::random_tensor({rows, dim}, DType::F64, 13);
    OwnedTensor dx0 = test::random_tensor({rows, dim}, DType::F64, 14);
    OwnedTensor add = test::random_tensor({rows, dim}, DType::F64, 15, -1, 1);
    // The GPU sees the inputs rounded to its dtype; the reference uses the same rounded values.
    OwnedTensor xg = to(x, Device::CUDA, x_dt), wg = to(w, Device::CUDA, DType::F32);
    OwnedTensor dyg = to(dy, Device::CUDA, y_dt), dxg = to(dx0, Device::CUDA, x_dt);
    OwnedTensor xr = to(xg, Device::CPU, DType::F64), dyr = to(dyg, Device::CPU, DType::F64);
    OwnedTensor dxr = to(dxg, Device::CPU, DType::F64);
    OwnedTensor addg = to(add, Device::CUDA, y_dt), sum(DType::F64, Device::CPU, {rows, dim});
    const std::vector<double> xv = to_doubles(xr), av = to_doubles(addg);
    for (size_t i = 0; i < xv.size(); ++i) sum->data<double>()[i] = xv[i] + av[i];
    // The GPU's f32 sum (the exact sum rounded once), then x's dtype.
    OwnedTensor hr = to(to(to(sum, Device::CPU, DType::F32), Device::CPU, x_dt), Device::CPU, DType::F64);

    GpuContext gctx;
    OwnedTensor yg(y_dt, Device::CUDA, {rows, dim}), rsg(DType::F32, Device::CUDA, {rows});
    OwnedTensor dwg(DType::F32, Device::CUDA, {dim});
    OwnedTensor hg(x_dt, Device::CUDA, {rows, dim}), dx_copy(y_dt, Device::CUDA, {rows, dim});
    OwnedTensor yhg(y_dt, Device::CUDA, {rows, dim}), rshg(DType::F32, Device::CUDA, {rows});
    test::poison(yg);
    test::poison(yhg);
    test::poison(hg);
    test::poison(dx_copy);
    zero_tensor(dwg);
    rmsnorm_fwd(gctx.ctx(), xg, wg, yg, rsg, 1e-5f);
    rmsnorm_fwd(gctx.ctx(), xg, wg, yhg, rshg, 1e-5f, addg, hg);
    rmsnorm_bwd(gctx.ctx(), xg, wg, rsg, dyg, dxg, dwg, dx_copy);
    // A second backward from the same inputs: bit-identical dx and dw (fixed reduction orders).
    OwnedTensor dxg2 = to(dx0, Device::CUDA, x_dt), dwg2(DType::F32, Device::CUDA, {dim});
    zero_tensor(dwg2);
    rmsnorm_bwd(gctx.ctx(), xg, wg, rsg, dyg, dxg2, dwg2);
    gctx.synchronize();
    EXPECT_EQ(to_doubles(dxg2), to_doubles(dxg));
    EXPECT_EQ(to_doubles(dwg2), to_doubles(dwg));

    OwnedTensor y(DType::F64, Device::CPU, {rows, dim}), rs(DType::F64, Device::CPU, {rows});
    OwnedTensor dw(DType::F64, Device::CPU, {dim});
    zero_tensor(dw);
    rmsnorm_fwd(Ctx{}, xr, w, y, rs, 1e-5f);
    rmsnorm_bwd(Ctx{}, xr, w, rs, dyr, dxr, dw);
    EXPECT_LT(test::rel_error(yg, y), tol);
    EXPECT_LT(test::rel_error(dxg, dxr), tol);
    EXPECT_LT(test::rel_error(dwg, dw), tol);
    EXPECT_EQ(to_doubles(hg), to_doubles(hr));
    OwnedTensor yh(DType::F64, Device::CPU, {rows, dim}), rsh(DType::F64, Device::CPU, {rows});
    rmsnorm_fwd(Ctx{}, hr, w, yh, rsh, 1e-5f);
    EXPECT_LT(test::rel_error(yhg, yh), tol);
    EXPECT_LT(test::rel_error(rshg, rsh), 1e-5);
    EXPECT_EQ(to_doubles(dx_copy), to_doubles(to(to(dxg, Device::CPU, y_dt), Device::CPU, DType::F64)));
  }
}

TEST(RmsnormGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::F32, 1e-5);
}

TEST(RmsnormGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, DType::BF16, 1e-2);
}

TEST(RmsnormGpu, ParityF32ResidualBf16Output) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, DType::BF16, 1e-2);
}

}  // namespace
}  // namespace linac::test_rmsnorm_gpu
