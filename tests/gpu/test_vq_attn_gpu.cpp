// VQ-attention CUDA vs the CPU block reference (double) on the same rounded inputs, f32 and bf16:
// forward (o, lse) and backward from the GPU's o and lse (dq, dkhat, dv, du, dvr, drho), with
// q/khat/v and dq/dkhat/dv as strided views of fused buffers, ragged T, H = 1 with Dv = 1536 and
// multi-head Dk = Dv = 64, o written by the output GEMMs themselves (one head, T a multiple of the
// block); bitwise determinism and smaller chunks under a small workspace; the forward's cache
// and weights saved for the backward; delta from the gate's unit dots; strided dout read and
// strided o written in place; the score gradients in the dP GEMMs' epilogue; decode
// steps and the prefill handover. The quantizer and code statistics: test_vq_quant_gpu.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "activation/activation.h"
#include "swiglu/swiglu.h"
#include "test_util.h"
#include "vq_attn/vq_attn.h"
#include "vq_attn/vq_packed.h"
#include "vq_attn_checks.h"
#include "vq_state_checks.h"

namespace linac::test_vq_attn_gpu {
namespace {

struct Case {
  int64_t B, T, H, Dk, Dv, S, Lb;
};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " Dk=" +
         std::to_string(c.Dk) + " Dv=" + std::to_string(c.Dv) + " S=" + std::to_string(c.S) + " Lb=" +
         std::to_string(c.Lb);
}

// Ragged T everywhere; several blocks so the cache fills; S = 7 repeats codes; the paper's head
// (Dk 128, Dv 1536, S 512) on a short sequence; multi-head Dk = Dv = 64; head dims that are not
// multiples of four (the kernels' one-element paths); blocks of 1024 (rows too long for the
// forward to keep their scores in shared memory); blocks of 6 (rows of window weights that do
// not split into groups of four); one head with T a multiple of the block (o's rows are the
// packed rows: the output GEMMs write o); head dims that are multiples of four but not of eight
// (bf16 gradients stored four at a time, not in 16-byte accesses). Pairs of at most four blocks
// have their cache-mean gradients summed by the gradient store (T = 2100 / Lb 1024, 192 / 64,
// 250 / 64, 61 / 16), more by the sweep.
const Case kCases[] = {{2, 77, 3, 64, 64, 37, 16},      {1, 300, 1, 128, 1536, 512, 64}, {2, 130, 2, 32, 96, 7, 32},
                       {1, 700, 2, 64, 128, 100, 128},  {3, 45, 2, 16, 48, 5, 8},        {2, 61, 2, 6, 10, 9, 16},
                       {1, 2100, 1, 16, 16, 300, 1024}, {2, 50, 2, 16, 24, 6, 6},        {2, 192, 1, 32, 40, 24, 64},
                       {2, 90, 1, 20, 36, 11, 16},      {2, 250, 1, 32, 64, 40, 64}};

// Host inputs in double: khat holds the codewords of z (rounded to the activation dtype later).
struct Inputs {
  Case c;
  int64_t W;
  OwnedTensor qkv, z, codebook, u, vr, rho, dout;
  explicit Inputs(const Case& cs, uint64_t seed = 1)
      : c(cs), W((cs.H * (2 * cs.Dk + cs.Dv) + 7) / 8 * 8 + 8),
        qkv(test::random_tensor({cs.B, cs.T, W}, DType::F64, seed, -0.5, 0.5)),
        z(DType::I32, Device::CPU, {cs.B, cs.T, cs.H}),
        codebook(test::random_tensor({cs.H, cs.S, cs.Dk}, DType::F64, seed + 1, -0.5, 0.5)),
        u(test::random_tensor({cs.H, cs.Dk}, DType::F64, seed + 2, -0.2, 0.2)),
        vr(test::random_tensor({cs.H, cs.Dk}, DType::F64, seed + 3, -0.2, 0.2)),
        rho(test::random_tensor({cs.H, cs.Lb + 1, cs.Dk}, DType::F64, seed + 4, -0.5, 0.5)),
        dout(test::random_tensor({cs.B, cs.T, cs.H, cs.Dv}, DType::F64, seed + 5)) {
    // The codebook is f32 on the GPU: round it first, so both sides use the same codewords.
    OwnedTensor cb32 = to(codebook, Device::CPU, DType::F32);
    convert_host(codebook, cb32);
    const auto r = test::random_values(static_cast<size_t>(cs.B * cs.T * cs.H), seed + 6, 0, static_cast<double>(cs.S));
    double* buf = qkv->data<double>();
    for (int64_t bt = 0; bt < cs.B * cs.T; ++bt)
      for (int64_t h = 0; h < cs.H; ++h) {
        const int32_t code = std::min(static_cast<int32_t>(r[bt * cs.H + h]), static_cast<int32_t>(cs.S - 1));
        z->data<int32_t>()[bt * cs.H + h] = code;
        for (int64_t d = 0; d < cs.Dk; ++d)
          buf[bt * W + cs.H * cs.Dk + h * cs.Dk + d] = codebook->data<double>()[(h * cs.S + code) * cs.Dk + d];
      }
  }
  Tensor q(const Tensor& b) const { return test::bthd(b, 0, c.H, c.Dk); }
  Tensor khat(const Tensor& b) const { return test::bthd(b, c.H * c.Dk, c.H, c.Dk); }
  Tensor v(const Tensor& b) const { return test::bthd(b, 2 * c.H * c.Dk, c.H, c.Dv); }
  // VqAttnOpts::saved_cache, saved_weights, delta_units of every call, if defined
  Tensor saved_cache, saved_weights, delta_units;
  VqAttnOpts opts() const {
    VqAttnOpts o;
    o.block = c.Lb;
    o.saved_cache = saved_cache;
    o.saved_weights = saved_weights;
    o.delta_units = delta_units;
    return o;
  }
};

// Storage for VqAttnOpts::saved_cache and saved_weights (poisoned), as the model passes them.
struct Saved {
  OwnedTensor cache, weights;
  Saved(Inputs& in, DType act) {
    const Case& c = in.c;
    const auto f32s = [](size_t bytes) { return std::vector<int64_t>{static_cast<int64_t>(bytes / 4)}; };
    cache = OwnedTensor(DType::F32, Device::CUDA, f32s(vq_attn_saved_cache_bytes(c.B, c.T, c.H, c.Dv, c.S, c.Lb, act)));
    weights = OwnedTensor(DType::F32, Device::CUDA, f32s(vq_attn_saved_weights_bytes(c.B, c.T, c.H, c.S, c.Lb, act)));
    test::poison(cache);
    test::poison(weights);
    in.saved_cache = cache;
    in.saved_weights = weights;
  }
};

using Result = test::VqResult;

// Forward, then backward from (o_in, lse_in) when given (the reference's backward takes the GPU's
// rounded o and its lse, as the GPU's does), else from its own forward; on ctx's device. act:
// q/khat/v/o/dout dtype, par: codebook/biases/lse/parameter gradients.
Result run(const Ctx& ctx, const Inputs& in, const Tensor& qkv, const Tensor& z, const Tensor& cb, const Tensor& u,
           const Tensor& vr, const Tensor& rho, const Tensor& dout, DType act, DType par, const Tensor& o_in = Tensor(),
           const Tensor& lse_in = Tensor()) {
  const Case& c = in.c;
  const Device dev = ctx.device;
  Result r{OwnedTensor(act, dev, {c.B, c.T, c.H, c.Dv}), OwnedTensor(par, dev, {c.B, c.T, c.H}),
           OwnedTensor(act, dev, {c.B, c.T, in.W}),      OwnedTensor(par, dev, {c.H, c.Dk}),
           OwnedTensor(par, dev, {c.H, c.Dk}),            OwnedTensor(par, dev, {c.H, c.Lb + 1, c.Dk})};
  for (const Tensor* t : {&r.o.t, &r.lse.t, &r.grad.t, &r.du.t, &r.dvr.t, &r.drho.t}) test::poison(*t);
  vq_attn_fwd(ctx, in.q(qkv), in.khat(qkv), z, in.v(qkv), cb, u, vr, rho, r.o, r.lse, in.opts());
  const Tensor& o = o_in.defined() ? o_in : r.o.t;
  const Tensor& lse = lse_in.defined() ? lse_in : r.lse.t;
  vq_attn_bwd(ctx, in.q(qkv), in.khat(qkv), z, in.v(qkv), cb, u, vr, rho, o, lse, dout, in.q(r.grad),
              in.khat(r.grad), in.v(r.grad), r.du, r.dvr, r.drho, in.opts());
  ctx_synchronize(ctx);
  return r;
}

struct Gpu {
  OwnedTensor qkv, z, cb, u, vr, rho, dout;
  Gpu(const Inputs& in, DType act)
      : qkv(to(in.qkv, Device::CUDA, act)),
        z(to(in.z, Device::CUDA, DType::I32)),
        cb(to(in.codebook, Device::CUDA, DType::F32)),
        u(to(in.u, Device::CUDA, DType::F32)),
        vr(to(in.vr, Device::CUDA, DType::F32)),
        rho(to(in.rho, Device::CUDA, DType::F32)),
        dout(to(in.dout, Device::CUDA, act)) {}
  Result run(const Ctx& ctx, const Inputs& in, DType act) const {
    return test_vq_attn_gpu::run(ctx, in, qkv, z, cb, u, vr, rho, dout, act, DType::F32);
  }
};

// Both backwards: scores recomputed, and the forward's cache and weights saved (the model's call).
// The backward alone from (o, lse) with in's options: dq | dkhat | dv in the fused layout.
OwnedTensor backward_grad(const Ctx& ctx, const Inputs& in, const Gpu& g, DType act, const Tensor& o,
                          const Tensor& lse) {
  const Case& c = in.c;
  OwnedTensor grad(act, Device::CUDA, {c.B, c.T, in.W}), du(DType::F32, Device::CUDA, {c.H, c.Dk}),
      dvr(DType::F32, Device::CUDA, {c.H, c.Dk}), drho(DType::F32, Device::CUDA, {c.H, c.Lb + 1, c.Dk});
  vq_attn_bwd(ctx, in.q(g.qkv), in.khat(g.qkv), g.z, in.v(g.qkv), g.cb, g.u, g.vr, g.rho, o, lse, g.dout, in.q(grad),
              in.khat(grad), in.v(grad), du, dvr, drho, in.opts());
  ctx_synchronize(ctx);
  return grad;
}

void run_parity(DType act, double tol_o, double tol_grad) {
  GpuContext gctx;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Inputs in(c);
    const Gpu g(in, act);
    Result gr = g.run(gctx.ctx(), in, act);
    // The reference sees the GPU's rounded inputs.
    OwnedTensor qkv_r = to(g.qkv, Device::CPU, DType::F64), dout_r = to(g.dout, Device::CPU, DType::F64);
    OwnedTensor u_r = to(g.u, Device::CPU, DType::F64), vr_r = to(g.vr, Device::CPU, DType::F64);
    OwnedTensor rho_r = to(g.rho, Device::CPU, DType::F64);
    OwnedTensor o_r = to(gr.o, Device::CPU, DType::F64), lse_r = to(gr.lse, Device::CPU, DType::F64);
    Result cr = run(Ctx{}, in, qkv_r, in.z, in.codebook, u_r, vr_r, rho_r, dout_r, DType::F64, DType::F64, o_r, lse_r);
    const int64_t HK = c.H * c.Dk, HV = c.H * c.Dv;
    test::expect_vq_close(gr, cr, HK, HV, tol_o, tol_grad);
    SCOPED_TRACE("saved cache and weights");
    const Saved saved(in, act);
    test::expect_vq_close(g.run(gctx.ctx(), in, act), cr, HK, HV, tol_o, tol_grad);
  }
}

