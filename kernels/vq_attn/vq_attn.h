// VQ-attention (Transformer-VQ, Lingle 2023, arXiv:2309.16354; math in docs/transformer_vq.md).
//
// Per batch b and head h (each head has its own codebook C in R^{S x Dk}), block length Lb,
// block index n(t) = floor(t / Lb), 0-based positions:
//   quantizer   z_t = argmin_s ||k_t - C_s||^2 (fp32: ||k||^2 - 2 k.C_s + ||C_s||^2 clamped >= 0,
//               ties -> lowest s), khat_t = C_{z_t}; the straight-through estimator is the caller's:
//               the gradient w.r.t. khat is the gradient w.r.t. k.
//   scores      for j <= t:  s_tj = (q_t + u).key_j + [t - j <= Lb] (q_t + vr).rho_{t-j}
//               key_j = khat_j for n(j) >= n(t) - 1 (the uncompressed window), C_{z_j} otherwise
//               (the compressed region: a constant, so far queries send no gradient to k_j, §4.2)
//   output      o_t = sum_j softmax_j(s_t.) v_j       (before the GAU gate: the mixer gates)
// u, vr [H, Dk] are the content and position biases, rho [H, Lb+1, Dk] the position embeddings
// for distances 0..Lb, all already scaled by the mixer; there is no 1/sqrt(d) inside the op.
//
// Two forms compute this (both in the CPU reference; the GPU runs the block form):
//   quadratic  the definition above over all j <= t (docs/transformer_vq.md §2; the test oracle)
//   block      §3.2-§3.3: query t of block n softmaxes jointly over the present block
//              (j <= t), the previous block n-1 (position term only for t - j <= Lb) and the
//              S cache entries: score (q_t + u).C_s + log N_s^(n) (-inf where N_s^(n) = 0), value
//              Ubar_s^(n), where N^(n), Ubar^(n) are the counts and the per-code MEANS of v over
//              blocks 0..n-2 (the stable cache: a serial scan over blocks that merges each
//              block's per-code means, Ubar <- (N Ubar + cnt mean) / max(N + cnt, 1)).
//              The cache is empty at the start of every sequence (t = 0): there are no truncated
//              backprop windows and no state carried between calls.
// Documents (VqAttnOpts::docs, core/doc_bounds.h; docs/transformer_vq.md §3.4): every document is a
// sequence of its own, so the block grid restarts with it. For query t of the document starting at
// a = start[b,t], with local blocks n(x) = floor((x - a) / Lb):
//   window keys   j with max(a, a + (n(t) - 1) Lb) <= j <= t        (khat_j; position term t - j <= Lb)
//   cache keys    j with a <= j < a + (n(t) - 1) Lb                  (C_{z_j}: the cache restarts empty at a)
// and no other key (j < a belongs to an earlier document). Distances t - j are unchanged, so rho
// needs no shift. The output equals that of running [a, end[b,t]) alone as a sequence; gradients
// likewise (a key sends khat gradient only to its own document's window queries, its value to its
// own document's caches). The CPU forms run each document as its own sequence; the GPU places the
// documents in its packed layout (vq_packed.h: one call for the whole batch; the bounds are read
// on the host, one synchronisation per call or, with VqAttnOpts::doc_blocks, per run of calls
// on the same bounds; the packed rows take up to 1.5 T + Lb positions). Undefined docs: the
// stream form above, unchanged.
// lse_t = log sum_j exp(s_tj) (f32 on the GPU) is saved for the backward, which also takes o.
// Backward (docs/transformer_vq.md §4.1-§4.4), with w the normalised weights and Delta_t = dout_t . o_t:
//   gs_tj = w_tj (dout_t . v_j - Delta_t)   (window keys),  gs_ts = w_ts (dout_t . Ubar_s - Delta_t)
//   dq_t    = sum_j gs_tj khat_j + sum_s gs_ts C_s + sum_{t-j<=Lb} gs_tj rho_{t-j}
//   dkhat_j = sum_{t: n(t) in {n(j), n(j)+1}} gs_tj (q_t + u)       (window queries only)
//   dv_j    = sum_{t window} w_tj dout_t + sum_{n >= n(j)+2} gUbar^(n)_{z_j} / N^(n)_{z_j},
//             gUbar^(n)_s = sum_{t in block n} w_ts dout_t         (reverse sweep, 2-block delay)
//   du   = sum_t (sum_j gs_tj khat_j + sum_s gs_ts C_s),   dvr = sum_t sum_{t-j<=Lb} gs_tj rho_{t-j}
//   drho_d = sum_{t-j=d} gs_tj (q_t + vr)        (sums over tokens in a fixed order)
// The block backward recomputes the per-block cache means unless the forward saved them
// (VqAttnOpts::saved_cache, GPU), and the weights w unless the forward saved those
// (VqAttnOpts::saved_weights, GPU: then w is the forward's, in the activation dtype).
//
// Layout: q, khat, dq, dkhat [B, T, H, Dk]; v, o, dout, dv [B, T, H, Dv]: last two dims
// contiguous (head stride D, unit dim stride), batch and token strides free (views of a fused
// projection). z [B, T, H] int32 and lse [B, T, H] contiguous. codebook [H, S, Dk], u, vr, du, dvr
// [H, Dk], rho, drho [H, Lb+1, Dk] contiguous. dq, dkhat, dv, du, dvr, drho are overwritten (du,
// dvr, drho are gradients of the mixer's scaled tensors; the mixer accumulates its parameters).
// Dtypes: CPU: every float tensor f32, or every float tensor f64 (z int32). GPU: q, khat, v, o,
// dout, dq, dkhat, dv all bf16 or all f32; codebook, u, vr, rho, du, dvr, drho, lse f32.
//
// Codebook statistics (docs/transformer_vq.md §1.3; EMA k-means, no gradient):
//   vq_code_stats          sums[h,s,:] = sum over all B*T tokens with z = s of k (UNquantized),
//                          counts[h,s] = their number; fixed-order reduction (deterministic)
//   vq_ema_update          c_sum <- g c_sum + (1-g) sums, c_count <- g c_count + (1-g) counts
//   vq_codebook_from_stats codebook = c_sum / max(c_count, 0.01)
// k [B, T, H, Dk] (free batch/token strides; bf16/f32 on the GPU), sums, c_sum, codebook [H, S, Dk],
// counts, c_count [H, S], all f32 on the GPU (CPU: all f32 or all f64).
// vq_quantize: k, khat [B, T, H, Dk] (khat in k's dtype, the codeword rounded), z [B, T, H] int32,
// err [B, T, H] (optional; ||k - C_z||^2 in f32 on the GPU, the commitment term).
//
// Decode step (docs/transformer_vq.md §5): one token per sequence against a fixed-size state (VqAttnState):
// a ring of the last Lb tokens' khat [B,H,Lb,Dk], v [B,H,Lb,Dv], z [B,H,Lb] (slot = p % Lb),
// the cache counts [B,H,S] and means [B,H,S,Dv]. Row b's token sits at position p = pos[b] of its
// current document (int32 [B] on ctx's device, read there: the step's launches do not change with
// it, so a CUDA graph replays them; the caller advances pos). It attends to the ring entries
// p-Lb..p-1 (those >= 0 and present) and itself, all with the position term, plus the cache; then
// the token at p-Lb (now at distance Lb+1 from the next one) moves into the cache (N[z] += 1,
// Ubar[z] += (v - Ubar[z]) / N[z]) and the new token takes its slot. Equals the block forward
// token for token; memory does not grow with T. vq_attn_state_reset zeroes the state (every row
// starts at p = 0). vq_attn_state_start_document(state, b) starts a new document in row b: it
// empties the row's cache and marks its ring slots absent (z = -1: no score, never moved into the
// cache); with pos[b] set back to 0 the row then decodes as from a fresh state. q, khat [B,H,Dk],
// v, o [B,H,Dv] (free batch stride), z [B,H] int32 contiguous. State tensors contiguous, f32 on the
// GPU (CPU: the dtype of q).
//
// GPU support: vq_quantize, vq_code_stats, vq_ema_update, vq_codebook_from_stats; the block
// forward and backward on tensor cores (vq_common.cuh: the inputs are packed per (head, sequence)
// and padded to whole blocks, every per-block product is a strided-batched cuBLASLt GEMM with f32
// accumulation, softmax and cache statistics are f32), any T, Dk, Dv; scratch in ctx.workspace
// (vq_attn_workspace_bytes; less is accepted down to one block per chunk); the decode step (the
// scores, then the weighted sum split over value dims: B H (Lb + 1 + S + 2) floats of
// ctx.workspace, Lb + 1 + S floats of shared memory per CTA) and the prefill handover.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/doc_bounds.h"
#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

