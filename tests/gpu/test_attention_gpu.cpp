// Attention CUDA vs the CPU reference (double) on the same rounded inputs, f32 and bf16, head dims
// 64 to 128, with q/k/v and dq/dk/dv as strided views of fused [B,T,H+2Hk,D] buffers (q's H heads,
// then k's and v's Hk each, as the model's mixer lays them out), multi-head (Hk = H) and
// grouped-query (Hk < H, down to one key/value head); plus bitwise determinism and the head dims
// the GPU refuses. The bf16 cases run through both kernel families
// (on a Hopper GPU: the sm90 kernels, then the sm80 ones by LINAC_ATTENTION_KERNELS=sm80).
// Packed documents (AttentionOpts::docs): the same parity on several layouts, that they change the
// result, that one document per row equals none, and that short documents cost less. dv added to
// (AttentionOpts::accumulate_dv) from a random start, through every kernel path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "attention/attention.h"
#include "test_util.h"

namespace linac::test_attention_gpu {
namespace {

using test::DocLayout;

constexpr int64_t kB = 2, kH = 3;

// Runs the enclosed calls with LINAC_ATTENTION_KERNELS set to `value` (nullptr: unset).
struct KernelChoice : test::ScopedEnv {
  explicit KernelChoice(const char* value) : test::ScopedEnv("LINAC_ATTENTION_KERNELS", value) {}
};

// The kernel families the bf16 cases run through on this GPU: "auto" where it picks the sm90 ones.
std::vector<const char*> bf16_families() {
  std::vector<const char*> f{"sm80"};
  if (std::string(attention_gpu_kernels(64)) == "sm90") f.insert(f.begin(), "auto");
  return f;
}

// Document layouts of a window: per row, document lengths repeated until the row is full (the
// last document cut at T).
enum class Docs {
  kNone,
  kShort,   // lengths 1, 5, 17: documents of one token and documents shorter than any tile
  kTiles,   // documents starting at tile boundaries (64, 128, 256, ...) next to a 1-token one
  kMixed,   // long and short, the first document cut by the window (as a window starting mid-way)
  kRandom,  // random lengths from 1 to 400
  kOne,     // one document per row: the same as none
};

const char* docs_name(Docs d) {
  static const char* const names[] = {"none", "short", "tiles", "mixed", "random", "one"};
  return names[static_cast<int>(d)];
}

struct GpuCase {
  int64_t T, D;
  bool causal;
  int64_t window;
  double rope = 0;  // AttentionOpts::rope's base
  Docs docs = Docs::kNone;
  int64_t H = kH;   // query heads
  int64_t Hk = kH;  // key/value heads, dividing H
  bool accumulate_dv = false;  // dv starts random and the backward adds to it
};

std::string name(const GpuCase& c) {
  return "T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) + (c.causal ? " causal" : " full") +
         " window=" + std::to_string(c.window) + (c.rope > 0 ? " rope=" + std::to_string(c.rope) : "") +
         (c.docs != Docs::kNone ? std::string(" docs=") + docs_name(c.docs) : "") + " H=" + std::to_string(c.H) +
         " Hk=" + std::to_string(c.Hk) + (c.accumulate_dv ? " accumulate_dv" : "");
}

DocLayout doc_arrays(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& rows) {
  return test::doc_layout(B, T, rows, true);
}

std::vector<int64_t> random_lengths(uint64_t seed, int64_t max_len) {
  std::vector<int64_t> len;
  for (double x : test::random_values(64, seed, 1, static_cast<double>(max_len) + 1))
    len.push_back(std::clamp<int64_t>(static_cast<int64_t>(x), 1, max_len));
  return len;
}

DocLayout doc_arrays(int64_t T, Docs layout) {
  switch (layout) {
    case Docs::kShort: return doc_arrays(kB, T, {{1, 5, 17}, {17, 1, 5, 1}});
    case Docs::kTiles: return doc_arrays(kB, T, {{64, 64, 128, 200}, {128, 1, 63, 192}});
    case Docs::kMixed: return doc_arrays(kB, T, {{700, 3, 1000, 1}, random_lengths(61, 250)});
    case Docs::kRandom: return doc_arrays(kB, T, {random_lengths(62, 400), random_lengths(63, 400)});
    case Docs::kOne: return doc_arrays(kB, T, {{T}});
    case Docs::kNone: break;
  }
  LINAC_CHECK(false, "no document layout");
  return {};
}

// T = 2100 without a window takes the Hopper forward's one-CTA-per-item grid, the others its
// persistent one.
// Windows of 1, 16 and 64 (Based's) exercise the per-warp skipping of key/query groups outside the
// band, with T not a multiple of any tile. Head dims 80, 96 (Latte-Macchiato's window) and 112
// (based_1.3b's) use padded rather than swizzled tile rows and tiles that do not split evenly
// among the threads in the sm80 family; in the sm90 one, 128-column tiles whose columns past D
// must read as zeros (the next head's columns lie there in the fused buffer) and are not written.
const GpuCase kCases[] = {
    {1, 64, true, 0},       {17, 128, true, 0},     {64, 64, true, 0},     {200, 64, true, 37},   {200, 128, false, 0},
    {1000, 64, true, 0},    {1000, 128, true, 300}, {1000, 64, true, 100}, {333, 64, true, 16},   {333, 128, true, 64},
    {150, 64, true, 1},     {700, 64, true, 64},    {1, 96, true, 0},      {300, 96, false, 0},   {1000, 96, true, 0},
    {150, 96, true, 1},     {333, 96, true, 16},    {700, 96, true, 64},   {1000, 96, true, 129}, {17, 112, true, 0},
    {200, 112, false, 0},   {1000, 112, true, 0},   {150, 112, true, 1},   {333, 112, true, 16},  {700, 112, true, 64},
    {1000, 112, true, 129}, {500, 80, true, 0},     {130, 80, false, 0},   {257, 80, true, 129},  {2100, 64, true, 0},
    {1500, 128, false, 0},  {2100, 64, true, 700},  {385, 128, true, 0},   {191, 64, false, 0},   {193, 64, true, 0},
    {2100, 128, true, 0},   {2100, 96, true, 0}};

// The backward with RoPE: D = 64 rotates dq/dk inside the Hopper kernel, D = 80, 96, 112, 128 dk
// inside it (each its own pair distance) and dq by a rope_bwd pass (positions past a tile boundary,
// padding rows, a window, full attention); the sm80 family rotates both by the pass; bases 10000
// and 500 (angles of many turns by T = 2100).
const GpuCase kRopeCases[] = {{200, 64, true, 37, 1e4},   {1000, 64, true, 0, 1e4},  {191, 64, false, 0, 1e4},
                              {2100, 64, true, 0, 500},   {150, 64, true, 1, 1e4},   {333, 128, true, 64, 1e4},
                              {385, 128, true, 0, 500},   {17, 64, true, 0, 1e4},    {2100, 128, true, 0, 500},
                              {191, 128, false, 0, 1e4},  {150, 128, true, 1, 1e4},  {333, 96, true, 0, 1e4},
                              {1000, 96, true, 129, 500}, {257, 80, true, 0, 1e4},   {333, 112, false, 0, 500},
                              {1000, 112, true, 64, 1e4}, {1200, 80, true, 129, 1e4}};

// Documents are packed in the window: every document case below. T = 2100 without a window takes
// the Hopper forward's one-CTA-per-item grid, the others its persistent one; with RoPE the Hopper
// backward rotates in-kernel (positions from document starts) dq and dk at D = 64 and dk at D = 96,
// 112 and 128; dq there, and the sm80 family's both, take a rope_bwd pass.
const GpuCase kDocCases[] = {{333, 64, true, 0, 0, Docs::kShort},      {333, 128, true, 0, 0, Docs::kTiles},
                             {1000, 64, true, 0, 0, Docs::kMixed},     {1000, 128, true, 0, 0, Docs::kRandom},
                             {2100, 64, true, 0, 0, Docs::kRandom},    {2100, 128, true, 0, 0, Docs::kTiles},
                             {1000, 64, true, 100, 0, Docs::kTiles},   {333, 128, true, 16, 0, Docs::kShort},
                             {2100, 64, true, 700, 0, Docs::kMixed},   {1000, 96, true, 0, 0, Docs::kMixed},
                             {333, 112, true, 64, 0, Docs::kTiles},    {500, 80, true, 0, 0, Docs::kShort},
                             {1000, 64, true, 0, 0, Docs::kOne},       {17, 64, true, 0, 0, Docs::kShort},
                             {1000, 64, true, 0, 1e4, Docs::kMixed},   {333, 64, true, 37, 1e4, Docs::kShort},
                             {2100, 64, true, 0, 500, Docs::kTiles},   {1000, 128, true, 0, 1e4, Docs::kRandom},
                             {333, 128, true, 64, 1e4, Docs::kTiles},  {1000, 96, true, 0, 1e4, Docs::kShort},
                             {1000, 96, true, 129, 500, Docs::kMixed}, {333, 112, true, 16, 1e4, Docs::kRandom}};

// Grouped-query attention: 4 query heads on 2 key/value heads, 6 on 3, and multi-query (6 on 1),
// through every head dim, causal and full, windows, RoPE and documents, T not a multiple of any
// tile; the dk/dv sums over each group run inside the kernels.
const GpuCase kGqaCases[] = {
    {17, 64, true, 0, 0, Docs::kNone, 4, 2},       {1, 64, true, 0, 0, Docs::kNone, 6, 1},
    {333, 128, true, 0, 0, Docs::kNone, 6, 1},     {1000, 64, true, 0, 0, Docs::kNone, 6, 3},
    {1000, 96, true, 0, 0, Docs::kNone, 4, 2},     {200, 128, false, 0, 0, Docs::kNone, 6, 3},
    {333, 64, false, 0, 0, Docs::kNone, 6, 1},     {1000, 64, true, 100, 0, Docs::kNone, 4, 2},
    {333, 112, true, 16, 0, Docs::kNone, 6, 1},    {500, 80, true, 0, 0, Docs::kNone, 6, 3},
    {1000, 128, true, 300, 0, Docs::kNone, 6, 1},  {2100, 64, true, 0, 0, Docs::kNone, 4, 2},
    {333, 64, true, 37, 1e4, Docs::kNone, 4, 2},   {1000, 128, true, 0, 1e4, Docs::kNone, 6, 3},
    {1000, 96, true, 0, 1e4, Docs::kNone, 6, 1},   {1000, 64, true, 0, 0, Docs::kMixed, 6, 1},
    {333, 128, true, 0, 0, Docs::kShort, 4, 2},    {1000, 64, true, 0, 1e4, Docs::kRandom, 6, 3},
    {333, 96, true, 64, 0, Docs::kTiles, 4, 2}};

// AttentionOpts::accumulate_dv: Latte-Macchiato's window (D = 96, window 129; with its RoPE and
// documents too) and every other kernel path (D = 64 with RoPE, D = 128, grouped-query heads,
// documents, full attention).
const GpuCase kAccumulateCases[] = {
    {1000, 96, true, 129, 0, Docs::kNone, kH, kH, true},   {333, 64, true, 37, 1e4, Docs::kNone, kH, kH, true},
    {1000, 96, true, 129, 1e4, Docs::kNone, kH, kH, true}, {1000, 96, true, 129, 1e4, Docs::kMixed, kH, kH, true},
    {2100, 128, true, 0, 0, Docs::kNone, kH, kH, true},    {1000, 64, true, 0, 0, Docs::kNone, 6, 1, true},
    {1000, 96, true, 0, 0, Docs::kMixed, 4, 2, true},      {200, 112, false, 0, 0, Docs::kNone, kH, kH, true}};

// More (batch*head)s than the Hopper forward puts in one item group (heads whose K and V fit in 8 MiB:
// 8 MiB / (T x 128 columns x 4 bytes) at D = 128, x 64 at D = 64), the last group partial: 18 heads
// in groups of 16 at T = 1000 and 2048 (persistent grid; grouped-query, documents), 10 in groups
// of 7 at T = 2100 (a CTA per item).
const GpuCase kItemGroupCases[] = {{1000, 128, true, 0, 0, Docs::kNone, 9, 9},
                                   {2048, 64, true, 0, 0, Docs::kNone, 9, 3},
                                   {1000, 128, true, 0, 0, Docs::kMixed, 9, 3},
                                   {2100, 128, true, 0, 0, Docs::kNone, 5, 5}};

AttentionOpts opts_of(const GpuCase& c, DocBounds docs = {}) {
  AttentionOpts o;
  o.causal = c.causal;
  o.window = c.window;
  o.rope = c.rope;
  o.docs = docs;
  o.accumulate_dv = c.accumulate_dv;
  return o;
}

// Dims of a fused [B,T,H+2Hk,D] buffer of case c.
std::vector<int64_t> fused_dims(const GpuCase& c) { return {kB, c.T, c.H + 2 * c.Hk, c.D}; }

// The fused gradient buffer a case that accumulates starts from: random, so dv's start shows in the
// result and dq, dk must be overwritten.
OwnedTensor dqkv_start(const GpuCase& c) { return test::random_tensor(fused_dims(c), DType::F64, 33); }

// Heads [first, first + count) of part i (0: q, 1: k, 2: v) in a fused buffer of case c.
struct HeadRange {
  int64_t first, count;
};
HeadRange part_heads(const GpuCase& c, int i) {
  return i == 0 ? HeadRange{0, c.H} : HeadRange{c.H + (i - 1) * c.Hk, c.Hk};
}

// Part i as a [B,T,heads,D] view (token stride (H + 2Hk) D).
Tensor part(const Tensor& fused, const GpuCase& c, int i) {
  const HeadRange r = part_heads(c, i);
  return fused.narrow(2, r.first, r.count);
}

// Part i's values, [B,T,heads,D] in order.
std::vector<double> component(const Tensor& fused, const GpuCase& c, int i) {
  const std::vector<double> all = to_doubles(fused);
  const HeadRange r = part_heads(c, i);
  const int64_t D = fused.size(3), P = fused.size(2);
  std::vector<double> out;
  for (int64_t row = 0; row < fused.size(0) * fused.size(1); ++row)
    out.insert(out.end(), all.begin() + (row * P + r.first) * D, all.begin() + (row * P + r.first + r.count) * D);
  return out;
}

struct GpuRun {
  OwnedTensor o, lse, dqkv;
};

GpuRun run_gpu(const Ctx& ctx, const Tensor& qkv, const Tensor& dout, DType dt, const GpuCase& c,
               DocBounds docs = {}) {
  const int64_t T = c.T, D = c.D;
  LINAC_CHECK(ctx.workspace_bytes >= attention_bwd_workspace_bytes(kB, T, c.H, D, c.rope > 0),
              "test workspace too small");
  GpuRun r{OwnedTensor(dt, Device::CUDA, {kB, T, c.H, D}), OwnedTensor(DType::F32, Device::CUDA, {kB, c.H, T}),
           OwnedTensor(dt, Device::CUDA, fused_dims(c))};
  test::poison(r.o);
  test::poison(r.lse);
  test::poison(r.dqkv);
  if (c.accumulate_dv) copy_tensor(r.dqkv, to(dqkv_start(c), Device::CUDA, dt));
  attention_fwd(ctx, part(qkv, c, 0), part(qkv, c, 1), part(qkv, c, 2), r.o, r.lse, opts_of(c, docs));
  attention_bwd(ctx, part(qkv, c, 0), part(qkv, c, 1), part(qkv, c, 2), r.o, r.lse, dout, part(r.dqkv, c, 0),
                part(r.dqkv, c, 1), part(r.dqkv, c, 2), opts_of(c, docs));
  gpu_synchronize();
  return r;
}

void run_parity(DType dt, double tol, std::span<const GpuCase> cases = kCases) {
  GpuContext gctx;
  // Under compute-sanitizer (scripts/gpu_check.sh sanitize sets LINAC_GPU_SANITIZE) the short
  // cases alone: every kernel path and head dim, at a size racecheck finishes.
  const bool sanitizing = std::getenv("LINAC_GPU_SANITIZE") != nullptr;
  for (const GpuCase& c : cases) {
    if (sanitizing && c.T > 350) continue;
    SCOPED_TRACE(name(c));
    const int64_t T = c.T, D = c.D;
    OwnedTensor qkv = test::random_tensor(fused_dims(c), DType::F64, 31, -1.5, 1.5);
    OwnedTensor dout = test::random_tensor({kB, T, c.H, D}, DType::F64, 32);
    // The GPU sees the inputs rounded to its dtype; the reference uses the same rounded values.
    OwnedTensor qkv_g = to(qkv, Device::CUDA, dt), dout_g = to(dout, Device::CUDA, dt);
    OwnedTensor qkv_r = to(qkv_g, Device::CPU, DType::F64), dout_r = to(dout_g, Device::CPU, DType::F64);
    const DocLayout docs = c.docs == Docs::kNone ? DocLayout{} : doc_arrays(T, c.docs);
    const bool packed = c.docs != Docs::kNone;
    GpuRun g = run_gpu(gctx.ctx(), qkv_g, dout_g, dt, c, packed ? docs.gpu() : DocBounds{});

    OwnedTensor o(DType::F64, Device::CPU, {kB, T, c.H, D}), lse(DType::F64, Device::CPU, {kB, c.H, T});
    OwnedTensor dqkv(DType::F64, Device::CPU, fused_dims(c));
    if (c.accumulate_dv) copy_tensor(dqkv, to(to(dqkv_start(c), Device::CPU, dt), Device::CPU, DType::F64));
    const AttentionOpts ref_opts = opts_of(c, packed ? docs.host() : DocBounds{});
    attention_fwd(Ctx{}, part(qkv_r, c, 0), part(qkv_r, c, 1), part(qkv_r, c, 2), o, lse, ref_opts);
    attention_bwd(Ctx{}, part(qkv_r, c, 0), part(qkv_r, c, 1), part(qkv_r, c, 2), o, lse, dout_r, part(dqkv, c, 0),
                  part(dqkv, c, 1), part(dqkv, c, 2), ref_opts);

    EXPECT_LT(test::rel_error(g.o, o), tol) << "o";
    EXPECT_LT(test::rel_error(g.lse, lse), tol) << "lse";
    // dq and dk come from P (dP - rowsum(P dP)): with a window of one key the difference cancels
    // exactly and with a few keys nearly, so their relative error grows as the window shrinks (or
    // the documents: a token alone in its document has dq = 0).
    const bool few_keys = (c.window > 0 && c.window <= 16) || c.docs == Docs::kShort;
    const double tol_dqk = few_keys ? 4 * tol : tol;
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(test::rel_error(component(g.dqkv, c, i), component(dqkv, c, i)), i < 2 ? tol_dqk : tol) << names[i];
  }
}

// f32, then bf16 through every kernel family.
void run_parity_all(std::span<const GpuCase> cases) {
  run_parity(DType::F32, 1e-5, cases);
  for (const char* family : bf16_families()) {
    SCOPED_TRACE(std::string("LINAC_ATTENTION_KERNELS=") + family);
    KernelChoice choice(family);
    run_parity(DType::BF16, 1e-2, cases);
  }
}

TEST(AttentionGpu, ParityF32) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity(DType::F32, 1e-5);
}

TEST(AttentionGpu, ParityBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const char* family : bf16_families()) {
    SCOPED_TRACE(std::string("LINAC_ATTENTION_KERNELS=") + family);
    KernelChoice choice(family);
    run_parity(DType::BF16, 1e-2);
  }
}

