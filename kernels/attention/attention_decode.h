// Softmax attention for decoding: one query token per sequence attends to the first n_valid slots
// of a KV cache (docs/transformer.md §5). For a sliding window the caller keeps a ring
// buffer of `window` slots, writing token pos into slot pos % window, and passes
// n_valid = min(pos + 1, window): softmax does not depend on the order of the slots. For full
// attention the cache holds every token and n_valid = pos + 1.
//
// For each batch b and head h (scale defaults to 1/sqrt(D)), with g = h / (H / Hk) the key/value
// head of h (grouped-query attention, attention.h):
//   S[s] = scale * <q[b,h,:], k_cache[b,s,g,:]>            for s < n_valid
//   o[b,h,:] = sum_{s < n_valid} exp(S[s] - lse) v_cache[b,s,g,:],   lse = log sum_s exp(S[s])
//
// Layout: q, o [B, H, D] and k_t, v_t [B, Hk, D], with the last two dims contiguous and a free
// batch stride; k_cache, v_cache [B, S, Hk, D] contiguous (Hk dividing H); slots at or past
// n_valid are never read.
// Dtypes: CPU: all f32 or all f64. GPU: all bf16 or all f32 (math in f32, online softmax with a
// running max), D a multiple of 8 up to 256, rows aligned to four elements. The GPU splits the slots of a
// (batch, head) into blocks of kAttentionDecodeSplit, combined in a fixed order through
// attention_decode_workspace_bytes() of ctx.workspace (deterministic, no atomics).
//
// attention_decode_step is a whole decoding step of an attention layer for B sequences, each at
// its own position pos[b] within its current document (int32 [B] on ctx's device):
//   q[b], k[b] <- RoPE(q[b]), RoPE(k[b]) at position pos[b]     (rope.h; when rope is defined)
//   slot = window > 0 ? pos[b] % window : pos[b];    k_cache[b, slot], v_cache[b, slot] <- k[b], v[b]
//   n_valid = window > 0 ? min(pos[b] + 1, window) : pos[b] + 1
//   o[b] = the attention above over the first n_valid slots of row b
// Nothing that changes from one step to the next is a launch argument (the positions are read on
// the device and the GPU's grid covers every slot of the cache), so a CUDA graph captured once
// replays the step at any position (generate/decode_graph.h). On the CPU q and k are rotated in
// place; on the GPU they are left as they are (the kernel rotates them in shared memory).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"
#include "rope/rope.h"

namespace linac {

// Cache slots one GPU thread block reduces; more valid slots than this spread over several blocks.
constexpr int64_t kAttentionDecodeSplit = 64;

struct AttentionDecodeLayout {
  int64_t B = 0, H = 0, D = 0, S = 0, n_valid = 0;  // n_valid: attention_decode's (not the step's)
  int64_t Hk = 0;            // key/value heads of the cache, dividing H
  double scale = 0;          // never 0 here
  int64_t q_b = 0, o_b = 0;  // batch strides of q and o
  int64_t k_b = 0, v_b = 0;  // batch strides of the step's new k and v rows
  int64_t window = 0;        // the step's sliding window (0: full attention)
};

template <class F>
void attention_decode_cpu(const AttentionDecodeLayout& L, const F* q, const F* k_cache, const F* v_cache, F* o);
template <class F>
void attention_decode_step_cpu(const AttentionDecodeLayout& L, F* q, F* k, const F* v, const int32_t* pos,
                               const RopeFreqs& rope, F* k_cache, F* v_cache, F* o);

void attention_decode_cuda(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& o);
void attention_decode_step_cuda(const Ctx& ctx, const AttentionDecodeLayout& L, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& pos, const RopeFreqs& rope, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& o, const Tensor& done);
// Copies the tokens of x [B, n, H, D] (free batch and token strides) into cache (same dtype), token
// i into slot (slot + i) mod S, on ctx's stream.
void attention_cache_write_cuda(const Ctx& ctx, const Tensor& x, const Tensor& cache, int64_t slot);

// Entry points: check shapes and strides, dispatch on ctx.device and dtypes.
// q, o [B, H, D]; k_cache, v_cache [B, S, Hk, D]; 1 <= n_valid <= S; scale 0 means 1/sqrt(D).
void attention_decode(const Ctx& ctx, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t n_valid,
                      const Tensor& o, float scale = 0);
// Writes keys and values into the caches from slot `slot` on: k, v [B, Hk, D] (one token, free batch
// stride) or [B, n, Hk, D] (n <= S tokens, free batch and token strides), token i into slot
// (slot + i) mod S. A prompt's keys go in with one call, wrapping around a window's ring as they
// would one token at a time.
void attention_cache_write(const Ctx& ctx, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                           const Tensor& v_cache, int64_t slot);
// q, o [B, H, D]; k, v [B, Hk, D] (free batch strides); pos int32 [B] (contiguous, ctx's device);
// k_cache, v_cache [B, S, Hk, D]; window 0 (then every pos[b] < S: the caller grows the cache)
// or the ring's size S. rope: undefined for no rotation. On the CPU a position out of range is an
// error; on the GPU it is the caller's invariant. done: on the GPU, int32 [B, H] zeros that the
// call leaves zero (the slot blocks of a (row, head) count themselves finished in it; the caller
// keeps it with the cache); unused on the CPU.
void attention_decode_step(const Ctx& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos,
                           const Tensor& k_cache, const Tensor& v_cache, const RopeFreqs& rope, int64_t window,
                           const Tensor& o, const Tensor& done = Tensor());
// Scratch bytes attention_decode needs from ctx.workspace on the GPU (0 when n_valid fits one block);
// attention_decode_step needs those of n_valid = S.
size_t attention_decode_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t n_valid);

}  // namespace linac