struct VqAttnOpts {
  int64_t block = 512;  // Lb: block length of the block form and the decode window
  DocBounds docs;        // defined: each document of a row attends within itself (header comment)
  // Backward only. Defined: v = SiLU(v_pre) (the caller's feature map, [B,T,H,Dv] like v), and dv
  // receives the gradient of v_pre: dv * silu'(v_pre), on the GPU with dv rounded to its dtype
  // first, so the bits of vq_attn_bwd followed by silu_bwd (activation.h) without that pass.
  Tensor v_pre;
  // GPU, optional: storage of at least vq_attn_saved_cache_bytes() (with documents: of its
  // documents variant; contiguous, any dtype) where the forward leaves the per-block cache (counts
  // and means), and the backward of the same inputs reads it instead of sorting the codes and
  // scanning the values again (the same bits). The CPU forms ignore it.
  Tensor saved_cache;
  // GPU, optional: storage of at least vq_attn_saved_weights_bytes() (with documents: of its
  // documents variant) where the forward leaves its softmax weights (activation dtype), and the
  // backward of the same inputs takes them instead of recomputing the scores (it then needs
  // neither lse's nor the scores' products). In bf16 the gradients so see the weights rounded
  // once, as the output products did.
  Tensor saved_weights;
  // GPU, with documents, optional: the documents' placement kept between calls that have the same
  // bounds and the same ctx.workspace (the layers of one model pass, whose vq_gau mixers share
  // both). *doc_blocks == 0: the call plans the placement (reading the bounds back: one
  // synchronisation), leaves its tables at the start of ctx.workspace and stores its block count
  // here; > 0: the tables there are that placement's, used as they are.
  int64_t* doc_blocks = nullptr;
  // Backward, GPU, optional: [B, T, H Dv / 8] f32 contiguous, per token and unit of 8 value dims
  // the sum of dout o over the unit (swiglu_value_dots' table where o and dout are a gate's value
  // half and its gradient; Dv a multiple of 8). The backward then takes delta_t = dout_t . o_t as
  // the sum of the head's units instead of reading dout and o for it. The CPU forms ignore it.
  Tensor delta_units;
};