TEST(VqAttnGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 1e-5, 2e-5);
}

TEST(VqAttnGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::BF16, 1e-2, 2e-2);
}

// Bitwise reruns; workspaces that hold chunks of one and of four blocks (chunk boundaries inside
// a sequence, between sequences and between heads, where the previous block's key and value
// gradients are accumulated across chunks) agree closely; a workspace below one block is refused.
// Two heads with a ragged T, and one head whose o the output GEMMs write chunk by chunk; the
// backward recomputing the weights, and taking the forward's saved cache and weights.
TEST(VqAttnGpu, DeterministicAndChunked) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (auto [act, c] :
       {std::pair{DType::BF16, Case{3, 200, 2, 64, 64, 50, 32}},  // 7 blocks per sequence, 21 per head
        std::pair{DType::F32, Case{3, 200, 2, 64, 64, 50, 32}},
        std::pair{DType::BF16, Case{3, 192, 1, 64, 64, 50, 32}},  // 6 per sequence
        std::pair{DType::F32, Case{3, 192, 1, 64, 64, 50, 32}},
        // 4 per sequence: the store sums the cache-mean gradients, the cache
        // products take blocks 2 and 3 of each sequence from chunks that split
        // sequences (o through the f32 rows, then written by the output GEMMs)
        std::pair{DType::BF16, Case{3, 120, 2, 64, 64, 50, 32}}, std::pair{DType::F32, Case{3, 120, 2, 64, 64, 50, 32}},
        std::pair{DType::BF16, Case{3, 128, 1, 64, 64, 50, 32}},
        std::pair{DType::F32, Case{3, 128, 1, 64, 64, 50, 32}}}) {
    SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
    Inputs in(c, 11);
    const Gpu g(in, act);
    for (bool keep : {false, true}) {
      SCOPED_TRACE(keep ? "saved cache and weights" : "recomputed");
      std::optional<Saved> saved;
      if (keep) saved.emplace(in, act);
      Result r1 = g.run(gctx.ctx(), in, act), r2 = g.run(gctx.ctx(), in, act);
      for (auto m : {&Result::o, &Result::lse, &Result::grad, &Result::du, &Result::dvr, &Result::drho})
        EXPECT_TRUE(test::same_bits(r1.*m, r2.*m));
      const vq_cuda::Geo geo = vq_cuda::geo_of(c.B, c.T, c.H, c.Dk, c.Dv, c.S, c.Lb);
      // In bf16 a chunk's dv window part is stored in the activation dtype before the next chunk adds
      // to it: one more rounding (2^-9 relative) than one chunk takes, so the gradients get 5e-3.
      const double tol = act == DType::BF16 ? 2e-3 : 1e-5, tol_grad = act == DType::BF16 ? 5e-3 : 1e-5;
      for (int64_t cap : {1, 3, 4}) {
        SCOPED_TRACE("blocks per chunk " + std::to_string(cap));
        Ctx small = gctx.ctx();
        small.workspace_bytes = vq_cuda::layout(geo, dtype_size(act), true, cap, nullptr, nullptr);
        ASSERT_LE(small.workspace_bytes, gctx.ctx().workspace_bytes);
        test::expect_vq_close(g.run(small, in, act), r1, c.H * c.Dk, c.H * c.Dv, tol, tol_grad, 1e-6);
      }
      Ctx tiny = gctx.ctx();
      tiny.workspace_bytes = vq_cuda::layout(geo, dtype_size(act), true, 1, nullptr, nullptr) - 1;
      EXPECT_ANY_THROW(g.run(tiny, in, act));
    }
  }
}