// dq and dk for unrotated q and k against the CPU's attention backward + rope_bwd.
TEST(AttentionGpu, ParityRopeGradients) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(kRopeCases);
}

// Packed documents (block-diagonal causal masks, skipped tiles, RoPE from each document's start).
TEST(AttentionGpu, ParityDocs) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(kDocCases);
}

// Grouped-query and multi-query attention: k/v (and dk/dv, each summed over its group) with fewer
// heads than q.
TEST(AttentionGpu, ParityGqa) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(kGqaCases);
}

TEST(AttentionGpu, ParityItemGroups) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(kItemGroupCases);
}

TEST(AttentionGpu, ParityAccumulateDv) {
  LINAC_SKIP_WITHOUT_GPU();
  run_parity_all(kAccumulateCases);
}

// Documents change every output (so the parity above cannot pass by ignoring them), and one
// document per row gives the values of none.
TEST(AttentionGpu, DocsMatter) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  std::vector<std::pair<DType, const char*>> runs;
  for (const char* family : bf16_families()) runs.emplace_back(DType::BF16, family);
  runs.emplace_back(DType::F32, "auto");
  for (const auto& [dt, family] : runs) {
    KernelChoice choice(family);
    for (const GpuCase& c : {GpuCase{1000, 64, true, 0, 1e4}, GpuCase{700, 128, true, 0}, GpuCase{333, 96, true, 64}}) {
      SCOPED_TRACE(name(c) + " " + dtype_name(dt) + " " + family);
      OwnedTensor qkv = to(test::random_tensor(fused_dims(c), DType::F64, 71), Device::CUDA, dt);
      OwnedTensor dout = to(test::random_tensor({kB, c.T, c.H, c.D}, DType::F64, 72), Device::CUDA, dt);
      const GpuRun none = run_gpu(gctx.ctx(), qkv, dout, dt, c);
      const GpuRun packed = run_gpu(gctx.ctx(), qkv, dout, dt, c, doc_arrays(c.T, Docs::kTiles).gpu());
      const GpuRun one = run_gpu(gctx.ctx(), qkv, dout, dt, c, doc_arrays(c.T, Docs::kOne).gpu());
      EXPECT_GT(test::rel_error(packed.o, none.o), 0.05);
      EXPECT_GT(test::rel_error(packed.lse, none.lse), 0.05);
      for (int i = 0; i < 3; ++i)
        EXPECT_GT(test::rel_error(component(packed.dqkv, c, i), component(none.dqkv, c, i)), 0.05) << i;
      EXPECT_EQ(to_doubles(one.o), to_doubles(none.o));
      EXPECT_EQ(to_doubles(one.lse), to_doubles(none.lse));
      EXPECT_EQ(to_doubles(one.dqkv), to_doubles(none.dqkv));
    }
  }
}