enum class VqAttnForm { Block, Quadratic };  // the CPU runs either; the GPU the block form

struct VqAttnLayout {
  struct Strides {
    int64_t b = 0, t = 0;
  };
  int64_t B = 0, T = 0, H = 0, Dk = 0, Dv = 0, S = 0, Lb = 0;
  Strides q, khat, v, o, dout, dq, dkhat, dv, v_pre;
  DocBounds docs;  // CPU forms: host memory
  void* saved_cache = nullptr;    // GPU: VqAttnOpts::saved_cache, or null
  void* saved_weights = nullptr;  // GPU: VqAttnOpts::saved_weights, or null
  int64_t* doc_blocks = nullptr;  // GPU: VqAttnOpts::doc_blocks where docs are given, or null
  const float* delta_units = nullptr;  // GPU: VqAttnOpts::delta_units, or null
};

// CPU references, F = float or double. z, lse contiguous [B,T,H]; codebook [H,S,Dk]; u, vr [H,Dk];
// rho [H,Lb+1,Dk].
template <class F>
void vq_attn_fwd_quadratic_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                               const F* codebook, const F* u, const F* vr, const F* rho, F* o, F* lse);
template <class F>
void vq_attn_bwd_quadratic_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                               const F* codebook, const F* u, const F* vr, const F* rho, const F* o, const F* lse,
                               const F* dout, F* dq, F* dkhat, F* dv, F* du, F* dvr, F* drho);
template <class F>
void vq_attn_fwd_block_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                           const F* codebook, const F* u, const F* vr, const F* rho, F* o, F* lse);
template <class F>
void vq_attn_bwd_block_cpu(const VqAttnLayout& L, const F* q, const F* khat, const int32_t* z, const F* v,
                           const F* codebook, const F* u, const F* vr, const F* rho, const F* o, const F* lse,
                           const F* dout, F* dq, F* dkhat, F* dv, F* du, F* dvr, F* drho);