// VqAttnOpts::saved_cache and saved_weights (the paper's head over five blocks, two heads with a
// ragged T). The saved cache: the backward reads it instead of sorting and scanning again, and
// every output and gradient keeps its bits; it does read it: with an emptied cache dq changes. The
// saved weights: the forward's outputs keep their bits (the weights only go elsewhere), the
// backward that takes them is deterministic and close to the one that recomputes them (the parity
// tests hold both to the reference), and it reads them: with the weights zeroed every score
// gradient is 0, so dq is too.
TEST(VqAttnGpu, SavedCacheAndWeights) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (const Case& c : {Case{2, 1100, 1, 128, 1536, 512, 256}, Case{3, 200, 2, 64, 64, 50, 32}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
      Inputs in(c, 31);
      const Gpu g(in, act);
      const Result plain = g.run(ctx, in, act);
      const size_t bytes = vq_attn_saved_cache_bytes(c.B, c.T, c.H, c.Dv, c.S, c.Lb, act);
      OwnedTensor cache(DType::F32, Device::CUDA, {static_cast<int64_t>(bytes / 4)});
      test::poison(cache);
      in.saved_cache = cache;
      const Result saved = g.run(ctx, in, act);
      for (auto m : {&Result::o, &Result::lse, &Result::grad, &Result::du, &Result::dvr, &Result::drho})
        EXPECT_TRUE(test::same_bits(plain.*m, saved.*m));
      gpu_memset_zero_async(ctx, cache->ptr, cache->nbytes());  // every code's count 0: no cache
      const OwnedTensor no_cache = backward_grad(ctx, in, g, act, saved.o, saved.lse);
      const int64_t HK = c.H * c.Dk;
      EXPECT_GT(test::rel_error(test::columns(no_cache, 0, HK), test::columns(plain.grad, 0, HK)), 1e-2);

      SCOPED_TRACE("saved weights");
      const Saved both(in, act);
      const Result r1 = g.run(ctx, in, act), r2 = g.run(ctx, in, act);
      EXPECT_TRUE(test::same_bits(plain.o, r1.o));
      EXPECT_TRUE(test::same_bits(plain.lse, r1.lse));
      const double tol = act == DType::BF16 ? 1e-2 : 1e-5;
      const int64_t written = c.H * (2 * c.Dk + c.Dv);  // the fused buffer's padding columns are never written
      EXPECT_LT(test::rel_error(test::columns(r1.grad, 0, written), test::columns(plain.grad, 0, written)), tol);
      for (auto m : {&Result::grad, &Result::du, &Result::dvr, &Result::drho})
        EXPECT_TRUE(test::same_bits(r1.*m, r2.*m));
      for (auto m : {&Result::du, &Result::dvr, &Result::drho}) EXPECT_LT(test::rel_error(r1.*m, plain.*m), tol);
      gpu_memset_zero_async(ctx, both.weights->ptr, both.weights->nbytes());
      const OwnedTensor no_weights = backward_grad(ctx, in, g, act, r1.o, r1.lse);
      for (double x : test::columns(no_weights, 0, HK)) ASSERT_EQ(x, 0.0) << "dq with the weights zeroed";
      EXPECT_GT(test::rel_error(test::columns(plain.grad, 0, HK), test::columns(no_weights, 0, HK)), 0.5);
    }
  }
}