// On a Hopper GPU in a build for sm_90 every head dim takes the wgmma kernels (a silent fall back
// to the older ones would pass every parity test); the override does not.
TEST(AttentionGpu, KernelChoice) {
  LINAC_SKIP_WITHOUT_GPU();
  KernelChoice unset(nullptr);
  const bool hopper = LINAC_WITH_SM90A && gpu_compute_capability() == 90;
  for (int64_t D : {64, 80, 96, 112, 128})
    EXPECT_EQ(std::string(attention_gpu_kernels(D)), hopper ? "sm90" : "sm80") << D;
  {
    KernelChoice forced("sm80");
    EXPECT_EQ(std::string(attention_gpu_kernels(64)), "sm80");
  }
  KernelChoice bad("sm75");
  EXPECT_THROW(attention_gpu_kernels(64), UserError);
}

// Training resume must be exact: two runs on the same inputs give the same bits.
TEST(AttentionGpu, Deterministic) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  // bf16 through each kernel family, f32 once.
  std::vector<std::pair<DType, const char*>> runs;
  for (const char* family : bf16_families()) runs.emplace_back(DType::BF16, family);
  runs.emplace_back(DType::F32, "auto");
  for (const auto& [dt, family] : runs) {
    KernelChoice choice(family);
    for (const GpuCase& c :
         {GpuCase{1000, 64, true, 0}, GpuCase{777, 128, true, 200}, GpuCase{1000, 96, true, 0},
          GpuCase{777, 112, true, 129}, GpuCase{300, 112, false, 0}, GpuCase{2100, 64, false, 0},
          GpuCase{4100, 64, true, 0}, GpuCase{3000, 128, true, 0}, GpuCase{1000, 64, true, 0, 1e4},
          GpuCase{4100, 64, true, 0, 1e4, Docs::kRandom}, GpuCase{3000, 128, true, 0, 0, Docs::kMixed},
          GpuCase{3000, 64, true, 0, 0, Docs::kNone, 6, 1}, GpuCase{1000, 128, true, 200, 0, Docs::kNone, 4, 2},
          GpuCase{1000, 96, true, 0, 1e4, Docs::kMixed, 6, 3}}) {
      SCOPED_TRACE(name(c) + " " + dtype_name(dt) + " " + family);
      OwnedTensor qkv = to(test::random_tensor(fused_dims(c), DType::F64, 41), Device::CUDA, dt);
      OwnedTensor dout = to(test::random_tensor({kB, c.T, c.H, c.D}, DType::F64, 42), Device::CUDA, dt);
      const DocLayout docs = c.docs == Docs::kNone ? DocLayout{} : doc_arrays(c.T, c.docs);
      const DocBounds bounds = c.docs == Docs::kNone ? DocBounds{} : docs.gpu();
      GpuRun r1 = run_gpu(gctx.ctx(), qkv, dout, dt, c, bounds);
      GpuRun r2 = run_gpu(gctx.ctx(), qkv, dout, dt, c, bounds);
      EXPECT_TRUE(test::same_bits(r1.o, r2.o));
      EXPECT_TRUE(test::same_bits(r1.lse, r2.lse));
      EXPECT_TRUE(test::same_bits(r1.dqkv, r2.dqkv));
    }
  }
}