// Quantizer and codebook statistics. k/khat strides: batch and token strides of [B,T,H,Dk].
struct VqQuantLayout {
  int64_t B = 0, T = 0, H = 0, Dk = 0, S = 0;
  VqAttnLayout::Strides k, khat;
};
template <class F>
void vq_quantize_cpu(const VqQuantLayout& L, const F* k, const F* codebook, int32_t* z, F* khat, F* err);
template <class F>
void vq_code_stats_cpu(const VqQuantLayout& L, const F* k, const int32_t* z, F* sums, F* counts);
template <class F>
void vq_ema_update_cpu(int64_t H, int64_t S, int64_t Dk, const F* sums, const F* counts, F* c_sum, F* c_count,
                       double gamma);
template <class F>
void vq_codebook_from_stats_cpu(int64_t H, int64_t S, int64_t Dk, const F* c_sum, const F* c_count, F* codebook);

// Decode state; see the header comment. Every tensor contiguous.
struct VqAttnState {
  Tensor khat;    // [B, H, Lb, Dk]
  Tensor v;       // [B, H, Lb, Dv]
  Tensor z;       // [B, H, Lb] int32
  Tensor counts;  // [B, H, S]
  Tensor means;   // [B, H, S, Dv]
};
struct VqStepLayout {
  int64_t B = 0, H = 0, Dk = 0, Dv = 0, S = 0, Lb = 0;
  int64_t q = 0, khat = 0, v = 0, o = 0;  // batch strides
};
template <class F>
void vq_attn_state_prefill_cpu(const VqAttnLayout& L, const F* khat, const int32_t* z, const F* v, F* ring_khat,
                               F* ring_v, int32_t* ring_z, F* counts, F* means);
template <class F>
void vq_attn_step_cpu(const VqStepLayout& L, const F* q, const F* khat, const int32_t* z, const F* v, const F* codebook,
                      const F* u, const F* vr, const F* rho, F* ring_khat, F* ring_v, int32_t* ring_z, F* counts,
                      F* means, const int32_t* pos, F* o);

void vq_attn_fwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse);
void vq_attn_bwd_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                      const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                      const Tensor& o, const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat,
                      const Tensor& dv, const Tensor& du, const Tensor& dvr, const Tensor& drho, const Tensor& v_pre);
void vq_attn_step_cuda(const Ctx& ctx, const VqStepLayout& L, const Tensor& q, const Tensor& khat, const Tensor& z,
                       const Tensor& v, const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                       const VqAttnState& state, const Tensor& pos, const Tensor& o);
void vq_attn_state_start_document_cuda(const Ctx& ctx, const VqAttnState& state, int64_t row);
void vq_attn_state_prefill_cuda(const Ctx& ctx, const VqAttnLayout& L, const Tensor& khat, const Tensor& z,
                                const Tensor& v, const VqAttnState& state);
void vq_quantize_cuda(const Ctx& ctx, const VqQuantLayout& L, const Tensor& k, const Tensor& codebook,
                      const Tensor& z, const Tensor& khat, const Tensor& err);
void vq_code_stats_cuda(const Ctx& ctx, const VqQuantLayout& L, const Tensor& k, const Tensor& z, const Tensor& sums,
                        const Tensor& counts);
void vq_ema_update_cuda(const Ctx& ctx, const Tensor& sums, const Tensor& counts, const Tensor& c_sum,
                        const Tensor& c_count, double gamma);
void vq_codebook_from_stats_cuda(const Ctx& ctx, const Tensor& c_sum, const Tensor& c_count, const Tensor& codebook);

// Entry points: check shapes and strides, dispatch on ctx.device, dtypes and (CPU) the form.
// err may be undefined.
void vq_quantize(const Ctx& ctx, const Tensor& k, const Tensor& codebook, const Tensor& z, const Tensor& khat,
                 const Tensor& err);
void vq_code_stats(const Ctx& ctx, const Tensor& k, const Tensor& z, const Tensor& sums, const Tensor& counts);
void vq_ema_update(const Ctx& ctx, const Tensor& sums, const Tensor& counts, const Tensor& c_sum, const Tensor& c_count,
                   double gamma);
void vq_codebook_from_stats(const Ctx& ctx, const Tensor& c_sum, const Tensor& c_count, const Tensor& codebook);

void vq_attn_fwd(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                 const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho, const Tensor& o,
                 const Tensor& lse, const VqAttnOpts& opts, VqAttnForm form = VqAttnForm::Block);