// The score gradients in the dP GEMMs' epilogue (vq_attn_score_grads_kernel, an H100/H200 with the
// saved weights in bf16) against the cuBLASLt dP GEMMs and the rows kernel (LINAC_VQ_KERNELS=sm80)
// on the same inputs: the same forward, gradients close (dP summed in another order), bitwise
// reruns; and it ran: the f32 dP scratch of the workspace, zeroed before the backward, stays zero
// (the rows path writes it). Blocks of 16 with S = 37 (one row tile per block, clusters of one,
// the window of block 0 reaching before the matrix), 256 with the paper's head (two row tiles:
// clusters of two), 64 with two heads and a ragged T, 384 and 512 (window tiles of keys after all
// their rows' queries skipped, in clusters of one and of two); chunks of one block. Compared
// element by element, so that a tile lost shows, and so are the last chunk's score gradients by
// distance (Lb + 1 per row, written in 16-byte groups that straddle the GEMM's tiles).
TEST(VqAttnGpu, ScoreGradsInGemmEpilogue) {
  LINAC_SKIP_WITHOUT_GPU();
  if (std::string(vq_attn_score_grads_kernel(16, 64, DType::BF16)) != "gemm_epilogue_sm90")
    GTEST_SKIP() << "the epilogue kernel runs on an H100/H200";
  GpuContext gctx;
  const DType act = DType::BF16;
  for (const Case& c :
       {Case{2, 77, 3, 64, 64, 37, 16}, Case{2, 600, 1, 128, 1536, 512, 256}, Case{2, 300, 2, 32, 40, 24, 64},
        Case{2, 900, 1, 32, 64, 130, 384}, Case{1, 1300, 1, 64, 96, 200, 512}}) {
    SCOPED_TRACE(name(c));
    Inputs in(c, 41);
    const Gpu g(in, act);
    const Saved saved(in, act);
    const vq_cuda::Geo geo = vq_cuda::geo_of(c.B, c.T, c.H, c.Dk, c.Dv, c.S, c.Lb);
    Ctx ctx = gctx.ctx();
    ctx.workspace_bytes = vq_cuda::layout(geo, dtype_size(act), true, 1, nullptr, nullptr);
    ASSERT_LE(ctx.workspace_bytes, gctx.ctx().workspace_bytes);
    vq_cuda::Ws ws{};
    vq_cuda::layout(geo, dtype_size(act), true, 1, static_cast<char*>(ctx.workspace), &ws);
    const int64_t dp_elems = c.Lb * geo.ldw, pos_elems = c.Lb * geo.ldp;
    // The backward from the forward's o and lse with the dP scratch zeroed: whether it is still zero;
    // and the last chunk's score gradients by distance, as left in the workspace.
    auto backward = [&](const Result& fwd, bool* dp_untouched, std::vector<double>* gpos = nullptr) {
      gpu_memset_zero_async(ctx, ws.dpwin, static_cast<size_t>(dp_elems) * sizeof(float));
      OwnedTensor grad = backward_grad(ctx, in, g, act, fwd.o, fwd.lse);
      const OwnedTensor dp = to(Tensor(ws.dpwin, DType::F32, Device::CUDA, {dp_elems}), Device::CPU, DType::F64);
      *dp_untouched = std::all_of(dp->data<double>(), dp->data<double>() + dp_elems, [](double x) { return x == 0; });
      if (gpos) {
        const OwnedTensor pos = to(Tensor(ws.gpos, act, Device::CUDA, {pos_elems}), Device::CPU, DType::F64);
        gpos->assign(pos->data<double>(), pos->data<double>() + pos_elems);
      }
      return grad;
    };
    EXPECT_STREQ(vq_attn_score_grads_kernel(c.Lb, c.Dv, act), "gemm_epilogue_sm90");
    const Result fwd = g.run(ctx, in, act);
    bool untouched = false;
    std::vector<double> pos_fused, pos_rows;
    const OwnedTensor fused = backward(fwd, &untouched, &pos_fused), again = backward(fwd, &untouched);
    EXPECT_TRUE(untouched) << "the epilogue path wrote the dP scratch";
    const int64_t written = c.H * (2 * c.Dk + c.Dv);  // the fused buffer's padding columns are never written
    const std::vector<double> got = test::columns(fused, 0, written);
    EXPECT_EQ(got, test::columns(again, 0, written));
    test::ScopedEnv env("LINAC_VQ_KERNELS", "sm80");
    EXPECT_STREQ(vq_attn_score_grads_kernel(c.Lb, c.Dv, act), "rows");
    const OwnedTensor rows = backward(fwd, &untouched, &pos_rows);
    EXPECT_FALSE(untouched) << "the rows path left the dP scratch alone";
    // By distance, entry by entry (each distance group's stores, whole and at tile edges, and the
    // zeros past Lb); some entries are far from zero.
    double pos_scale = 0;
    for (double x : pos_rows) pos_scale = std::max(pos_scale, std::fabs(x));
    EXPECT_GT(pos_scale, 0);
    EXPECT_LT(test::max_abs_diff(pos_fused, pos_rows), 2e-2 * pos_scale);
    for (int64_t l = 0; l < c.Lb; ++l)
      for (int64_t d = c.Lb + 1; d < geo.ldp; ++d) ASSERT_EQ(pos_fused[l * geo.ldp + d], 0) << l << " " << d;
    // Element by element against the largest gradient: one tile of score gradients lost or
    // misplaced moves some rows by far more (a norm over the whole buffer can hide it).
    const std::vector<double> want = test::columns(rows, 0, written);
    double scale = 0;
    for (double x : want) scale = std::max(scale, std::fabs(x));
    EXPECT_LT(test::max_abs_diff(got, want), 2e-2 * scale);
  }
}