// Head dims without a kernel fail with an error, forward and backward, instead of computing garbage.
TEST(AttentionGpu, RejectsOtherHeadDims) {
  LINAC_SKIP_WITHOUT_GPU();
  GpuContext gctx;
  for (int64_t D : {48, 72, 136}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const GpuCase c{40, D, true, 0};
    OwnedTensor qkv = to(test::random_tensor(fused_dims(c), DType::F64, 51), Device::CUDA, DType::BF16);
    OwnedTensor dout = to(test::random_tensor({kB, c.T, c.H, D}, DType::F64, 52), Device::CUDA, DType::BF16);
    OwnedTensor o(DType::BF16, Device::CUDA, {kB, c.T, c.H, D}), lse(DType::F32, Device::CUDA, {kB, c.H, c.T});
    OwnedTensor dqkv(DType::BF16, Device::CUDA, fused_dims(c));
    EXPECT_THROW(attention_fwd(gctx.ctx(), part(qkv, c, 0), part(qkv, c, 1), part(qkv, c, 2), o, lse, opts_of(c)),
                 Error);
    EXPECT_THROW(attention_bwd(gctx.ctx(), part(qkv, c, 0), part(qkv, c, 1), part(qkv, c, 2), o, lse, dout,
                               part(dqkv, c, 0), part(dqkv, c, 1), part(dqkv, c, 2), opts_of(c)),
                 Error);
  }
}

}  // namespace
}  // namespace linac::test_attention_gpu