void vq_attn_bwd(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                 const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho, const Tensor& o,
                 const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dkhat, const Tensor& dv,
                 const Tensor& du, const Tensor& dvr, const Tensor& drho, const VqAttnOpts& opts,
                 VqAttnForm form = VqAttnForm::Block);

void vq_attn_step(const Ctx& ctx, const Tensor& q, const Tensor& khat, const Tensor& z, const Tensor& v,
                  const Tensor& codebook, const Tensor& u, const Tensor& vr, const Tensor& rho,
                  const VqAttnState& state, const Tensor& pos, const Tensor& o);
void vq_attn_state_reset(const Ctx& ctx, const VqAttnState& state);
void vq_attn_state_start_document(const Ctx& ctx, const VqAttnState& state, int64_t row);
// The prefill handover (docs/transformer_vq.md §5): the state that vq_attn_step over a prompt's
// tokens 0..T-1 leaves, from the prompt's khat, z and v (the forward's layout above, [B,T,H,Dk],
// [B,T,H] int32, [B,T,H,Dv]) in one call instead of T steps. Each row keeps its last document only
// (docs defined: as if start_document had run at its start, with pos[b] set back to 0 there), of
// n tokens from a: the tokens older than the window are the cache, with the step's own
// running-mean update in token order (the same bits as stepping: f32 on the GPU), the last Lb take
// their ring slots (token t the slot (t - a) % Lb, its position in the document), and every other
// slot is absent. The next step of row b runs at pos[b] = n.
// The whole state is written (no reset needed before). GPU: scratch in ctx.workspace, at least
// vq_attn_state_prefill_workspace_bytes() (the tokens of each (row, head) sorted by code; asks the
// GPU's sort for its scratch, so it needs a device; 0 in a build without CUDA).
void vq_attn_state_prefill(const Ctx& ctx, const Tensor& khat, const Tensor& z, const Tensor& v,
                           const VqAttnState& state, const DocBounds& docs);
size_t vq_attn_state_prefill_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t S);

// How a GPU backward of this shape that takes the forward's saved weights forms the score
// gradients: "gemm_epilogue_sm90", the dP GEMMs compute them in their epilogue
// (vq_score_grads_sm90.cu: H100/H200, bf16, Lb and Dv multiples of 8, dout's rows 16-byte
// aligned; LINAC_VQ_KERNELS=sm80 turns it off), or "rows", cuBLASLt dP GEMMs in f32 and then a
// warp per row.
const char* vq_attn_score_grads_kernel(int64_t Lb, int64_t Dv, DType act);

// GPU scratch (ctx.workspace) that a backward (and so a forward) call of this shape runs best
// with: per token and head, the packed q, q+u, q+vr, khat (4 Dk) and v, dout (2 Dv) in the
// activation dtype and the f32 gradient buffers (3 Dk + Dv); per block and head, the cache means
// (S Dv, activation dtype), their f32 gradients and those swept (activation dtype); the tokens'
// lists by (block, code) for the cache; score chunks of up to 1 GiB (one head's blocks at the 190M
// model's shape: fewer, larger batched GEMMs); 32 MiB for cuBLASLt. A smaller ctx.workspace runs
// in smaller chunks; one below a single block's chunk is refused in one line.
// documents: for calls with VqAttnOpts::docs, whose packed rows take up to 1.5 times as many
// blocks (the placement in vq_packed.h), plus the placement's tables.
size_t vq_attn_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t S, int64_t Lb,
                               DType act, bool documents = false);
// VqAttnOpts::saved_cache for a [B, T] call: per head, sequence and block the cache means
// [S, Dv] in the activation dtype, then the counts [S] f32. documents: for calls with documents
// (up to 1.5 times the blocks: vq_attn_workspace_bytes).
size_t vq_attn_saved_cache_bytes(int64_t B, int64_t T, int64_t H, int64_t Dv, int64_t S, int64_t Lb, DType act,
                                 bool documents = false);
// VqAttnOpts::saved_weights for a [B, T] call: per head and sequence, every query's weights over
// its window (2 Lb entries) and the cache (S), in the activation dtype: about 2 (2 Lb + S) bytes
// per token and head in bf16 (3 KiB for the paper's head: 100 MiB per layer at 32,768 tokens);
// documents: for calls with documents, as above.
size_t vq_attn_saved_weights_bytes(int64_t B, int64_t T, int64_t H, int64_t S, int64_t Lb, DType act,
                                   bool documents = false);

}  // namespace linac