// VqAttnOpts::delta_units: delta from the table of dout o per 8 value dims that the GAU's gate
// writes (swiglu_value_dots of h = [. | o], dh = [. | dout]) instead of from dout and o: close to
// the backward that reads them (the same products summed in another order), bitwise reruns, and
// read: a table of zeros (delta = 0) changes dq.
TEST(VqAttnGpu, DeltaFromUnitDots) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (const Case& c : {Case{2, 1100, 1, 128, 1536, 512, 256}, Case{3, 200, 2, 64, 64, 50, 32}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
      Inputs in(c, 37);
      const Gpu g(in, act);
      const Saved saved(in, act);  // as the model calls it
      const Result plain = g.run(ctx, in, act);
      const int64_t N = c.B * c.T, HV = c.H * c.Dv, HK = c.H * c.Dk;
      OwnedTensor h(DType::F64, Device::CPU, {N, 2 * HV}), dh(DType::F64, Device::CPU, {N, 2 * HV});
      const OwnedTensor o = to(plain.o, Device::CPU, DType::F64), dout = to(g.dout, Device::CPU, DType::F64);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < HV; ++j) {
          h->data<double>()[r * 2 * HV + j] = dh->data<double>()[r * 2 * HV + j] = 1.0;
          h->data<double>()[r * 2 * HV + HV + j] = o->data<double>()[r * HV + j];
          dh->data<double>()[r * 2 * HV + HV + j] = dout->data<double>()[r * HV + j];
        }
      OwnedTensor units_host(DType::F32, Device::CPU, {N, HV / 8});
      swiglu_value_dots(Ctx{}, h, dh, units_host);
      const OwnedTensor units = to(units_host, Device::CUDA, DType::F32);
      in.delta_units = units->view({c.B, c.T, HV / 8});
      const OwnedTensor g1 = backward_grad(ctx, in, g, act, plain.o, plain.lse);
      const OwnedTensor g2 = backward_grad(ctx, in, g, act, plain.o, plain.lse);
      EXPECT_TRUE(test::same_bits(g1, g2));
      const double tol = act == DType::BF16 ? 1e-2 : 1e-5;
      const int64_t written = c.H * (2 * c.Dk + c.Dv);  // the fused buffer's padding columns are never written
      EXPECT_LT(test::rel_error(test::columns(g1, 0, written), test::columns(plain.grad, 0, written)), tol);
      gpu_memset_zero_async(ctx, units->ptr, units->nbytes());
      const OwnedTensor g0 = backward_grad(ctx, in, g, act, plain.o, plain.lse);
      EXPECT_GT(test::rel_error(test::columns(g0, 0, HK), test::columns(plain.grad, 0, HK)), 1e-2);
    }
  }
}

// VqAttnOpts::v_pre: the gradient store's SiLU' gives the bits of the backward followed by
// silu_bwd, on the vector path (the paper's head) and the one-element path (odd head dims).
TEST(VqAttnGpu, SiluValueGradEqualsSiluBwd) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const Ctx& ctx = gctx.ctx();
  for (const Case& c : {Case{1, 300, 1, 128, 1536, 512, 64}, Case{2, 61, 2, 6, 10, 9, 16}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(dtype_name(act) + std::string(" ") + name(c));
      Inputs in(c, 23);
      const Gpu g(in, act);
      const int64_t HK = c.H * c.Dk, HV = c.H * c.Dv;
      const OwnedTensor v_pre = to(test::random_tensor({c.B, c.T, HV}, DType::F64, 29, -4, 4), Device::CUDA, act);
      const Tensor v_pre4 = v_pre->view({c.B, c.T, c.H, c.Dv}), v_pre2 = v_pre->view({c.B * c.T, HV});
      OwnedTensor o(act, Device::CUDA, {c.B, c.T, c.H, c.Dv}), lse(DType::F32, Device::CUDA, {c.B, c.T, c.H});
      vq_attn_fwd(ctx, in.q(g.qkv), in.khat(g.qkv), g.z, in.v(g.qkv), g.cb, g.u, g.vr, g.rho, o, lse, in.opts());
      auto backward = [&](bool fused) {
        OwnedTensor grad(act, Device::CUDA, {c.B, c.T, in.W}), du(DType::F32, Device::CUDA, {c.H, c.Dk}),
            dvr(DType::F32, Device::CUDA, {c.H, c.Dk}), drho(DType::F32, Device::CUDA, {c.H, c.Lb + 1, c.Dk});
        test::poison(grad);
        VqAttnOpts opts = in.opts();
        if (fused) opts.v_pre = v_pre4;
        vq_attn_bwd(ctx, in.q(g.qkv), in.khat(g.qkv), g.z, in.v(g.qkv), g.cb, g.u, g.vr, g.rho, o, lse, g.dout,
                    in.q(grad), in.khat(grad), in.v(grad), du, dvr, drho, opts);
        if (!fused) {
          const OwnedTensor raw = to(grad, Device::CUDA, act);
          auto dv = [&](const Tensor& t) { return t.view({c.B * c.T, in.W}).narrow(1, 2 * HK, HV); };
          silu_bwd(ctx, v_pre2, dv(raw), dv(grad));
        }
        ctx_synchronize(ctx);
        return grad;
      };
      const OwnedTensor fused = backward(true), ref = backward(false);
      EXPECT_EQ(test::columns(fused, 0, 2 * HK + HV), test::columns(ref, 0, 2 * HK + HV));
      // SiLU' changed the values: the test compares the fused store with something it does not write alone.
      EXPECT_NE(test::columns(fused, 2 * HK, HV), test::columns(g.run(ctx, in, act).grad, 2 * HK, HV));
    }
  }
}

// Inputs that already are in the packed layout (one head, T a multiple of the block, contiguous
// rows) are read in place: the same results as from the same values in a fused buffer (packed).
// dout is read in place at a row stride too.
TEST(VqAttnGpu, InputsInPackedLayout) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    const Case c{3, 128, 1, 32, 48, 20, 32};  // 4 blocks per sequence
    Inputs in(c, 21);
    const Gpu g(in, act);
    const Result fused = g.run(gctx.ctx(), in, act);
    auto cols = [&](int64_t c0, int64_t D) {  // [B, T, 1, D] copy of columns [c0, c0 + D) of the fused buffer
      OwnedTensor h(DType::F64, Device::CPU, {c.B, c.T, 1, D});
      const std::vector<double> x = test::columns(in.qkv, c0, D);
      std::copy(x.begin(), x.end(), h->data<double>());
      return to(h, Device::CUDA, act);
    };
    const OwnedTensor q = cols(0, c.Dk), kh = cols(c.Dk, c.Dk), v = cols(2 * c.Dk, c.Dv);
    OwnedTensor o(act, Device::CUDA, {c.B, c.T, 1, c.Dv}), lse(DType::F32, Device::CUDA, {c.B, c.T, 1});
    OwnedTensor dq(act, Device::CUDA, {c.B, c.T, 1, c.Dk}), dk(act, Device::CUDA, {c.B, c.T, 1, c.Dk});
    OwnedTensor dv(act, Device::CUDA, {c.B, c.T, 1, c.Dv}), du(DType::F32, Device::CUDA, {1, c.Dk});
    OwnedTensor dvr(DType::F32, Device::CUDA, {1, c.Dk}), drho(DType::F32, Device::CUDA, {1, c.Lb + 1, c.Dk});
    vq_attn_fwd(gctx.ctx(), q, kh, g.z, v, g.cb, g.u, g.vr, g.rho, o, lse, in.opts());
    vq_attn_bwd(gctx.ctx(), q, kh, g.z, v, g.cb, g.u, g.vr, g.rho, o, lse, g.dout, dq, dk, dv, du, dvr, drho, in.opts());
    ctx_synchronize(gctx.ctx());
    const double tol = act == DType::BF16 ? 2e-3 : 1e-6;
    EXPECT_LT(test::rel_error(o, fused.o), tol) << "o";
    EXPECT_LT(test::rel_error(lse, fused.lse), 1e-6) << "lse";
    EXPECT_LT(test::rel_error(to_doubles(dq), test::columns(fused.grad, 0, c.Dk)), tol) << "dq";
    EXPECT_LT(test::rel_error(to_doubles(dk), test::columns(fused.grad, c.Dk, c.Dk)), tol) << "dkhat";
    EXPECT_LT(test::rel_error(to_doubles(dv), test::columns(fused.grad, 2 * c.Dk, c.Dv)), tol) << "dv";
    EXPECT_LT(test::rel_error(du, fused.du), tol) << "du";
    EXPECT_LT(test::rel_error(dvr, fused.dvr), tol) << "dvr";
    EXPECT_LT(test::rel_error(drho, fused.drho), tol) << "drho";
    // dout as the model passes it: columns [Dv, 2 Dv) of a [B, T, 2 Dv] buffer, read in place at
    // that row stride. The other columns are NaN, so a read at the wrong stride shows.
    OwnedTensor wide_h(DType::F64, Device::CPU, {c.B, c.T, 2 * c.Dv});
    const std::vector<double> dv_vals = test::view_values(g.dout);
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t d = 0; d < c.Dv; ++d) {
        wide_h->data<double>()[r * 2 * c.Dv + d] = std::nan("");
        wide_h->data<double>()[r * 2 * c.Dv + c.Dv + d] = dv_vals[static_cast<size_t>(r * c.Dv + d)];
      }
    const OwnedTensor wide = to(wide_h, Device::CUDA, act);
    OwnedTensor dq2(act, Device::CUDA, {c.B, c.T, 1, c.Dk}), dk2(act, Device::CUDA, {c.B, c.T, 1, c.Dk});
    OwnedTensor dv2(act, Device::CUDA, {c.B, c.T, 1, c.Dv}), du2(DType::F32, Device::CUDA, {1, c.Dk});
    OwnedTensor dvr2(DType::F32, Device::CUDA, {1, c.Dk}), drho2(DType::F32, Device::CUDA, {1, c.Lb + 1, c.Dk});
    vq_attn_bwd(gctx.ctx(), q, kh, g.z, v, g.cb, g.u, g.vr, g.rho, o, lse, test::bthd(wide, c.Dv, 1, c.Dv), dq2, dk2,
                dv2, du2, dvr2, drho2, in.opts());
    ctx_synchronize(gctx.ctx());
    EXPECT_LT(test::rel_error(dq2, dq), tol) << "dq, strided dout";
    EXPECT_LT(test::rel_error(dk2, dk), tol) << "dkhat, strided dout";
    EXPECT_LT(test::rel_error(dv2, dv), tol) << "dv, strided dout";
    EXPECT_LT(test::rel_error(du2, du), tol) << "du, strided dout";
    EXPECT_LT(test::rel_error(dvr2, dvr), tol) << "dvr, strided dout";
    EXPECT_LT(test::rel_error(drho2, drho), tol) << "drho, strided dout";
    // o as the model passes it: columns [Dv, 2 Dv) of a [B, T, 2 Dv] buffer, written by the output
    // GEMMs at that row stride; the other columns keep their NaN.
    const OwnedTensor wide_o = to(wide_h, Device::CUDA, act);
    OwnedTensor lse2(DType::F32, Device::CUDA, {c.B, c.T, 1});
    vq_attn_fwd(gctx.ctx(), q, kh, g.z, v, g.cb, g.u, g.vr, g.rho, test::bthd(wide_o, c.Dv, 1, c.Dv), lse2, in.opts());
    ctx_synchronize(gctx.ctx());
    EXPECT_EQ(test::columns(wide_o, c.Dv, c.Dv), to_doubles(o)) << "o, strided";
    for (double x : test::columns(wide_o, 0, c.Dv)) ASSERT_TRUE(std::isnan(x)) << "o's neighbour columns";
  }
}

using test::token;

// Decode steps on the GPU, token after token through the window boundary and into the cache,
// reproduce the CPU block forward (double) on the same rounded inputs: the steps' score kernel over
// one and several groups of 64 entries, their output kernel over value dims that fill groups of
// 32 and that do not (70).
TEST(VqAttnGpu, DecodeStepsMatchForward) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (DType act : {DType::F32, DType::BF16}) {
    for (const Case& c :
         {Case{2, 45, 2, 64, 96, 7, 8}, Case{1, 150, 1, 128, 1536, 512, 32}, Case{2, 230, 2, 24, 70, 100, 64}}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " " + name(c));
      Inputs in(c, 21);
      const Gpu g(in, act);
      OwnedTensor qkv_r = to(g.qkv, Device::CPU, DType::F64), u_r = to(g.u, Device::CPU, DType::F64);
      OwnedTensor vr_r = to(g.vr, Device::CPU, DType::F64), rho_r = to(g.rho, Device::CPU, DType::F64);
      OwnedTensor o_ref(DType::F64, Device::CPU, {c.B, c.T, c.H, c.Dv}), lse_ref(DType::F64, Device::CPU, {c.B, c.T, c.H});
      vq_attn_fwd(Ctx{}, in.q(qkv_r), in.khat(qkv_r), in.z, in.v(qkv_r), in.codebook, u_r, vr_r, rho_r, o_ref, lse_ref,
                  in.opts());
      const Device dev = Device::CUDA;
      OwnedTensor rk(DType::F32, dev, {c.B, c.H, c.Lb, c.Dk}), rv(DType::F32, dev, {c.B, c.H, c.Lb, c.Dv});
      OwnedTensor rz(DType::I32, dev, {c.B, c.H, c.Lb}), n(DType::F32, dev, {c.B, c.H, c.S});
      OwnedTensor m(DType::F32, dev, {c.B, c.H, c.S, c.Dv});
      const VqAttnState st{rk, rv, rz, n, m};
      for (const Tensor* t : {&rk.t, &rv.t, &n.t, &m.t}) test::poison(*t);
      vq_attn_state_reset(gctx.ctx(), st);
      OwnedTensor o(act, dev, {c.B, c.T, c.H, c.Dv});
      test::poison(o);
      for (int64_t t = 0; t < c.T; ++t) {
        OwnedTensor zc_h(DType::I32, Device::CPU, {c.B, c.H});
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.H; ++h)
            zc_h->data<int32_t>()[b * c.H + h] = in.z->data<int32_t>()[(b * c.T + t) * c.H + h];
        OwnedTensor zc = to(zc_h, dev, DType::I32);
        const OwnedTensor pos = test::int32_values(std::vector<int32_t>(c.B, static_cast<int32_t>(t)), dev);
        vq_attn_step(gctx.ctx(), token(in.q(g.qkv), t), token(in.khat(g.qkv), t), zc, token(in.v(g.qkv), t), g.cb, g.u,
                     g.vr, g.rho, st, pos, token(o.t, t));
        ctx_synchronize(gctx.ctx());
      }
      EXPECT_LT(test::rel_error(o, o_ref), act == DType::F32 ? 1e-5 : 1e-2);
    }
  }
}

// The prefill handover on the GPU leaves the state of the GPU's steps, bit for bit (f32 state,
// the same running-mean update in the same order): value dims that are not a multiple of the
// kernel's 64 (and the paper's 1536), codebooks not a multiple of its 8 warps, the cache filled
// over several windows, a prompt shorter than the window; documents ending in one token, in fewer
// tokens than the window and in more.
TEST(VqAttnGpu, PrefillLeavesTheStateOfItsSteps) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  const std::vector<std::vector<int64_t>> one_doc;
  const std::pair<Case, std::vector<std::vector<int64_t>>> cases[] = {
      {{2, 77, 2, 16, 70, 37, 16}, one_doc},
      {{3, 77, 2, 16, 70, 37, 16}, {{40, 37}, {76, 1}, {5, 60, 12}}},
      {{1, 700, 1, 128, 1536, 512, 128}, one_doc},
      {{2, 20, 1, 8, 24, 5, 32}, {{7, 13}, {20}}}};
  for (DType act : {DType::F32, DType::BF16})
    for (const auto& [c, docs] : cases) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " " + name(c) + (docs.empty() ? "" : ", documents"));
      Inputs in(c, 41);
      const Gpu g(in, act);
      test::check_state_prefill_matches_steps(gctx.ctx(), in.q(g.qkv), in.khat(g.qkv), in.z, in.v(g.qkv), g.cb, g.u,
                                              g.vr, g.rho, docs);
    }
}

}  // namespace
}  // namespace linac::test_vq_attn_gpu
